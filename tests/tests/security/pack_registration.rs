//! Pack registration with the real binaries, as an operator and an attacker would try it: a pack
//! outside `ATTUNE_PACKS_DIR`, one reached through a symbolic link, and a takeover of `core` are
//! refused; the takeover goes through only with an explicit force, and the code every
//! execution of `core.echo` runs then changes with it.

use std::time::Duration;

use attune_testkit::System;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// `attune pack register ARGS` (its exit status and output, stdout then stderr).
fn register(system: &System, args: &[&str]) -> (bool, String) {
    let out = system.cli_output(&[&["pack", "register"], args].concat());
    let told = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), told)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packs_outside_the_packs_dir_through_links_or_taking_over_a_ref_are_refused() {
    let system = System::builder().worker("w1", &[]).start().await;
    // a pack of ref `core` whose echo runs something else, outside the packs dir
    let outside = std::env::temp_dir().join(format!("attune-evil-{}", rand::random::<u64>()));
    attune_testkit::copy_dir(&system.packs_dir().join("core"), &outside);
    std::fs::write(outside.join("actions/echo.sh"), "#!/bin/sh\necho pwned\n").unwrap();

    let (ok, told) = register(&system, &[outside.to_str().unwrap()]);
    assert!(!ok && told.contains("not under the packs directory"), "{told}");
    let link = system.packs_dir().join("innocent");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let (ok, told) = register(&system, &[link.to_str().unwrap()]);
    assert!(!ok && told.contains("not under the packs directory"), "a link is followed: {told}");

    // the same pack put where the operator puts packs still does not take `core` over ...
    let inside = system.packs_dir().join("core-fork");
    attune_testkit::copy_dir(&outside, &inside);
    let (ok, told) = register(&system, &[inside.to_str().unwrap()]);
    assert!(!ok && told.contains("already registered from") && told.contains("force"), "{told}");
    let first = system.submit("core.echo", json!({"message": "hello"})).await;
    let first = system.wait_terminal(first["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(first["stdout"], "hello\n", "core.echo still runs the registered code");

    // ... unless forced, which changes what core.echo runs
    let (ok, told) = register(&system, &["--force", inside.to_str().unwrap()]);
    assert!(ok, "{told}");
    let second = system.submit("core.echo", json!({"message": "hello"})).await;
    let second = system.wait_terminal(second["id"].as_i64().unwrap(), DEADLINE).await;
    assert_eq!(second["stdout"], "pwned\n");
    let _ = std::fs::remove_dir_all(&outside);
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_with_actions_and_no_pack_yaml_is_said_not_passed_over() {
    let mut system = System::builder().start().await;
    // a pack directory without its pack.yaml, seen by the API when it registers the packs dir
    let nameless = system.packs_dir().join("nameless");
    std::fs::create_dir_all(nameless.join("actions")).unwrap();
    std::fs::write(nameless.join("actions/echo.sh"), "#!/bin/sh\necho hi\n").unwrap();
    system.restart("api");
    system.wait_ready().await;
    system.wait_log("api", "not a pack: it has actions but no pack.yaml").await;
    let shown = system.log("api");
    assert!(shown.lines().any(|l| l.contains("no pack.yaml") && l.contains("nameless")), "{shown}");
    system.stop().await;
}
