//! Tidy: the rules that hold the documents, the configuration and the code to each other, in one
//! place (as rust-analyzer's `xtask tidy`). Each reads the repository's files (the state lists
//! also a freshly migrated database); none starts a service, so the whole binary runs in seconds:
//! `cargo test -p attune-system-tests --test tidy`.
//!
//! A rule that fails names what drifted. The settings table is generated: `make settings-doc`
//! (`ATTUNE_BLESS=1 cargo test -p attune-system-tests --test tidy settings_doc`) writes it afresh.
//! Rules that need a running attune stay with their area: the OpenAPI document and the book's
//! route table against the served API (`submission`'s `openapi`), the quick reference's SQL and
//! troubleshooting steps run against a real run (`operators`' `seed_sql`, `troubleshooting`),
//! and every metric the alert rules name as exported (`operators`' `alerts`).

mod alert_rules;
mod book;
mod code_map;
mod compose;
mod core_does_no_io;
mod operating_docs;
mod quick_reference;
mod settings_doc;
mod sql_layer;
mod state_lists;
mod state_machine_doc;
