//! `docker-compose.yml` and `Dockerfile` cannot be run here (no Docker engine); this checks what
//! can be checked without one: the compose file parses, and names and wires what the quick
//! reference's commands use.

use attune_testkit::system::repo_root;
use serde_yaml_ng::Value;

#[test]
fn the_compose_file_has_what_the_quick_reference_uses() {
    let text = std::fs::read_to_string(repo_root().join("docker-compose.yml")).unwrap();
    let mut compose: Value = serde_yaml_ng::from_str(&text).expect("docker-compose.yml parses");
    compose.apply_merge().expect("merge keys resolve");
    let services = compose["services"].as_mapping().expect("services");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    for expected in ["postgres", "rabbitmq", "api", "executor", "worker-shell", "worker-python"] {
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
    for service in ["api", "executor", "worker-shell", "worker-python"] {
        let s = &compose["services"][service];
        assert_eq!(s["depends_on"]["postgres"]["condition"], "service_healthy", "{service}");
        assert_eq!(s["depends_on"]["rabbitmq"]["condition"], "service_healthy", "{service}");
        assert_eq!(s["environment"]["DATABASE_URL"], "postgres://attune:attune@postgres:5432/attune", "{service}");
        let mounts: Vec<&str> = s["volumes"].as_sequence().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(mounts.iter().any(|m| m.starts_with("./packs:/packs")), "{service} mounts ./packs");
    }
    assert_eq!(compose["services"]["worker-python"]["environment"]["ATTUNE_WORKER_RUNTIMES"], "python");
    assert_eq!(compose["services"]["worker-shell"]["environment"]["ATTUNE_WORKER_RUNTIMES"], "shell,builtin,http");
    // the Dockerfile builds every binary the services run
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    for binary in ["attune-api", "attune-executor", "attune-worker", "attune"] {
        assert!(dockerfile.contains(&format!("target/release/{binary}")), "{binary}");
    }
}
