//! `Idempotency-Key` on `POST /api/v1/executions`, black-box over HTTP: the API served on port 0
//! in process against a database and a broker namespace of each test's own (as `in_process.rs`
//! does), with no executor or worker. Each test listens to the database's announcements of new
//! requests (`db::announcements`) to count the executions that were created.

use attune_common::db;
use reqwest::StatusCode;
use serde_json::{Value, json};
mod support;

use support::Served;

const HEADER: &str = "Idempotency-Key";

/// The test's API and a token for it.
struct Api {
    served: Served,
    token: String,
    announcements: tokio::sync::Mutex<db::announcements::Announcements>,
}

impl std::ops::Deref for Api {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl Api {
    async fn start() -> Api {
        let served = Served::start(|_| {}).await;
        let token = db::token::create(&served.db.pool, "idempotency").await.unwrap();
        let announcements = db::announcements::Announcements::listen(&served.db.url).await.unwrap().into();
        Api { served, token, announcements }
    }

    /// `POST /api/v1/executions` with `body` sent as written, `key` in the header if given.
    async fn submit_as(&self, token: &str, key: Option<&str>, body: &str) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(format!("{}/api/v1/executions", self.url))
            .bearer_auth(token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            request = request.header(HEADER, key);
        }
        support::answer(request.send().await.unwrap()).await
    }

    async fn submit(&self, key: Option<&str>, body: &str) -> (StatusCode, Value) {
        self.submit_as(&self.token, key, body).await
    }

    async fn executions(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM execution").fetch_one(&self.db.pool).await.unwrap()
    }

    /// Hears `expected` announcements of new requests, and then none (`support::announced`).
    async fn announced(&self, expected: usize) {
        support::announced(&mut *self.announcements.lock().await, &self.db.pool, expected).await;
    }

    async fn stop(self) {
        self.served.stop().await;
    }
}

fn id_of(body: &Value) -> i64 {
    body["id"].as_i64().unwrap_or_else(|| panic!("no execution id in {body}"))
}

const ECHO_HI: &str = r#"{"action_ref": "core.echo", "parameters": {"message": "hi"}}"#;

