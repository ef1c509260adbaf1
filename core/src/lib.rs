//! attune-core: the domain and the decisions, with no I/O.
//!
//! Everything here takes plain data (and, where time matters, `now`; where chance matters, an
//! `Rng`) and returns a decision: the state machine (`status`), failure kinds (`failure`), worker
//! health (`health`), worker selection (`selection`), the retry decision (`retry`), parameters
//! (`params`), the pack format (`pack`) and the recovery rules of the monitor and the manual
//! retry (`recovery`) and how long history is kept (`retention`). The adapters
//! (`attune-common`'s `db` and `mq`, the services) gather the
//! data, call in here, and carry the decision out.
//!
//! `tests/tidy.rs` keeps it that way: it fails if this crate names a database, broker, async
//! runtime, file system, network, environment or clock API.

pub mod circuit;
pub mod failure;
pub mod health;
pub mod pack;
pub mod params;
pub mod recovery;
pub mod retention;
pub mod retry;
pub mod rules;
pub mod selection;
mod sql;
pub mod status;
pub mod template;
pub mod workflow;

pub use failure::FailureKind;
pub use status::ExecutionStatus;
