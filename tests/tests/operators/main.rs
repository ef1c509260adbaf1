//! Operators: what SREs read and run, against the real binaries. Metrics and the stats
//! endpoints, the alert rules in a real Prometheus, the dashboard in a real chromium, traces, the
//! benchmark's smoke run, the quick reference's SQL, troubleshooting steps and migration command.
//!
//! One test binary (`cargo test -p attune-system-tests --test operators`), a module per subject;
//! each test starts its own system in a database and broker namespace of its own.

mod alerts;
mod bench;
mod dashboard;
mod metrics;
mod migrations;
mod seed_sql;
mod traces;
mod troubleshooting;
