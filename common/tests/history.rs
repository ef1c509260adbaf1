//! History on the real database, a fresh one per test: retention removes whole retry chains past
//! their ages (and nothing else), archives them when asked, removes long-inactive workers that no
//! execution names; the rollup counts what retention removes, and the statistics read it.

use attune_common::db::{self, history::Pruned};
use attune_core::ExecutionStatus::{self, *};
use attune_core::retention::{Age, Attempt, Retention};
use attune_testkit::TestDb;

/// Inserts an execution as history would hold it: `status`, created `created_days_ago` days
/// ago, finished `finished_days_ago` days ago (when terminal), retrying `parent`.
async fn insert(db: &TestDb, status: ExecutionStatus, finished_days_ago: Option<f64>, parent: Option<i64>) -> i64 {
    let created_days_ago = finished_days_ago.unwrap_or(0.0) + 0.001;
    sqlx::query_scalar(
        "INSERT INTO execution (action_ref, status, created, updated, finished, retry_count, original_execution, \
                                retry_reason, config, failure_kind) \
         VALUES ('core.echo', $1, now() - make_interval(secs => $2 * 86400), now(), \
                 now() - make_interval(secs => $3 * 86400), \
                 (SELECT COALESCE(max(p.retry_count) + 1, 0) FROM execution p WHERE p.id = $4), $4, \
                 CASE WHEN $4 IS NOT NULL THEN 'transient_error' END, \
                 CASE WHEN $4 IS NOT NULL THEN '{\"retry_reason\": \"transient_error\"}'::jsonb ELSE '{}' END, \
                 CASE WHEN $1 = 'failed' THEN 'transient_error' END) RETURNING id",
    )
    .bind(status)
    .bind(created_days_ago)
    .bind(finished_days_ago)
    .bind(parent)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Every terminal status walked to its end, as the executor's history job does.
async fn prune_all(db: &TestDb, retention: &Retention, batch: i64, archive: bool) -> i64 {
    let mut removed = 0;
    for status in ExecutionStatus::TERMINAL {
        let mut after = 0;
        loop {
            let Pruned { removed: now, examined, last } =
                db::history::prune_batch(&db.pool, retention, status, after, batch, archive).await.unwrap();
            removed += now;
            match last {
                Some(last) if examined == batch => after = last,
                _ => break,
            }
        }
    }
    removed
}

async fn exists(db: &TestDb, id: i64) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM execution WHERE id = $1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn retention_removes_whole_chains_past_their_ages_and_nothing_younger_or_alive() {
    let db = TestDb::new().await;
    let old_completed = insert(&db, Completed, Some(8.0), None).await;
    let young_completed = insert(&db, Completed, Some(6.0), None).await;
    let old_canceled = insert(&db, Canceled, Some(8.0), None).await;
    // a failed first attempt keeps its 30 days though its retry completed over 7 days ago
    let held_root = insert(&db, Failed, Some(10.0), None).await;
    let held_retry = insert(&db, Completed, Some(9.0), Some(held_root)).await;
    // both past their ages: the chain goes together
    let gone_root = insert(&db, Failed, Some(40.0), None).await;
    let gone_middle = insert(&db, Failed, Some(35.0), Some(gone_root)).await;
    let gone_leaf = insert(&db, Completed, Some(34.0), Some(gone_middle)).await;
    // a retry still waiting out its backoff keeps its long-failed parent
    let waiting_root = insert(&db, Failed, Some(60.0), None).await;
    let waiting_retry = insert(&db, Delayed, None, Some(waiting_root)).await;
    let running = insert(&db, Running, None, None).await;
    sqlx::query("UPDATE execution SET created = now() - interval '90 days' WHERE id = $1")
        .bind(running)
        .execute(&db.pool)
        .await
        .unwrap();

    let removed = prune_all(&db, &Retention::default(), 500, false).await;
    assert_eq!(removed, 5, "the old completed and canceled executions and the three of the old chain");
    for id in [old_completed, old_canceled, gone_root, gone_middle, gone_leaf] {
        assert!(!exists(&db, id).await, "{id} is removed");
    }
    for id in [young_completed, held_root, held_retry, waiting_root, waiting_retry, running] {
        assert!(exists(&db, id).await, "{id} is kept");
    }
    // a second pass finds nothing more; the space goes back (VACUUM runs outside a transaction)
    assert_eq!(prune_all(&db, &Retention::default(), 500, false).await, 0);
    db::history::vacuum(&db.pool).await.unwrap();
    let dead: i64 = sqlx::query_scalar("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'execution'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "vacuumed");
    // an age of `off` keeps a status for ever
    let kept = Retention { completed: Age::OFF, canceled: Age::OFF, ..Retention::default() };
    let never = insert(&db, Completed, Some(900.0), None).await;
    assert_eq!(prune_all(&db, &kept, 500, false).await, 0);
    assert!(exists(&db, never).await);
}

#[tokio::test]
async fn retention_walks_past_its_batch_and_the_database_agrees_with_the_rule() {
    let db = TestDb::new().await;
    let retention = Retention::default();
    // chains of every shape in two statuses at ages around their limits
    let shapes: [&[(ExecutionStatus, Option<f64>)]; 8] = [
        &[(Completed, Some(7.5))],
        &[(Completed, Some(6.5))],
        &[(Failed, Some(31.0)), (Completed, Some(30.5))],
        &[(Failed, Some(31.0)), (Completed, Some(6.0))],
        &[(Failed, Some(29.0))],
        &[(Timeout, Some(31.0)), (Failed, Some(30.9)), (Abandoned, Some(30.8))],
        &[(Failed, Some(50.0)), (Requested, None)],
        &[(Canceled, Some(8.0))],
    ];
    let mut expected = Vec::new();
    for round in 0..30 {
        for shape in shapes {
            let mut parent = None;
            let mut ids = Vec::new();
            for (status, finished) in shape {
                let id = insert(&db, *status, *finished, parent).await;
                ids.push(id);
                parent = Some(id);
            }
            let chain: Vec<Attempt> = shape
                .iter()
                .map(|(status, finished)| Attempt {
                    status: *status,
                    finished_ago: finished.map(|days| std::time::Duration::from_secs_f64(days * 86_400.0)),
                })
                .collect();
            expected.push((round, ids, retention.removable(&chain)));
        }
    }
    // a batch far smaller than what is removable: the walk goes on past each batch
    prune_all(&db, &retention, 7, false).await;
    for (round, ids, removable) in expected {
        for id in ids {
            assert_eq!(!exists(&db, id).await, removable, "round {round}: execution {id}");
        }
    }
}

#[tokio::test]
async fn archived_history_keeps_every_column_and_its_idempotency_record_goes_with_it() {
    let db = TestDb::new().await;
    let columns = |table: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position) \
                 FROM information_schema.columns WHERE table_name = $1",
            )
            .bind(table)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(
        columns("execution_archive").await,
        columns("execution").await,
        "a new execution column goes into the archive too"
    );

    let root = insert(&db, Failed, Some(40.0), None).await;
    let leaf = insert(&db, Completed, Some(39.0), Some(root)).await;
    let token: i64 = sqlx::query_scalar(
        "INSERT INTO api_token (name, token_hash, role) VALUES ('t', '\\x00', 'operator') RETURNING id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO api_idempotency_key (token, key, request_sha256, execution) VALUES ($1, 'k', $2, $3)")
        .bind(token)
        .bind(vec![0u8; 32])
        .bind(root)
        .execute(&db.pool)
        .await
        .unwrap();
    let before: serde_json::Value = sqlx::query_scalar("SELECT to_jsonb(e) FROM execution e WHERE id = $1")
        .bind(leaf)
        .fetch_one(&db.pool)
        .await
        .unwrap();

    assert_eq!(prune_all(&db, &Retention::default(), 500, true).await, 2);
    let archived: serde_json::Value = sqlx::query_scalar("SELECT to_jsonb(a) FROM execution_archive a WHERE id = $1")
        .bind(leaf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(archived, before, "the archived row is the row");
    let archived_ids: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM execution_archive ORDER BY id").fetch_all(&db.pool).await.unwrap();
    assert_eq!(archived_ids, vec![root, leaf]);
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM api_idempotency_key").fetch_one(&db.pool).await.unwrap();
    assert_eq!(keys, 0);
}

#[tokio::test]
async fn only_long_inactive_workers_that_no_unfinished_execution_names_are_removed() {
    let db = TestDb::new().await;
    let worker = |name: &'static str, status: &'static str, days: f64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "INSERT INTO worker (name, status, last_heartbeat) VALUES ($1, $2, now() - make_interval(secs => $3 * 86400)) RETURNING id",
            )
            .bind(name)
            .bind(status)
            .bind(days)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let gone = worker("gone", "inactive", 8.0).await;
    let recent = worker("recent", "inactive", 6.0).await;
    let running_there = worker("running there", "inactive", 8.0).await;
    let active = worker("active", "active", 8.0).await;
    let ran = insert(&db, Completed, Some(1.0), None).await;
    let runs = insert(&db, Running, None, None).await;
    for (execution, worker) in [(ran, gone), (runs, running_there)] {
        sqlx::query("UPDATE execution SET worker = $2 WHERE id = $1")
            .bind(execution)
            .bind(worker)
            .execute(&db.pool)
            .await
            .unwrap();
    }

    assert_eq!(db::history::prune_workers(&db.pool, Age::days(7).secs().unwrap()).await.unwrap(), 1);
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM worker ORDER BY id").fetch_all(&db.pool).await.unwrap();
    assert_eq!(left, vec![recent, running_there, active], "a worker still named by a run stays");
    assert!(!left.contains(&gone));
    let kept = db::execution::get(&db.pool, ran).await.unwrap().expect("the execution stays");
    assert_eq!(kept.worker, Some(gone), "a finished execution keeps the id of the worker that ran it");
}

