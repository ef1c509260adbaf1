//! TLS to PostgreSQL and RabbitMQ with rustls (ring): `sslmode` and `sslrootcert` in database
//! URLs against the local server's own certificate, and `amqps://` through a TLS-terminating
//! proxy in front of the local broker, with a CA made for the test. The errors for a refused
//! certificate say what to check.

use std::process::Command;
use std::time::{Duration, Instant};

use attune_common::{db, mq};
use attune_testkit::tls::{TestCertificates, TlsProxy, upstream_of};
use attune_testkit::{admin_database_url, amqp_url, wait_for};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;

/// The admin URL with its host replaced by `host` and `params` added to its query.
fn database_url(host: &str, params: &str) -> String {
    let url = admin_database_url();
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (user, host_port) = authority.rsplit_once('@').map_or(("", authority), |(user, hp)| (user, hp));
    let port = host_port.rsplit_once(':').map_or("5432", |(_, port)| port);
    let user = if user.is_empty() { String::new() } else { format!("{user}@") };
    let separator = if tail.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}{host}:{port}{tail}{separator}{params}")
}

/// Whether this pool's connection is encrypted (PostgreSQL's own view of it).
async fn encrypted(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(pool).await.unwrap()
}

async fn connect(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
    db::connect(url, 1, Duration::from_secs(30)).await
}

/// The certificate the local server serves, and the DNS names it is issued to.
async fn served_certificate() -> (String, Vec<String>) {
    let pool = connect(&database_url("127.0.0.1", "sslmode=require")).await.unwrap();
    let path: String = sqlx::query_scalar("SELECT current_setting('ssl_cert_file')").fetch_one(&pool).await.unwrap();
    pool.close().await;
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in", &path])
        .output()
        .expect("openssl");
    let names = String::from_utf8_lossy(&out.stdout)
        .split([',', '\n'])
        .filter_map(|entry| entry.trim().strip_prefix("DNS:").map(str::to_string))
        .collect();
    (path, names)
}

#[tokio::test]
async fn postgres_speaks_tls_when_the_url_s_sslmode_asks() {
    let required = connect(&database_url("127.0.0.1", "sslmode=require")).await.expect("sslmode=require");
    assert!(encrypted(&required).await, "sslmode=require gave a plain connection");
    required.close().await;
    let disabled = connect(&database_url("127.0.0.1", "sslmode=disable")).await.unwrap();
    assert!(!encrypted(&disabled).await);
    disabled.close().await;
    // `prefer`, when asked for: encrypted, as this server offers TLS
    let preferred = connect(&database_url("127.0.0.1", "sslmode=prefer")).await.unwrap();
    assert!(encrypted(&preferred).await);
    preferred.close().await;
    // unasked, no TLS (not libpq's `prefer`: see `db::connect_options`)
    let unasked = database_url("127.0.0.1", "application_name=attune-tls-test");
    let expected = db::connect_options(&unasked).unwrap().get_ssl_mode();
    if std::env::var("PGSSLMODE").is_err() {
        assert!(matches!(expected, sqlx::postgres::PgSslMode::Disable), "{expected:?}");
    }
    let preferred = connect(&unasked).await.unwrap();
    assert_eq!(encrypted(&preferred).await, !matches!(expected, sqlx::postgres::PgSslMode::Disable));
    preferred.close().await;
}

#[tokio::test]
async fn postgres_verify_modes_check_the_local_server_s_certificate_and_name() {
    // The local server serves a self-signed certificate (Debian's snakeoil): as sslrootcert it is
    // its own root. (Debian also links it into /etc/ssl/certs, so the system's roots trust it
    // too: a wrong root is tested through the proxy below.)
    let (root, names) = served_certificate().await;

    let verified_ca =
        connect(&database_url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={root}"))).await.expect("verify-ca");
    assert!(encrypted(&verified_ca).await);
    verified_ca.close().await;

    // verify-full: the certificate names a host (`localhost` here), not the address 127.0.0.1
    let started = Instant::now();
    let wrong_name = connect(&database_url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={root}")))
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    let message = wrong_name.to_string();
    assert!(message.contains("certificate was refused") && message.contains("not valid for name"), "{message}");
    // not waited out as an unreachable database (connect would retry for 30 s)
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());

    let resolvable = names.iter().find(|name| {
        std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 5432))
            .is_ok_and(|mut addresses| addresses.any(|a| a.ip().is_loopback()))
    });
    match resolvable {
        Some(name) => {
            let verified_full =
                connect(&database_url(name, &format!("sslmode=verify-full&sslrootcert={root}"))).await.expect(name);
            assert!(encrypted(&verified_full).await);
            verified_full.close().await;
        }
        None => eprintln!("verify-full with a matching name not tested: no name of {names:?} resolves to loopback"),
    }
}

