//! PostgreSQL announces new waiting requests (`db::announcements`): what a listener hears for each
//! kind of insert, on the real database, a fresh one per test. "Nothing was announced" is shown
//! without waiting for silence: a marker request is inserted after, and it must be the next thing
//! heard.

use std::time::Duration;

use attune_common::db::{self, announcements::Announced, announcements::Announcements, execution::NewExecution};
use attune_core::ExecutionStatus;
use attune_testkit::TestDb;

const DEADLINE: Duration = Duration::from_secs(10);

async fn next(announcements: &mut Announcements) -> Announced {
    tokio::time::timeout(DEADLINE, announcements.next())
        .await
        .expect("an announcement within the deadline")
        .expect("the listener's connection")
}

fn runtimes(names: &[&str]) -> Announced {
    Announced::Runtimes(names.iter().map(|name| name.to_string()).collect())
}

struct Fixture {
    test: TestDb,
    action: db::action::Action,
}

impl Fixture {
    async fn new() -> Fixture {
        let test = TestDb::new().await;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
        db::pack::register(&test.pool, &attune_common::pack::load_pack(&dir).unwrap()).await.unwrap();
        let action = db::action::get_by_ref(&test.pool, "core.echo").await.unwrap().unwrap();
        Fixture { test, action }
    }

    fn request(&self, runtime: Option<&str>) -> NewExecution {
        NewExecution { runtime: runtime.map(str::to_string), ..attune_testkit::echo_execution(&self.action) }
    }

    /// A request of a runtime no other insert of the test uses: what must be heard next.
    async fn marker(&self, announcements: &mut Announcements, name: &str) {
        db::execution::insert(&self.test.pool, &self.request(Some(name))).await.unwrap();
        assert_eq!(next(announcements).await, runtimes(&[name]), "the marker is the next announcement");
    }
}

#[tokio::test]
async fn each_insert_of_requests_is_announced_once_with_its_runtimes_at_its_commit() {
    let fixture = Fixture::new().await;
    let pool = &fixture.test.pool;
    let mut announcements = Announcements::listen(&fixture.test.url).await.unwrap();

    // one request, its runtime read from its action (core.echo is a shell action)
    db::execution::insert(pool, &fixture.request(None)).await.unwrap();
    assert_eq!(next(&mut announcements).await, runtimes(&["shell"]));

    // a batch of submissions: one announcement, each runtime once
    let (shell, python) = (fixture.request(Some("shell")), fixture.request(Some("python")));
    let token = db::token::create_with(pool, "submitter", db::token::Role::Operator, None).await.unwrap().0.id;
    let by = db::execution::Submitter::token(token);
    let batch = [(&shell, &by), (&python, &by), (&shell, &by)];
    assert_eq!(
        db::execution::api::insert_many_submitted(pool, &batch, db::execution::Patience::Once).await.unwrap().len(),
        3
    );
    assert_eq!(next(&mut announcements).await, runtimes(&["python", "shell"]));

    // nothing until the commit, nothing at all for a rollback
    let mut transaction = pool.begin().await.unwrap();
    db::execution::insert(&mut *transaction, &fixture.request(Some("rolled-back"))).await.unwrap();
    transaction.rollback().await.unwrap();
    let mut transaction = pool.begin().await.unwrap();
    db::execution::insert(&mut *transaction, &fixture.request(Some("committed"))).await.unwrap();
    fixture.marker(&mut announcements, "before-the-commit").await;
    transaction.commit().await.unwrap();
    assert_eq!(next(&mut announcements).await, runtimes(&["committed"]));

    // a retry waiting out its backoff is not a request yet (it is announced when it is due)
    let delayed = NewExecution {
        status: ExecutionStatus::Delayed,
        not_before: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
        ..fixture.request(Some("delayed"))
    };
    db::execution::insert(pool, &delayed).await.unwrap();
    fixture.marker(&mut announcements, "after-the-delayed").await;

    fixture.test.drop_database().await;
}

#[tokio::test]
async fn a_request_whose_runtime_is_unknown_is_announced_for_every_runtime() {
    let fixture = Fixture::new().await;
    let mut announcements = Announcements::listen(&fixture.test.url).await.unwrap();
    let unknown = NewExecution { action: None, action_ref: "gone.action".into(), ..fixture.request(None) };
    db::execution::insert(&fixture.test.pool, &unknown).await.unwrap();
    assert_eq!(next(&mut announcements).await, Announced::Some);
    fixture.test.drop_database().await;
}

#[tokio::test]
async fn a_listener_whose_connection_is_killed_says_so_and_listens_again() {
    let fixture = Fixture::new().await;
    let mut announcements = Announcements::listen(&fixture.test.url).await.unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(&fixture.test.name)
    .fetch_all(&fixture.test.pool)
    .await
    .unwrap();
    assert_eq!(killed, [true], "the listener's one connection");
    // heard as a lost connection (the listener is connected and subscribed again), or as the
    // error the server sent with it (the executor then listens anew, as here)
    let heard = tokio::time::timeout(DEADLINE, announcements.next()).await.expect("the loss is noticed");
    let mut announcements = match heard {
        Ok(Announced::Missed) => announcements,
        Err(_) => Announcements::listen(&fixture.test.url).await.unwrap(),
        Ok(other) => panic!("the killed connection announced {other:?}"),
    };
    fixture.marker(&mut announcements, "after-the-kill").await;
    fixture.test.drop_database().await;
}

#[tokio::test]
async fn a_listener_whose_connection_goes_silent_finds_out_by_checking_it() {
    let fixture = Fixture::new().await;
    let cut = attune_testkit::pgcut::PgCut::start("127.0.0.1:5432").await;
    let (silence, patience) = (Duration::from_millis(200), Duration::from_millis(500));
    let url = cut.url(&fixture.test.url);
    let mut announcements = Announcements::listen_checking(&url, silence, patience).await.unwrap();
    // heard through the proxy while it relays
    fixture.marker(&mut announcements, "relayed").await;
    // dropped without a reset: nothing arrives and nothing says so, unless the listener asks
    cut.go_silent();
    let heard = tokio::time::timeout(DEADLINE, announcements.next()).await.expect("a silent connection is found out");
    let error = heard.expect_err("an unanswered check is an error");
    assert!(error.to_string().contains("did not answer a check"), "{error}");
    fixture.test.drop_database().await;
}
