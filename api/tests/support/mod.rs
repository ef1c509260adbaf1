//! What the API's in-process tests share: the router served on port 0 in the test's runtime,
//! against a database and a broker namespace of the test's own, with no executor or worker.
// (each test file uses its own part of this module)
#![allow(dead_code)]

use attune_common::config::{CommonSettings, Defaults, FromEnv};
use attune_testkit::{Namespace, TestDb};
use tokio_util::sync::CancellationToken;

/// One API process's worth of state, served in this test's runtime.
pub struct Served {
    pub url: String,
    pub state: attune_api::State,
    pub db: TestDb,
    pub namespace: Namespace,
    shutdown: CancellationToken,
}

/// The settings a test API starts with: the documented defaults, against the test's database,
/// broker namespace and the repository's packs, on port 0.
fn settings(db: &TestDb, namespace: &Namespace) -> attune_api::Settings {
    let mut settings = attune_api::Settings::from_source(&Defaults).unwrap();
    settings.common = CommonSettings {
        database_url: db.url.clone(),
        amqp_url: attune_testkit::amqp_url(),
        mq_namespace: namespace.name.clone(),
        packs_dir: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs"),
        default_timeout_secs: 300,
    };
    settings.addr = ([127, 0, 0, 1], 0).into();
    settings
}

impl Served {
    /// Serves an API whose settings `adjust` changes first.
    pub async fn start(adjust: impl FnOnce(&mut attune_api::Settings)) -> Served {
        let db = TestDb::new().await;
        let namespace = Namespace::new();
        let mut settings = settings(&db, &namespace);
        adjust(&mut settings);
        let state = attune_api::state(settings).await.expect("api state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(attune_api::serve(listener, state.clone(), shutdown.clone()));
        Served { url, state, db, namespace, shutdown }
    }

    /// Stops serving and removes the namespace and the database.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.namespace.delete(&[]).await;
        self.db.drop_database().await;
    }
}