#[tokio::test]
async fn statistics_read_the_rollup_for_counted_minutes_and_keep_counting_what_retention_removed() {
    let db = TestDb::new().await;
    // two hours of history: originals, and retries of which one completed
    let mut ids = Vec::new();
    for _ in 0..3 {
        let root = insert(&db, Failed, Some(0.08), None).await;
        ids.push(root);
        ids.push(insert(&db, Completed, Some(0.07), Some(root)).await);
    }
    let failed_retry_parent = insert(&db, Failed, Some(0.06), None).await;
    insert(&db, Failed, Some(0.05), Some(failed_retry_parent)).await;
    // and a minute ago, unfinished
    insert(&db, Running, None, None).await;

    let window = 6.0 * 3600.0;
    let live = db::stats::retry_totals(&db.pool, window).await.unwrap();
    assert_eq!(live, (5, 4, 3, 4), "originals, retries, retries completed, retries finished");
    let reasons = db::stats::retries_by_reason(&db.pool, window).await.unwrap();
    assert_eq!(reasons, vec![("transient_error".to_string(), 4, 3, 4)]);

    let reach = db::history::rollup(&db.pool).await.unwrap().expect("the rollup reaches somewhere");
    let counted: i64 = sqlx::query_scalar("SELECT COALESCE(sum(total), 0)::bigint FROM execution_rollup")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(counted, 8, "the finished history is counted; the running execution's minute is not over");
    assert!(reach <= db::now(&db.pool).await.unwrap());
    assert_eq!(db::stats::retry_totals(&db.pool, window).await.unwrap(), live, "the same numbers from the rollup");

    // retention removes the history; the statistics still count it
    let short = Retention { completed: "1m".parse().unwrap(), failed: "1m".parse().unwrap(), ..Retention::default() };
    assert_eq!(prune_all(&db, &short, 500, false).await, 8);
    assert_eq!(db::stats::retry_totals(&db.pool, window).await.unwrap(), live);
    assert_eq!(db::stats::retries_by_reason(&db.pool, window).await.unwrap(), reasons);
    let (now, _) = db::stats::reach(&db.pool).await.unwrap();
    let start = now - chrono::TimeDelta::seconds(window as i64);
    let buckets = db::stats::retry_buckets(&db.pool, start, now, window / 12.0, 12).await.unwrap();
    let retries: i64 = buckets.iter().filter(|row| row.1.is_some()).map(|row| row.2).sum();
    let originals: i64 = buckets.iter().filter(|row| row.1.is_none()).map(|row| row.2).sum();
    assert_eq!((originals, retries), (5, 4), "{buckets:?}");

    // a rebuild (after a bulk load behind the service's back) counts only what is left
    let _: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT execution_rollup_rebuild()").fetch_one(&db.pool).await.unwrap();
    assert_eq!(db::stats::retry_totals(&db.pool, window).await.unwrap(), (1, 0, 0, 0));
}

