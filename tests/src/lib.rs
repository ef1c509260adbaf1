//! attune's system tests live in `tests/`, one test binary per area (`tests/<area>/main.rs`, a
//! module per subject; CONTRIBUTING.md lists them): each starts the real binaries (API, executor,
//! workers) against the real PostgreSQL and RabbitMQ, in a database and broker namespace of its
//! own, and drives them as users do (HTTP, SQL, signals). `tests/tidy` holds the rules that keep
//! the documents true to the code; it starts nothing. The unit, repository, adapter and
//! in-process tests live with their crates; `make test-fast` runs those, and tidy.

pub mod seed;
