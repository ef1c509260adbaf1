//! Submission: a request in and its answer out, through the real binaries. The API as clients
//! (and slow or greedy ones) meet it, the CLI as scripts use it, webhooks whose deliveries become
//! events and executions, bulk actions, live output, and the OpenAPI document, served and fuzzed.
//!
//! One test binary (`cargo test -p attune-system-tests --test submission`), a module per subject;
//! each test starts its own system in a database and broker namespace of its own, so tests of
//! different modules run side by side.

mod api_bounds;
mod api_limits;
mod bulk;
mod cli;
mod e2e;
mod events;
mod fuzz;
mod live_output;
mod openapi;
mod slow_clients;
mod submission_timeouts;
