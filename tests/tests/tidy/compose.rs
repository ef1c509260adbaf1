//! `docker-compose.yml` and `Dockerfile` cannot be run here (no Docker engine); this checks what
//! can be checked without one: the compose file parses, names and wires what the quick
//! reference's commands use, and is closed by default (no database or broker port on the host's
//! interfaces, no management UI, no password with a default).

use attune_testkit::system::repo_root;
use serde_yaml_ng::Value;

#[test]
fn the_compose_file_has_what_the_quick_reference_uses() {
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml parses");
    compose.apply_merge().expect("merge keys resolve");
    let services = compose["services"].as_mapping().expect("services");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    for expected in ["postgres", "rabbitmq", "migrate", "api", "executor", "worker-shell", "worker-python"] {
        assert!(names.contains(&expected), "service {expected} missing: {names:?}");
    }
    // docker compose exec postgres psql -U attune -d attune -f /migrations/20260209000000_phase3_retry_and_health.sql
    let postgres = &compose["services"]["postgres"];
    assert_eq!(postgres["environment"]["POSTGRES_USER"], "attune");
    assert_eq!(postgres["environment"]["POSTGRES_DB"], "attune");
    let volumes: Vec<&str> = postgres["volumes"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
    // /migrations holds the guarded psql form (common/tests/migrations_psql.rs runs it twice), and
    // the sqlx migrations it applies are at /sqlx-migrations, where it looks for them by default
    assert!(volumes.iter().any(|v| v.starts_with("./migrations/psql:/migrations")), "{volumes:?}");
    assert!(volumes.iter().any(|v| v.starts_with("./migrations:/sqlx-migrations")), "{volumes:?}");
    assert!(repo_root().join("migrations/psql/20260209000000_phase3_retry_and_health.sql").is_file());
    assert!(repo_root().join("migrations/20260209000000_phase3_retry_and_health.sql").is_file());
    for dependency in ["postgres", "rabbitmq"] {
        assert!(
            compose["services"][dependency]["healthcheck"]["test"].is_sequence(),
            "{dependency} has a health check"
        );
    }
    // the schema changes in one step, as its owner, before any service starts
    let migrate = &compose["services"]["migrate"];
    let command = migrate["command"].as_sequence().expect("a command");
    assert_eq!(command[..2], [Value::from("sh"), Value::from("-c")]);
    assert!(command[2].as_str().unwrap().starts_with("attune migrate && attune worker-login allow "), "{command:?}");
    assert_eq!(
        migrate["environment"]["DATABASE_URL"],
        "postgres://attune:${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD, see book/src/docker.md}@postgres:5432/attune"
    );
    assert!(volumes.iter().any(|v| v.starts_with("./scripts/compose/postgres-logins.sh:/docker-entrypoint-initdb.d/")));
    // (each worker service its own login and broker user: one taken worker reaches only its runs)
    for (service, own) in
        [("api", "api"), ("executor", "executor"), ("worker-shell", "worker_shell"), ("worker-python", "worker_python")]
    {
        let s = &compose["services"][service];
        assert_eq!(s["depends_on"]["postgres"]["condition"], "service_healthy", "{service}");
        assert_eq!(s["depends_on"]["rabbitmq"]["condition"], "service_healthy", "{service}");
        assert_eq!(s["depends_on"]["migrate"]["condition"], "service_completed_successfully", "{service}");
        // each service logs in as its own database login and broker user
        let upper = own.to_uppercase();
        assert_eq!(
            s["environment"]["DATABASE_URL"].as_str().unwrap(),
            format!(
                "postgres://attune_{own}_login:${{POSTGRES_{upper}_PASSWORD:?set POSTGRES_{upper}_PASSWORD, see book/src/docker.md}}@postgres:5432/attune"
            ),
            "{service}"
        );
        assert_eq!(
            s["environment"]["AMQP_URL"].as_str().unwrap(),
            format!(
                "amqp://attune-{}:${{RABBITMQ_{upper}_PASSWORD:?set RABBITMQ_{upper}_PASSWORD, see book/src/docker.md}}@rabbitmq:5672/attune",
                own.replace('_', "-")
            ),
            "{service}"
        );
        let mounts: Vec<&str> = s["volumes"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(mounts.iter().any(|m| m.starts_with("./packs:/packs")), "{service} mounts ./packs");
    }
    // the secret store is on: the API and the workers read the key the one-shot `keys` makes in
    // its volume; the executor, which opens no secret, has none
    let keys = &compose["services"]["keys"];
    assert_eq!(keys["restart"], "no");
    assert!(keys["command"][2].as_str().unwrap().contains("chmod 0400 /keys/secrets.key"), "{:?}", keys["command"]);
    let executor = &compose["services"]["executor"];
    let mounts: Vec<&str> = executor["volumes"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(!mounts.iter().any(|m| m.starts_with("attune-keys")), "the executor holds no key: {mounts:?}");
    assert!(executor["depends_on"]["keys"].is_null(), "{:?}", executor["depends_on"]);
    // the broker makes one user per worker service, and the migration grants each its runtimes
    let broker = &compose["services"]["rabbitmq"]["environment"];
    assert_eq!(broker["ATTUNE_MQ_WORKERS"], "worker-shell worker-python");
    let grants = command[2].as_str().unwrap();
    assert!(grants.contains("allow attune_worker_shell_login shell builtin http"), "{grants}");
    assert!(grants.contains("allow attune_worker_python_login python"), "{grants}");
    for service in ["api", "worker-shell", "worker-python"] {
        let s = &compose["services"][service];
        assert_eq!(s["environment"]["ATTUNE_SECRETS_KEY_FILE"], "/keys/secrets.key", "{service}");
        assert_eq!(s["depends_on"]["keys"]["condition"], "service_completed_successfully", "{service}");
        let mounts: Vec<&str> = s["volumes"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(mounts.contains(&"attune-keys:/keys:ro"), "{service}: {mounts:?}");
    }
    // the workers run as root, so that each action runs as a user id of its own
    for worker in ["worker-shell", "worker-python"] {
        assert_eq!(compose["services"][worker]["user"], "0:0", "{worker}");
    }
    assert_eq!(compose["services"]["worker-python"]["environment"]["ATTUNE_WORKER_RUNTIMES"], "python");
    assert_eq!(compose["services"]["worker-shell"]["environment"]["ATTUNE_WORKER_RUNTIMES"], "shell,builtin,http");
    // the Dockerfile builds every binary the services run
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    for binary in ["attune-api", "attune-executor", "attune-worker", "attune"] {
        assert!(dockerfile.contains(&format!("target/release/{binary}")), "{binary}");
    }
}

/// Ports a service publishes on the host: (host address, container port) for each, the address
/// `None` when every interface (`"8080:8080"`, `"5432"`, or the long form without `host_ip`).
fn published(service: &Value) -> Vec<(Option<String>, u16)> {
    let container_port = |text: &str| -> u16 {
        let port = text.split('/').next().unwrap_or_default();
        port.split('-').next().unwrap().parse().unwrap_or_else(|_| panic!("port {text}"))
    };
    let mut ports = Vec::new();
    for entry in service["ports"].as_sequence().into_iter().flatten() {
        match entry {
            Value::Mapping(_) => {
                let host = entry["host_ip"].as_str().map(str::to_string);
                let target = entry["target"].as_u64().map(|p| p as u16);
                ports.push((host, target.unwrap_or_else(|| container_port(entry["target"].as_str().unwrap()))));
            }
            _ => {
                let text = match entry {
                    Value::Number(n) => n.to_string(),
                    _ => entry.as_str().expect("a port entry is a string, a number or a mapping").to_string(),
                };
                // HOST_IP:HOST_PORT:CONTAINER_PORT, HOST_PORT:CONTAINER_PORT or CONTAINER_PORT
                // (an IPv6 host address is bracketed: [::1]:5432:5432)
                let (host, rest) = match text.strip_prefix('[') {
                    Some(bracketed) => {
                        let (address, rest) = bracketed.split_once("]:").expect("a bracketed address");
                        (Some(address.to_string()), rest.to_string())
                    }
                    None => {
                        let parts: Vec<&str> = text.split(':').collect();
                        match parts.len() {
                            3 => (Some(parts[0].to_string()), parts[1..].join(":")),
                            _ => (None, text.clone()),
                        }
                    }
                };
                ports.push((host, container_port(rest.rsplit(':').next().unwrap())));
            }
        }
    }
    ports
}

#[test]
fn the_compose_file_is_closed_by_default() {
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml parses");
    compose.apply_merge().expect("merge keys resolve");
    let services = compose["services"].as_mapping().expect("services");

    // no database or broker port (PostgreSQL, AMQP, the management UI, Erlang distribution) on
    // every interface of the host; at most on its loopback
    const PRIVATE_PORTS: [u16; 6] = [5432, 5672, 5671, 15672, 25672, 4369];
    for (name, service) in services {
        let name = name.as_str().unwrap();
        let private = matches!(name, "postgres" | "rabbitmq");
        for (host, port) in published(service) {
            if private || PRIVATE_PORTS.contains(&port) {
                assert!(
                    matches!(host.as_deref(), Some("127.0.0.1" | "::1" | "localhost")),
                    "{name} publishes port {port} on {}",
                    host.as_deref().unwrap_or("every interface")
                );
            }
        }
    }
    // the broker runs without its management UI
    let broker_image = compose["services"]["rabbitmq"]["image"].as_str().unwrap();
    assert!(!broker_image.contains("management"), "rabbitmq image {broker_image}");

    // no password has a default: each is a required variable, `${NAME:?message}`, never
    // `${NAME:-default}`, `${NAME-default}` or a literal
    for (reference, _) in text.match_indices("${") {
        let inner = &text[reference + 2..];
        let inner = &inner[..inner.find('}').expect("a closed ${...}")];
        let name: String = inner.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if ["PASSWORD", "PASS", "SECRET", "TOKEN"].iter().any(|word| name.contains(word)) {
            assert!(inner[name.len()..].starts_with(":?"), "${{{inner}}} may default; write ${{{name}:?...}}");
        }
    }
    let required = |value: &Value, variable: &str| {
        let value = value.as_str().unwrap_or_default();
        assert!(value.starts_with(&format!("${{{variable}:?")) && value.ends_with('}'), "{value}");
    };
    required(&compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"], "POSTGRES_PASSWORD");
    required(&compose["services"]["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"], "RABBITMQ_PASSWORD");
    for (name, service) in services {
        let name = name.as_str().unwrap();
        for url in ["DATABASE_URL", "AMQP_URL"] {
            let Some(value) = service["environment"][url].as_str() else { continue };
            let (_, rest) = value.split_once("://").unwrap();
            let (userinfo, _) = rest.rsplit_once('@').unwrap_or_else(|| panic!("{name} {url} names no user"));
            let (_, password) = userinfo.split_once(':').unwrap_or_else(|| panic!("{name} {url} has no password"));
            assert!(password.starts_with("${") && password.contains(":?"), "{name}'s {url} has a fixed password");
        }
    }
}

#[test]
fn the_port_reader_reads_each_form() {
    let ports: Value = serde_yaml_ng::from_str(
        "ports: [\"8080:8080\", \"127.0.0.1:5432:5432\", 5672, \"[::1]:15672:15672/tcp\", \"9000-9001:9000-9001\",
                 {target: 4369, published: 4369}, {target: 25672, host_ip: 127.0.0.1}]",
    )
    .unwrap();
    assert_eq!(
        published(&ports),
        vec![
            (None, 8080),
            (Some("127.0.0.1".into()), 5432),
            (None, 5672),
            (Some("::1".into()), 15672),
            (None, 9000),
            (None, 4369),
            (Some("127.0.0.1".into()), 25672),
        ]
    );
}

/// `docker compose restart worker-shell` (the quick reference's command) stops a worker with
/// SIGTERM and kills it after the service's `stop_grace_period` (Docker's default: 10 s): that
/// must cover the worker's drain (`ATTUNE_WORKER_DRAIN_SECS`, its default unless the service sets
/// it) and its last steps, or the restart kills running actions.
#[test]
fn a_worker_service_is_given_the_time_its_drain_takes_before_it_is_killed() {
    use attune_common::config::{Defaults, read};
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml parses");
    compose.apply_merge().expect("merge keys resolve");
    let default_drain: u64 = read(&Defaults, "ATTUNE_WORKER_DRAIN_SECS").unwrap();
    for service in ["worker-shell", "worker-python"] {
        let s = &compose["services"][service];
        let drain = s["environment"]["ATTUNE_WORKER_DRAIN_SECS"]
            .as_str()
            .map_or(default_drain, |secs| secs.parse().expect("ATTUNE_WORKER_DRAIN_SECS is whole seconds"));
        let grace = s["stop_grace_period"].as_str().unwrap_or_else(|| panic!("{service} has no stop_grace_period"));
        let grace: u64 = grace
            .strip_suffix('s')
            .and_then(|secs| secs.parse().ok())
            .unwrap_or_else(|| panic!("{service}: stop_grace_period {grace:?} is not whole seconds like '45s'"));
        assert!(
            grace >= drain + 10,
            "{service}: stop_grace_period {grace} s must cover the {drain} s drain and 10 s more"
        );
    }
}
