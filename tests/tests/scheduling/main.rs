//! Scheduling: where and when work runs, through the real binaries. Health-aware placement,
//! dispatch by capacity and in batches, concurrency policies, pauses, and schedules that fire
//! once with two executors.
//!
//! One test binary (`cargo test -p attune-system-tests --test scheduling`), a module per
//! subject; each test starts its own system in a database and broker namespace of its own.

mod capacity;
mod concurrency;
mod dispatch_batches;
mod health;
mod pauses;
mod schedules;
