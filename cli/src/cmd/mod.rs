//! The subcommands that talk to the API, one function each, in files by what they act on (as
//! mini-redis keeps its commands in `cmd/`). Each reads the API's answer as the API's own type
//! (`attune_api::routes`, `attune_common::db`) and prints it for people, or with `--output json`
//! as the API sent it (`client::Answer`).

pub mod action;
pub mod audit;
pub mod chain;
pub mod event;
pub mod execution;
pub mod pack;
pub mod pause;
pub mod run;
pub mod schedule;
pub mod secret;
pub mod worker;
pub mod workflow;

use anyhow::Context;
use serde::Serialize;

use crate::Output;

/// Prints `answer`: with `--output json` as JSON (`print_json`), else as `human` tells it.
pub fn print<T: Serialize>(output: Output, answer: &T, human: impl FnOnce(&T) -> String) {
    match output {
        Output::Json => print_json(answer),
        Output::Table => attune_cli::say!("{}", human(answer)),
    }
}

/// Prints a list: as JSON, or as a table with `headers` and a `row` per item.
pub fn print_list<T: Serialize>(output: Output, list: &[T], headers: &[&str], row: impl Fn(&T) -> Vec<String>) {
    print(output, &list, |list| attune_cli::output::table(headers, &list.iter().map(row).collect::<Vec<_>>()));
}

/// Prints `answer` as JSON: an `Answer` as the API sent it, and the fields of every object in
/// the order of their names, whatever wrote them.
pub fn print_json(answer: &impl Serialize) {
    let json = serde_json::to_value(answer).and_then(|json| serde_json::to_string_pretty(&json));
    attune_cli::say!("{}", json.expect("json prints"));
}

/// `text` as one path segment: every byte but letters, digits and `-._~` percent-encoded.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A value given on stdin (never the command line, which other users of the machine can see),
/// one trailing newline dropped.
pub fn value_from_stdin() -> anyhow::Result<String> {
    let mut value = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut value).context("reading the value from stdin")?;
    if value.ends_with('\n') {
        value.pop();
    }
    Ok(value)
}
