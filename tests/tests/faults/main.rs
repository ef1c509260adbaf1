//! Faults: what breaks under attune and what it does then, through the real binaries. Dead and
//! frozen workers, poison messages, database connections cut, half-open or partitioned (each
//! test's own proxy, `attune_testkit::pgcut` and `tcpcut`), a worker's lease, results delayed
//! on their way, work held back and handed back, workers outside input cannot break.
//!
//! One test binary (`cargo test -p attune-system-tests --test faults`), a module per subject;
//! each test starts its own system in a database and broker namespace of its own and disturbs
//! only that. What disturbs every user of a service runs alone, in binaries of its own
//! (`chaos_broker`, `broker_cluster`, `hosts`, `pg_switchover`).

mod defense;
mod delayed_results;
mod half_open;
mod held_work;
mod lease;
mod worker_hardening;
