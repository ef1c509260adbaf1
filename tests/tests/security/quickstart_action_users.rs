//! The quickstart never runs an action as root nor as the user holding `.attune/` (issue 47,
//! finding 2 of the 2026-11-28 review: run as root from a checkout closed to others it set
//! `ATTUNE_WORKER_ACTION_UIDS=off`, and run as another user its actions ran as that user).
//! `scripts/lib.sh`'s `plan_action_users` refuses `off` and, when the actions' users cannot read
//! the packs, copies them where they can and points `ATTUNE_PACKS_DIR` there. Run as root (as
//! the tests are), in directories of its own: nothing here starts a service.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

use attune_testkit::system::repo_root;

/// `plan_action_users` in `dir`, with `env`; its output, and the `ATTUNE_PACKS_DIR` it left.
fn plan(dir: &Path, env: &[(&str, &str)]) -> (Output, String) {
    let lib = repo_root().join("scripts/lib.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}' && plan_action_users && echo \"$ATTUNE_PACKS_DIR\"", lib.display()))
        .current_dir(dir)
        .env_remove("ATTUNE_WORKER_ACTION_UIDS")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let packs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out, packs)
}

fn nobody_reads(path: &Path) -> bool {
    Command::new("runuser").args(["-u", "nobody", "--", "test", "-r"]).arg(path).status().unwrap().success()
}

#[test]
fn the_quickstart_runs_actions_as_users_of_their_own_even_from_a_closed_checkout() {
    // a checkout closed to others (under /root, say), and where its packs are copied to
    let scratch = std::env::temp_dir().join(format!("attune-qs-users-{:016x}", rand::random::<u64>()));
    let checkout = scratch.join("home/checkout");
    attune_testkit::copy_dir(&repo_root().join("packs/core"), &checkout.join("packs/core"));
    std::fs::set_permissions(scratch.join("home"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let packs = checkout.join("packs");
    assert!(!nobody_reads(&packs.join("core/actions/echo.sh")));
    let shared = scratch.join("var/packs");
    let env = [("ATTUNE_PACKS_DIR", packs.to_str().unwrap()), ("ATTUNE_SHARED_PACKS", shared.to_str().unwrap())];

    // never `off`: that ran every action as root
    let (refused, _) = plan(&checkout, &[env[0], env[1], ("ATTUNE_WORKER_ACTION_UIDS", "off")]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("ATTUNE_WORKER_ACTION_UIDS=off"), "{said}");

    let (out, packs_dir) = plan(&checkout, &env);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(packs_dir, shared.to_str().unwrap(), "the workers take the copy: {out:?}");
    let echo = shared.join("core/actions/echo.sh");
    assert!(nobody_reads(&echo), "the actions' users read the copy");
    let meta = std::fs::metadata(&shared).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o022), (0, 0), "this user's, written by no one else");
    // a pack added to the copy stays; a change in the checkout reaches it at the next run
    std::fs::create_dir_all(shared.join("added")).unwrap();
    std::fs::write(packs.join("core/actions/echo.sh"), "echo changed\n").unwrap();
    let (again, _) = plan(&checkout, &env);
    assert!(again.status.success(), "{again:?}");
    assert!(shared.join("added").is_dir());
    assert_eq!(std::fs::read_to_string(&echo).unwrap(), "echo changed\n");

    // a packs directory others can read is used as it is
    std::fs::set_permissions(scratch.join("home"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (open, packs_dir) = plan(&checkout, &env);
    assert!(open.status.success(), "{open:?}");
    assert_eq!(packs_dir, packs.to_str().unwrap());
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// `start_as_root` gives a worker its settings (its URLs hold its passwords) without putting them
/// on any command line (review of issue 47): as another user it goes through sudo, which stays
/// the worker's parent for its whole life with its arguments in `/proc/<pid>/cmdline`, which
/// every user reads, the actions' users too. Here a stand-in for sudo that waits on its child as
/// sudo does; the started program says what it was given.
#[test]
fn a_worker_started_as_root_has_its_passwords_on_no_command_line() {
    let scratch = std::env::temp_dir().join(format!("attune-qs-start-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(scratch.join(".attune")).unwrap();
    std::fs::create_dir_all(scratch.join("target/debug")).unwrap();
    let given = scratch.join("given");
    let fake = scratch.join("target/debug/attune-fake-worker");
    std::fs::write(&fake, format!("#!/bin/sh\nprintf '%s' \"$DATABASE_URL\" >{}\nexec sleep 60\n", given.display()))
        .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let password = format!("pw{:016x}", rand::random::<u64>());
    let url = format!("postgres://attune_worker_login:{password}@127.0.0.1:5432/attune");
    let lib = repo_root().join("scripts/lib.sh");
    let script = format!(
        ". '{}' && as_root() {{ python3 -c 'import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))' \"$@\"; }} \
         && start_as_root fake attune-fake-worker DATABASE_URL=\"$WORKER_URL\"",
        lib.display()
    );
    // (the URL reaches the script as the quickstart's do: in its environment, not its arguments)
    let out =
        Command::new("bash").arg("-c").arg(&script).current_dir(&scratch).env("WORKER_URL", &url).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&given).unwrap_or_default() != url {
        assert!(std::time::Instant::now() < deadline, "the worker was not given its URL: {out:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let shown: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&password))
        .collect();
    let pid = std::fs::read_to_string(scratch.join(".attune/fake.pid")).unwrap();
    let _ = Command::new("kill").arg(pid.trim()).status();
    assert!(shown.is_empty(), "a password on a command line: {shown:?}");
    let left: Vec<_> = std::fs::read_dir(scratch.join(".attune")).unwrap().filter_map(Result::ok).collect();
    assert!(left.iter().all(|e| !e.file_name().to_string_lossy().starts_with("start.")), "the settings file stays");
    let _ = std::fs::remove_dir_all(&scratch);
}
