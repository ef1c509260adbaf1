//! The pieces of the `attune` command line that other tools share: the API client and the
//! human output (tables). `attune-bench` prints its table with the same code.

pub mod client;
pub mod output;
pub mod tail;
