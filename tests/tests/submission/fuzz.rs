//! The API keeps its OpenAPI promise under a schema-driven fuzzer: schemathesis (installed by
//! `make test` into `target/fuzz/venv`) runs every operation of `/api/v1/openapi.json` with all
//! its checks — server errors, undocumented status codes and content types, responses that do not
//! match their schema, schema-valid requests rejected, and the stateful phase — with a fixed seed,
//! against the real system. Any finding fails the test, with schemathesis's report. Its
//! configuration, `tests/fuzz/schemathesis.toml`, says which two operations may refuse a
//! schema-valid request with 422 (checks no static schema can state), and why.

use std::process::Command;

use attune_testkit::System;
use attune_testkit::system::repo_root;
use serde_json::json;

/// The seed and the examples per operation of the run in `make test` (about 5 s on a debug
/// build). `ATTUNE_FUZZ_SEED` and `ATTUNE_FUZZ_EXAMPLES` override them for a longer search.
const SEED: &str = "1";
const EXAMPLES: &str = "30";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_its_openapi_promise_under_a_fuzzer() {
    let schemathesis = repo_root().join("target/fuzz/venv/bin/schemathesis");
    assert!(
        schemathesis.is_file(),
        "{} is missing: `make test` installs it (scripts/lib.sh ensure_schemathesis)",
        schemathesis.display()
    );
    // with a secrets key, so that setting a secret is a success to check, not a refusal
    // and live output streams of at most 1 s: the executions below wait for a worker there is
    // not, and a stream of one lasts as long as it waits (a finished or unknown one answers at once)
    let system = System::builder().secrets_key().env("ATTUNE_API_OUTPUT_STREAM_MAX_SECS", "1").start().await;
    // something to find: a few executions (ids 1, 2, ...) for the operations that read one
    for n in 0..3 {
        system.submit("core.echo", json!({"message": format!("fuzz {n}")})).await;
    }
    let seed = std::env::var("ATTUNE_FUZZ_SEED").unwrap_or_else(|_| SEED.into());
    let examples = std::env::var("ATTUNE_FUZZ_EXAMPLES").unwrap_or_else(|_| EXAMPLES.into());
    let run = tokio::task::spawn_blocking({
        let (url, token) = (system.api_url.clone(), system.token.clone());
        move || {
            let workdir = repo_root().join("target/fuzz");
            Command::new(schemathesis)
                .current_dir(workdir)
                .arg("--config-file")
                .arg(repo_root().join("tests/fuzz/schemathesis.toml"))
                .args(["run", &format!("{url}/api/v1/openapi.json"), "--url", &url, "--checks", "all"])
                .args(["--max-examples", &examples, "--seed", &seed, "--no-color"])
                .args(["--header", &format!("Authorization: Bearer {token}")])
                .output()
                .expect("run schemathesis")
        }
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&run.stdout);
    let summary = report.lines().filter(|l| l.contains("generated") || l.contains("====")).collect::<Vec<_>>();
    eprintln!("schemathesis: {}", summary.join(" | "));
    assert!(run.status.success(), "schemathesis found problems:\n{report}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(report.contains(" passed"), "schemathesis ran no test case:\n{report}");
    system.stop().await;
}