#[tokio::test]
async fn postgres_verify_full_trusts_sslrootcert_and_refuses_a_wrong_root_at_once() {
    // A server with a certificate of a private CA: the proxy answers the SSLRequest with it.
    let certificates = TestCertificates::make();
    let upstream = upstream_of(&database_url("127.0.0.1", "sslmode=disable"), 5432);
    let proxy = TlsProxy::start_postgres(&certificates, upstream).await;
    let via_proxy = |host: &str, params: &str| {
        database_url(host, params).replacen(&format!(":{}/", upstream.port()), &format!(":{}/", proxy.port), 1)
    };
    let ca = certificates.ca.display().to_string();

    for host in ["localhost", "127.0.0.1"] {
        let pool = connect(&via_proxy(host, &format!("sslmode=verify-full&sslrootcert={ca}"))).await.expect(host);
        sqlx::query("SELECT 1").execute(&pool).await.unwrap();
        pool.close().await;
    }
    assert_eq!(proxy.handshakes(), 2);

    // the system's roots alone do not hold the private CA; the snakeoil did not sign it
    let started = Instant::now();
    for root in ["", "&sslrootcert=/etc/ssl/certs/ssl-cert-snakeoil.pem"] {
        let refused = connect(&via_proxy("localhost", &format!("sslmode=verify-ca{root}")))
            .await
            .expect_err("a root that did not sign the certificate");
        let message = refused.to_string();
        assert!(matches!(refused, sqlx::Error::Tls(_)), "{refused:?}");
        assert!(message.contains("certificate was refused") && message.contains("sslrootcert"), "{message}");
        assert!(message.contains("UnknownIssuer"), "{message}");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "refusals are not waited out: {:?}", started.elapsed());
    assert_eq!(proxy.handshakes(), 2);

    let missing = connect(&via_proxy("localhost", "sslmode=verify-ca&sslrootcert=/nonexistent/root.pem"))
        .await
        .expect_err("no such root file");
    assert!(missing.to_string().contains("cannot read DATABASE_URL's sslrootcert file"), "{missing}");
}

/// `url` (an `amqp://` URL) with scheme `amqps` and `localhost:<port>` as its authority.
fn amqps_via(url: &str, port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let user = authority.rsplit_once('@').map_or(String::new(), |(user, _)| format!("{user}@"));
    format!("amqps://{user}localhost:{port}{path}")
}

#[tokio::test]
async fn amqps_through_a_proxy_publishes_and_consumes_trusting_a_private_ca() {
    let certificates = TestCertificates::make();
    let proxy = TlsProxy::start(&certificates, upstream_of(&amqp_url(), 5672)).await;
    let url = amqps_via(&amqp_url(), proxy.port);

    let connection =
        mq::connect_trusting(&url, "attune-tls-test", Some(certificates.ca_pem())).await.expect("amqps connect");
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    // a queue of this test's own, gone with its connection
    let queue = format!("attune_tls_test_{}_{:x}", std::process::id(), rand::random::<u32>());
    let options = QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() };
    channel.queue_declare(queue.as_str().into(), options, FieldTable::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(queue.as_str().into(), "tls-test".into(), BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap();
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions { mandatory: true, ..Default::default() },
            b"over tls",
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(matches!(confirm, lapin::Confirmation::Ack(None)), "{confirm:?}");
    let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the message comes back within 10 s")
        .expect("a delivery")
        .unwrap();
    assert_eq!(delivery.data, b"over tls");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
    assert_eq!(proxy.handshakes(), 1, "the connection went through the proxy");
    connection.close(200, "done".into()).await.unwrap();
}

#[tokio::test]
async fn amqps_refuses_an_untrusted_certificate_and_says_what_to_set() {
    let certificates = TestCertificates::make();
    let proxy = TlsProxy::start(&certificates, upstream_of(&amqp_url(), 5672)).await;
    let url = amqps_via(&amqp_url(), proxy.port);

    // the system's roots only: the test CA is not among them
    let refused = mq::connect_trusting(&url, "attune-tls-test", None).await.expect_err("an untrusted certificate");
    let message = refused.to_string();
    assert!(message.contains("certificate was refused") && message.contains("ATTUNE_AMQP_CA_CERT"), "{message}");
    wait_for("the proxy to see the refused handshake", Duration::from_secs(10), || async {
        (proxy.failed_handshakes() == 1).then_some(())
    })
    .await;
    assert_eq!(proxy.handshakes(), 0);

    // a CA file that does not parse is named, with the setting
    let garbage = certificates.dir.join("garbage.pem");
    std::fs::write(&garbage, "no certificate here").unwrap();
    let error = attune_common::tls::read_ca_file("ATTUNE_AMQP_CA_CERT", &garbage).unwrap_err();
    assert!(error.to_string().contains("ATTUNE_AMQP_CA_CERT"), "{error}");
}
