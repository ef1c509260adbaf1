//! Runs: what happens to work once it runs, through the real binaries. Process and http
//! actions, their resource limits and the worker's one supervisor, retries and retry policies,
//! and workflows of several steps.
//!
//! One test binary (`cargo test -p attune-system-tests --test runs`), a module per subject; each
//! test starts its own system in a database and broker namespace of its own.

mod http_actions;
mod limits;
mod retry;
mod retry_policy;
mod supervisor;
mod workflows;