#[tokio::test]
async fn an_action_keeps_its_history_for_its_own_ages_where_its_pack_sets_them() {
    let db = TestDb::new().await;
    // a pack whose noisy action keeps its successes a day and its failures for ever
    let dir = std::env::temp_dir().join(format!("attune-retention-pack-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(dir.join("actions")).unwrap();
    std::fs::write(dir.join("pack.yaml"), "ref: kept\nversion: 1.0.0\n").unwrap();
    std::fs::write(dir.join("actions/noisy.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(
        dir.join("actions/noisy.yaml"),
        "name: noisy\nruntime: shell\nentrypoint: actions/noisy.sh\nretention:\n  completed: 1d\n  failed: 'off'\n",
    )
    .unwrap();
    db::pack::register(&db.pool, &attune_common::pack::load_pack(&dir).unwrap()).await.unwrap();
    let noisy: i64 =
        sqlx::query_scalar("SELECT id FROM action WHERE ref = 'kept.noisy'").fetch_one(&db.pool).await.unwrap();
    let of_noisy = |id: i64| {
        sqlx::query("UPDATE execution SET action = $2, action_ref = 'kept.noisy' WHERE id = $1")
            .bind(id)
            .bind(noisy)
            .execute(&db.pool)
    };
    let noisy_done = insert(&db, Completed, Some(2.0), None).await;
    of_noisy(noisy_done).await.unwrap();
    let noisy_young = insert(&db, Completed, Some(0.5), None).await;
    of_noisy(noisy_young).await.unwrap();
    let noisy_failed = insert(&db, Failed, Some(400.0), None).await;
    of_noisy(noisy_failed).await.unwrap();
    // another action's: the executors' ages (completed 7 days, failed 30)
    let other_done = insert(&db, Completed, Some(2.0), None).await;
    let other_failed = insert(&db, Failed, Some(400.0), None).await;

    assert_eq!(prune_all(&db, &Retention::default(), 500, false).await, 2);
    assert!(!exists(&db, noisy_done).await, "its own 1 day, not the executors' 7");
    assert!(!exists(&db, other_failed).await, "the executors' 30 days");
    for kept in [noisy_young, noisy_failed, other_done] {
        assert!(exists(&db, kept).await, "{kept} is kept");
    }
    // a status the executors keep for ever is still removed for an action that sets an age
    let off = Retention { completed: Age::OFF, ..Retention::default() };
    // (ids follow creation times, as they do when executions are submitted: 1.5 days ago is
    // after everything else that is older than a day here)
    let noisy_old = insert(&db, Completed, Some(1.5), None).await;
    of_noisy(noisy_old).await.unwrap();
    assert_eq!(prune_all(&db, &off, 500, false).await, 1);
    assert!(!exists(&db, noisy_old).await);
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_database().await;
}

#[tokio::test]
async fn audit_events_past_their_age_go_oldest_first_in_batches_and_into_the_archive_when_asked() {
    let db = TestDb::new().await;
    // ten events 400 days old, one 300 days old, one now
    sqlx::query(
        "INSERT INTO audit_event (at, actor, method, route, path, status) \
         SELECT now() - make_interval(days => d), 'cli:test', 'CLI', 'token create', 'attune token create', 0 \
         FROM unnest(array[400,400,400,400,400,400,400,400,400,400,300,0]) AS d",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let year = 365.0 * 86400.0;
    assert_eq!(db::audit::prune(&db.pool, year, 4, false).await.unwrap(), 4);
    assert_eq!(db::audit::prune(&db.pool, year, 4, true).await.unwrap(), 4);
    assert_eq!(db::audit::prune(&db.pool, year, 4, false).await.unwrap(), 2);
    assert_eq!(db::audit::prune(&db.pool, year, 4, false).await.unwrap(), 0);
    let left: Vec<i32> = sqlx::query_scalar("SELECT extract(day FROM now() - at)::int FROM audit_event ORDER BY at")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, [300, 0]);
    let archived: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_event_archive").fetch_one(&db.pool).await.unwrap();
    assert_eq!(archived, 4);
    db.drop_database().await;
}

/// Issue 46 (review R2): the book's export of `execution_archive`, run as written while the
/// history job moves rows into the archive, loses none of them: each is still in `execution`, in
/// the archive, or in the exported file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_book_s_archive_export_loses_nothing_the_history_job_archives_meanwhile() {
    let db = TestDb::new().await;
    let all: Vec<i64> = sqlx::query_scalar(
        "INSERT INTO execution (action_ref, status, created, updated, finished, retry_count, config) \
         SELECT 'core.echo', 'completed', now() - interval '10 days', now(), now() - interval '10 days', 0, '{}' \
         FROM generate_series(1, 3000) RETURNING id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let book = std::fs::read_to_string(attune_testkit::system::repo_root().join("book/src/operating.md")).unwrap();
    let section = &book[book.find("ATTUNE_RETENTION_ARCHIVE=true").expect("the archive's section")..];
    let block = section.split("```").nth(1).expect("its commands");
    let commands: Vec<&str> = block.lines().filter_map(|l| l.strip_prefix("$ ")).collect();
    assert!(!commands.is_empty(), "{block}");
    let dir = std::env::temp_dir().join(format!("attune-export-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    // psql as the operator runs it: the connection from libpq's environment
    let (scheme_less, _) = db.url.split_once('?').unwrap_or((&db.url, ""));
    let rest = scheme_less.split_once("://").unwrap().1;
    let (credentials, location) = rest.rsplit_once('@').unwrap_or(("", rest));
    let (user, password) = credentials.split_once(':').unwrap_or((credentials, ""));
    let (host_port, database) = location.split_once('/').unwrap();
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "5432"));
    let libpq =
        [("PGHOST", host), ("PGPORT", port), ("PGUSER", user), ("PGPASSWORD", password), ("PGDATABASE", database)];

    // the history job, archiving in small batches all along
    let mut archiving = Some(tokio::spawn({
        let pool = db.pool.clone();
        async move {
            let retention = Retention { completed: Age::days(7), ..Retention::default() };
            let mut after = 0;
            loop {
                let pruned = db::history::prune_batch(&pool, &retention, Completed, after, 25, true).await.unwrap();
                match pruned.last {
                    Some(last) if pruned.examined == 25 => after = last,
                    _ => return,
                }
            }
        }
    }));
    // the operator's export, twice while it archives (and once after)
    let mut exported = std::collections::BTreeSet::new();
    for round in 0..3 {
        if round == 2 {
            archiving.take().unwrap().await.unwrap();
        }
        for command in &commands {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(command)
                .current_dir(&dir)
                .envs(libpq.iter().filter(|(_, v)| !v.is_empty()).copied())
                .output()
                .unwrap();
            assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let csv = std::fs::read_to_string(dir.join("executions-2026-11.csv")).unwrap();
        exported.extend(csv.lines().skip(1).map(|l| l.split(',').next().unwrap().parse::<i64>().unwrap()));
    }
    let kept: Vec<i64> = sqlx::query_scalar("SELECT id FROM execution UNION ALL SELECT id FROM execution_archive")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    exported.extend(kept);
    let lost: Vec<i64> = all.iter().copied().filter(|id| !exported.contains(id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} executions lost by the export, first {:?}",
        lost.len(),
        all.len(),
        &lost[..lost.len().min(5)]
    );
    let _ = std::fs::remove_dir_all(dir);
}
