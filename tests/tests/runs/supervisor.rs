//! A worker's one long-lived supervisor (docs/adr/0009-one-supervisor-per-worker.md), with the
//! real binaries: every action of a worker is started by the same supervisor process, and when
//! that process is killed the worker fails its runs as the platform's loss (retried), none of
//! their processes is left behind, and a new supervisor serves the next run.

use std::time::{Duration, Instant};

use attune_testkit::runs::{KillOnDrop, processes_with_env};
use attune_testkit::system::repo_root;
use attune_testkit::{Started, System, wait_for};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(60);

fn id(v: &Value) -> i64 {
    v["id"].as_i64().unwrap()
}

/// The supervisors (`attune-worker supervisor <worker pid> ...`, its children) of the worker
/// process `worker`.
fn supervisors_of(worker: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for dir in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = dir.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        // (the worker's child: a start's child that has not exec'd yet shows the same arguments)
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<u32>().ok());
        if args.get(1) == Some(&&b"supervisor"[..])
            && args.get(2) == Some(&worker.to_string().as_bytes())
            && parent == Some(worker)
        {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_fails_its_runs_as_the_platform_s_loss_and_a_new_one_serves_the_next() {
    let name = format!("supervised-{:08x}", rand::random::<u32>());
    let system = System::builder().pack(repo_root().join("testkit/packs/e2e")).worker(&name, &[]).start().await;
    let worker = system.pid(&name);
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let entry = format!("ATTUNE_PARAM_MARKER={marker}");
    let _cleanup = KillOnDrop(entry.clone());
    // three actions at once, each a shell with a background grandchild and a foreground sleep
    let runs: Vec<Value> = futures_util::future::join_all(
        (0..3).map(|_| system.submit("e2e.spawn", json!({"marker": marker, "seconds": 300}))),
    )
    .await;
    let found = wait_for("the three actions and their children to run", DEADLINE, || async {
        let found = processes_with_env(&entry);
        (found.len() >= 9).then_some(found)
    })
    .await;
    let supervisors = supervisors_of(worker);
    assert_eq!(supervisors.len(), 1, "one supervisor for the worker: {supervisors:?}");
    let supervisor = supervisors[0];
    let started_by_it = found.iter().filter(|(_, parent)| *parent == supervisor).count();
    assert_eq!(started_by_it, 3, "each action's shell is the supervisor's child: {found:?}");

    let status = std::process::Command::new("kill").args(["-9", &supervisor.to_string()]).status().unwrap();
    assert!(status.success());
    let killed = Instant::now();
    wait_for("every process of the actions to be gone", Duration::from_secs(5), || async {
        processes_with_env(&entry).is_empty().then_some(())
    })
    .await;
    eprintln!("the actions' processes were gone {:?} after the supervisor was killed", killed.elapsed());
    // the platform's loss, not the actions' failure (issue 46): worker_unavailable, counted
    // against the worker and never by a circuit, and retried though the action allows no retry
    for run in &runs {
        let ended = system.wait_terminal(id(run), DEADLINE).await;
        assert_eq!(
            (ended["status"].as_str(), ended["failure_kind"].as_str(), ended["max_retries"].as_i64()),
            (Some("failed"), Some("worker_unavailable"), Some(0)),
            "{ended:#}"
        );
        assert!(ended["stderr"].as_str().unwrap_or_default().contains("supervisor was lost"), "{ended:#}");
        let retry = wait_for("the run's retry", DEADLINE, || async {
            let (_, chain) = system.get(&format!("/api/v1/executions/{}/chain", id(run))).await;
            chain["attempts"].as_array()?.get(1).cloned()
        })
        .await;
        assert_eq!(retry["retry_reason"], "worker_unavailable", "{retry:#}");
        let (status, _) = system.post(&format!("/api/v1/executions/{}/cancel", id(&retry)), &json!({})).await;
        assert!(status == 200 || status == 409, "cancel the retry: {status}");
    }

    let done = system.submit("core.echo", json!({"message": "again"})).await;
    let ended = system.wait_terminal(id(&done), DEADLINE).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    let again = supervisors_of(worker);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0], supervisor, "a new supervisor");
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_takes_every_action_and_its_supervisor_with_it() {
    let name = format!("supervised-{:08x}", rand::random::<u32>());
    let mut system = System::builder().pack(repo_root().join("testkit/packs/e2e")).worker(&name, &[]).start().await;
    let worker = system.pid(&name);
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let entry = format!("ATTUNE_PARAM_MARKER={marker}");
    let _cleanup = KillOnDrop(entry.clone());
    for _ in 0..3 {
        system.submit("e2e.spawn", json!({"marker": marker, "seconds": 300})).await;
    }
    wait_for("the three actions and their children to run", DEADLINE, || async {
        (processes_with_env(&entry).len() >= 9).then_some(())
    })
    .await;
    let supervisor = supervisors_of(worker);
    assert_eq!(supervisor.len(), 1, "{supervisor:?}");
    system.signal(&name, 9);
    let killed = Instant::now();
    wait_for("every process of the actions, and the supervisor, to be gone", Duration::from_secs(2), || async {
        let supervisor_gone =
            std::fs::read_to_string(format!("/proc/{}/stat", supervisor[0])).map_or(true, |stat| stat.contains(") Z"));
        (processes_with_env(&entry).is_empty() && supervisor_gone).then_some(())
    })
    .await;
    eprintln!("the actions and the supervisor were gone {:?} after the worker was killed", killed.elapsed());
    system.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_binary_was_removed_still_starts_supervisors() {
    // A package upgrade replaces or removes the worker's file under the running worker. A
    // supervisor started after that (the first died) must still be this worker's own: the image it
    // runs, not the path it was started from (gone here; another version after an upgrade).
    let system = System::builder().start().await;
    let dir = std::env::temp_dir().join(format!("attune-upgraded-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("attune-worker");
    std::fs::copy(attune_testkit::workspace_binary("attune-worker"), &copy).unwrap();
    let name = format!("upgraded-{:08x}", rand::random::<u32>());
    let template = system.command("attune-worker");
    let mut command = std::process::Command::new(&copy);
    for (key, value) in template.get_envs() {
        if let Some(value) = value {
            command.env(key, value);
        }
    }
    let log = std::fs::File::create(dir.join("worker.log")).unwrap();
    let worker = command
        .env("ATTUNE_WORKER_NAME", &name)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let worker = Started(worker);
    system.wait_consuming(&name).await;
    let first = system.submit("core.echo", json!({"message": "before"})).await;
    assert_eq!(system.wait_terminal(id(&first), DEADLINE).await["status"], "completed");
    let supervisors = supervisors_of(worker.0.id());
    assert_eq!(supervisors.len(), 1, "{supervisors:?}");

    std::fs::remove_file(&copy).unwrap();
    let status = std::process::Command::new("kill").args(["-9", &supervisors[0].to_string()]).status().unwrap();
    assert!(status.success());
    wait_for("the supervisor to be gone", Duration::from_secs(10), || async {
        supervisors_of(worker.0.id()).is_empty().then_some(())
    })
    .await;
    let after = system.submit("core.echo", json!({"message": "after"})).await;
    let ended = system.wait_terminal(id(&after), DEADLINE).await;
    let log = std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default();
    assert_eq!(ended["status"], "completed", "{ended:#}\n{log}");
    assert_eq!(ended["stdout"], "after\n", "{ended:#}");
    let again = supervisors_of(worker.0.id());
    assert_eq!(again.len(), 1, "a new supervisor: {again:?}");
    // it shows the worker's own name, as supervisors did before
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", again[0])).unwrap();
    let shown = String::from_utf8_lossy(cmdline.split(|b| *b == 0).next().unwrap()).into_owned();
    assert!(shown.starts_with(copy.to_str().unwrap()), "{shown}");
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", again[0])).unwrap();
    assert_eq!(comm.trim_end(), "attune-worker", "the name ps -e and top show");
    drop(worker);
    let _ = std::fs::remove_dir_all(&dir);
    system.stop().await;
}

/// One start stuck in its exec on a stalled file system (an interpreter on a mount whose server
/// is gone) holds up no other run (issue 46): the supervisor starts actions off its loop, so the
/// other runs start, are watched and end as usual meanwhile; the stuck one is given up as the
/// platform's loss, and the supervisor is not killed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_stuck_on_a_stalled_file_system_holds_up_no_other_run() {
    let dir = std::env::temp_dir().join(format!("attune-stalled-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let stalled = attune_testkit::fuse::StalledFile::mount(&dir, "python3")
        .expect("this test mounts a FUSE file system (root, /dev/fuse)");
    let python = stalled.path();
    assert!(std::fs::metadata(&python).is_ok(), "the stalled file can be stat'ed");
    let name = format!("stalled-{:08x}", rand::random::<u32>());
    let system = System::builder()
        .pack(repo_root().join("testkit/packs/e2e"))
        .worker(&name, &[("ATTUNE_PYTHON", python.to_str().unwrap())])
        .start()
        .await;
    let worker = system.pid(&name);
    let stuck = system.submit("core.python_echo", json!({"message": "never"})).await;
    wait_for("the python run's exec to wait on the stalled file system", DEADLINE, || async {
        (stalled.opens() >= 1).then_some(())
    })
    .await;
    let supervisors = supervisors_of(worker);
    assert_eq!(supervisors.len(), 1, "{supervisors:?}");

    // another run starts, is watched and ends while that exec waits
    let submitted = Instant::now();
    let other = system.submit("e2e.work", json!({"seconds": 1})).await;
    let ended = system.wait_terminal(id(&other), DEADLINE).await;
    assert_eq!((ended["status"].as_str(), ended["retry_count"].as_i64()), (Some("completed"), Some(0)), "{ended:#}");
    let took = submitted.elapsed();
    eprintln!("the other run completed {took:?} after its submission, while the stuck start waited");
    assert!(took < Duration::from_secs(8), "the other run took {took:?}: it waited for the stuck start");

    // the stuck start is given up alone, as the platform's loss, and retried
    let ended = system.wait_terminal(id(&stuck), DEADLINE).await;
    assert_eq!(
        (ended["status"].as_str(), ended["failure_kind"].as_str()),
        (Some("failed"), Some("worker_unavailable")),
        "{ended:#}"
    );
    assert!(ended["error"].as_str().unwrap_or_default().contains("start did not finish"), "{ended:#}");
    assert_eq!(supervisors_of(worker), supervisors, "the supervisor was not killed for one stuck start");
    let retry = wait_for("the stuck run's retry", DEADLINE, || async {
        let (_, chain) = system.get(&format!("/api/v1/executions/{}/chain", id(&stuck))).await;
        chain["attempts"].as_array()?.get(1).cloned()
    })
    .await;
    assert_eq!(retry["retry_reason"], "worker_unavailable", "{retry:#}");
    let (status, _) = system.post(&format!("/api/v1/executions/{}/cancel", id(&retry)), &json!({})).await;
    assert!(status == 200 || status == 409, "cancel the retry: {status}");

    // once the file system is gone the waiting exec fails, and the supervisor serves on
    drop(stalled);
    let done = system.submit("core.echo", json!({"message": "after"})).await;
    let ended = system.wait_terminal(id(&done), DEADLINE).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");
    assert_eq!(supervisors_of(worker), supervisors, "the same supervisor");
    system.stop().await;
    let _ = std::fs::remove_dir(&dir);
}