#[tokio::test]
async fn the_same_key_and_body_again_answers_200_with_the_first_execution_and_creates_nothing() {
    let api = Api::start().await;
    let (status, first) = api.submit(Some("order-1"), ECHO_HI).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // the same request, laid out differently and with its keys in another order
    let again = "{\n  \"parameters\" : { \"message\" : \"hi\" },\n  \"action_ref\" : \"core.echo\"\n}";
    for body in [ECHO_HI, again] {
        let (status, repeat) = api.submit(Some("order-1"), body).await;
        assert_eq!(status, StatusCode::OK, "{repeat}");
        assert_eq!(id_of(&repeat), id_of(&first), "{repeat}");
        assert_eq!(repeat["action_ref"], "core.echo");
    }
    assert_eq!(api.executions().await, 1);
    api.announced(1).await;
    api.stop().await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_409_naming_the_header_and_the_first_execution() {
    let api = Api::start().await;
    let (_, first) = api.submit(Some("order-1"), ECHO_HI).await;
    let (status, refused) =
        api.submit(Some("order-1"), r#"{"action_ref": "core.echo", "parameters": {"message": "ho"}}"#).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    let error = &refused["error"];
    assert_eq!((error["code"].as_str(), error["parameter"].as_str()), (Some("idempotency_key_reused"), Some(HEADER)));
    assert_eq!(error["execution_id"].as_i64(), Some(id_of(&first)), "{refused}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(HEADER) && message.contains("different request body"), "{message}");
    assert!(message.contains(&format!("execution {}", id_of(&first))), "{message}");
    // even a body that would be refused on its own: the key's conflict is the answer
    let (status, refused) = api.submit(Some("order-1"), r#"{"action_ref": "core.nope"}"#).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("idempotency_key_reused")));
    assert_eq!(api.executions().await, 1);
    api.stop().await;
}

#[tokio::test]
async fn another_token_with_the_same_key_gets_an_execution_of_its_own() {
    let api = Api::start().await;
    let other = db::token::create(&api.db.pool, "other").await.unwrap();
    let (status, mine) = api.submit(Some("order-1"), ECHO_HI).await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    let (status, theirs) = api.submit_as(&other, Some("order-1"), ECHO_HI).await;
    assert_eq!(status, StatusCode::CREATED, "{theirs}");
    assert_ne!(id_of(&mine), id_of(&theirs));
    // and each token's repeat finds its own
    let (status, repeat) = api.submit_as(&other, Some("order-1"), ECHO_HI).await;
    assert_eq!((status, id_of(&repeat)), (StatusCode::OK, id_of(&theirs)));
    assert_eq!(api.executions().await, 2);
    api.stop().await;
}

#[tokio::test]
async fn a_key_recorded_more_than_24_hours_ago_is_free_again() {
    let api = Api::start().await;
    let (_, first) = api.submit(Some("order-1"), ECHO_HI).await;
    sqlx::query("UPDATE api_idempotency_key SET created = now() - interval '24 hours 1 second' WHERE key = 'order-1'")
        .execute(&api.db.pool)
        .await
        .unwrap();
    // even with another body: the old record no longer speaks for the key
    let (status, second) =
        api.submit(Some("order-1"), r#"{"action_ref": "core.echo", "parameters": {"message": "ho"}}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{second}");
    assert_ne!(id_of(&second), id_of(&first));
    let recorded: (i64, i64) =
        sqlx::query_as("SELECT execution, count(*) OVER () FROM api_idempotency_key WHERE key = 'order-1'")
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(recorded, (id_of(&second), 1), "the old record is replaced");
    let (status, repeat) =
        api.submit(Some("order-1"), r#"{"action_ref": "core.echo", "parameters": {"message": "ho"}}"#).await;
    assert_eq!((status, id_of(&repeat)), (StatusCode::OK, id_of(&second)));
    api.announced(2).await;
    api.stop().await;
}

#[tokio::test]
async fn a_malformed_key_is_a_400_naming_the_header_and_creates_nothing() {
    let api = Api::start().await;
    let too_long = "k".repeat(256);
    for key in ["", too_long.as_str(), "two words", "caf\u{e9}"] {
        let mut request = api
            .http
            .post(format!("{}/api/v1/executions", api.url))
            .bearer_auth(&api.token)
            .json(&json!({"action_ref": "core.echo", "parameters": {"message": "hi"}}));
        request = request.header(HEADER, reqwest::header::HeaderValue::from_bytes(key.as_bytes()).unwrap());
        let response = request.send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key:?}: {body}");
        assert_eq!(body["error"]["parameter"], HEADER, "{key:?}: {body}");
    }
    // the longest key there may be is fine
    let (status, body) = api.submit(Some(&"k".repeat(255)), ECHO_HI).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(api.executions().await, 1);
    api.stop().await;
}

#[tokio::test]
async fn without_the_header_every_submission_is_a_new_execution() {
    let api = Api::start().await;
    let (first_status, first) = api.submit(None, ECHO_HI).await;
    let (second_status, second) = api.submit(None, ECHO_HI).await;
    assert_eq!((first_status, second_status), (StatusCode::CREATED, StatusCode::CREATED));
    assert_ne!(id_of(&first), id_of(&second));
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_idempotency_key").fetch_one(&api.db.pool).await.unwrap();
    assert_eq!((api.executions().await, keys), (2, 0));
    api.announced(2).await;
    api.stop().await;
}

/// Sends `body` eight times at once with one key; returns the statuses and ids of the answers.
async fn eight_at_once(api: &Api, body: &str) -> (Vec<StatusCode>, Vec<i64>) {
    let answers = futures_util::future::join_all((0..8).map(|_| api.submit(Some("burst"), body))).await;
    let statuses = answers.iter().map(|(status, _)| *status).collect();
    let ids = answers.iter().map(|(_, body)| id_of(body)).collect();
    (statuses, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_requests_with_one_key_create_one_execution() {
    let api = Api::start().await;
    let (mut statuses, ids) = eight_at_once(&api, ECHO_HI).await;
    statuses.sort();
    assert_eq!(statuses, [[StatusCode::OK; 7].as_slice(), &[StatusCode::CREATED]].concat());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let stored: Vec<i64> = sqlx::query_scalar("SELECT id FROM execution").fetch_all(&api.db.pool).await.unwrap();
    assert_eq!(stored, [ids[0]]);
    api.announced(1).await;
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_retry_sent_again_with_its_key_answers_the_retry_not_already_retried() {
    let api = Api::start().await;
    let (_, original) = api.submit(None, ECHO_HI).await;
    let original = id_of(&original);
    let cancel = api
        .http
        .post(format!("{}/api/v1/executions/{original}/cancel", api.url))
        .bearer_auth(&api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    // the quick reference's Example 4, eight times at once with one key
    let example_4 = json!({"action_ref": "core.echo", "config": {"retry_of": original, "max_retries": 3}}).to_string();
    let (mut statuses, ids) = eight_at_once(&api, &example_4).await;
    statuses.sort();
    assert_eq!(statuses, [[StatusCode::OK; 7].as_slice(), &[StatusCode::CREATED]].concat());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let retries: Vec<i64> = sqlx::query_scalar("SELECT id FROM execution WHERE original_execution = $1")
        .bind(original)
        .fetch_all(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(retries, [ids[0]]);
    // without the key, the same request is refused as before
    let (status, refused) = api.submit(None, &example_4).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("already_retried")));
    api.announced(2).await;
    api.stop().await;
}
