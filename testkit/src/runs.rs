//! Actions that mark their own runs, for tests that must tell what ran from what the record
//! says: a run that happened twice, or two attempts of one execution at once, shows in the marks
//! whatever the database holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::TempPack;

/// A shell action (`entrypoint: actions/ticks.sh`, parameters `log` and integer `seconds`) that
/// appends "<execution id> <ns since the epoch> <its pid>" to `log` every 0.1 s for `seconds`: the
/// first and last lines of a run bound when it ran, however it ended, and the pid tells two runs
/// of one execution apart (a dispatch handed back keeps its execution id).
pub const TICKS: &str = r#"#!/bin/sh
end=$(( $(date +%s%N) + ATTUNE_PARAM_SECONDS * 1000000000 ))
while [ "$(date +%s%N)" -lt "$end" ]; do
  echo "$ATTUNE_EXECUTION_ID $(date +%s%N) $$" >> "$ATTUNE_PARAM_LOG"
  sleep 0.1
done
"#;

/// A pack `pack_ref` whose action `run` is [`TICKS`], with `max_retries` and `seconds` by default.
pub fn ticks_pack(pack_ref: &str, max_retries: u32, seconds: u32) -> TempPack {
    let run = format!(
        "name: run\nruntime: shell\nentrypoint: actions/ticks.sh\ntimeout_seconds: 120\nmax_retries: {max_retries}\n\
         parameters:\n  log:\n    type: string\n    required: true\n  seconds:\n    type: integer\n    default: {seconds}\n"
    );
    TempPack::new(pack_ref, &[("run.yaml", &run), ("ticks.sh", TICKS)])
}

/// When each execution's run was first and last seen in a [`TICKS`] log (ns since the epoch).
/// Panics if an execution ran more than once (two pids).
pub fn spans(log: &Path) -> BTreeMap<i64, (i128, i128)> {
    let mut spans = BTreeMap::new();
    let mut runs: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let mut fields = line.split_whitespace();
        let (Some(id), Some(at), Some(pid)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (Ok(id), Ok(at)) = (id.parse::<i64>(), at.parse::<i128>()) else { continue };
        runs.entry(id).or_default().insert(pid.to_string());
        let span = spans.entry(id).or_insert((at, at));
        span.0 = span.0.min(at);
        span.1 = span.1.max(at);
    }
    for (id, pids) in runs {
        assert!(pids.len() == 1, "execution {id} ran {} times (pids {pids:?}): one attempt, two runs", pids.len());
    }
    spans
}

/// A pack `pack_ref` whose action `mark` (integer parameter `n`, up to 3 retries) appends its
/// execution id to the file `marks/<n>` and takes 50 ms: the runs of submission `n`, whatever
/// the record says.
pub fn marking_pack(pack_ref: &str, marks: &Path) -> TempPack {
    TempPack::new(
        pack_ref,
        &[
            (
                "mark.yaml",
                "name: mark\nruntime: shell\nentrypoint: actions/mark.sh\nmax_retries: 3\nparameters:\n  n: {type: integer, required: true}\n",
            ),
            (
                "mark.sh",
                &format!(
                    "#!/bin/sh\necho \"$ATTUNE_EXECUTION_ID\" >> '{}/'\"$ATTUNE_PARAM_N\"\nsleep 0.05\n",
                    marks.display()
                ),
            ),
        ],
    )
}

/// The live (not zombie) processes whose environment holds `entry` (`NAME=value`), each with its
/// parent's id: every process of an action inherits its parameters, so a test's unique parameter
/// finds the action and all it started.
pub fn processes_with_env(entry: &str) -> Vec<(i32, i32)> {
    let mut found = Vec::new();
    for dir in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = dir.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if !environ.split(|b| *b == 0).any(|e| e == entry.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(after) = stat.rfind(')').and_then(|at| stat.get(at + 2..)) else { continue };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.first() != Some(&"Z")
            && let Some(parent) = fields.get(1).and_then(|p| p.parse().ok())
        {
            found.push((pid, parent));
        }
    }
    found
}

/// SIGKILLs, when dropped, every live process whose environment holds its entry
/// ([`processes_with_env`]): what a failed test's actions leave behind.
pub struct KillOnDrop(pub String);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for (pid, _) in processes_with_env(&self.0) {
            let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}
