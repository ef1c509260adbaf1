//! The quickstart's credentials (`scripts/lib.sh`, `ensure_credentials`): a random password per
//! service login and broker user and a random secrets key, kept in files only their owner reads
//! (0600), made once and kept after, a value from the environment winning. Run in a directory of
//! its own: nothing here touches PostgreSQL or RabbitMQ.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use attune_testkit::system::repo_root;

fn ensure_credentials(dir: &Path, env: &[(&str, &str)]) {
    let lib = repo_root().join("scripts/lib.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(". '{}' && ensure_credentials", lib.display()))
        .current_dir(dir)
        .env_remove("ATTUNE_TEST_LOGIN_PASSWORD")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn read(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join(".attune/credentials"))
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_quickstart_makes_random_credentials_only_their_owner_reads_and_keeps_them() {
    let dir = std::env::temp_dir().join(format!("attune-credentials-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    ensure_credentials(&dir, &[]);
    let first = read(&dir);
    for name in [
        "ATTUNE_DB_PASSWORD",
        "ATTUNE_DB_API_PASSWORD",
        "ATTUNE_DB_EXECUTOR_PASSWORD",
        "ATTUNE_DB_WORKER_PASSWORD",
        "ATTUNE_MQ_API_PASSWORD",
        "ATTUNE_MQ_EXECUTOR_PASSWORD",
        "ATTUNE_MQ_WORKER_PASSWORD",
    ] {
        let value = first.get(name).unwrap_or_else(|| panic!("{name} missing: {first:?}"));
        assert!(value.len() == 48 && value.chars().all(|c| c.is_ascii_hexdigit()), "{name}={value}");
    }
    let distinct: std::collections::BTreeSet<&String> = first.values().collect();
    assert_eq!(distinct.len(), first.len(), "every password its own");
    assert!(!first.values().any(|v| v == "attune" || v == "guest"), "{first:?}");
    assert_eq!(mode(&dir.join(".attune/credentials")), 0o600);
    let key = std::fs::read_to_string(dir.join(".attune/secrets.key")).unwrap();
    assert!(key.len() == 64 && key.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    assert_eq!(mode(&dir.join(".attune/secrets.key")), 0o600);

    // made once: a second run keeps them (and a mode widened by hand is narrowed again)
    std::fs::set_permissions(dir.join(".attune/credentials"), std::fs::Permissions::from_mode(0o644)).unwrap();
    ensure_credentials(&dir, &[]);
    assert_eq!(read(&dir), first);
    assert_eq!(std::fs::read_to_string(dir.join(".attune/secrets.key")).unwrap(), key);
    assert_eq!(mode(&dir.join(".attune/credentials")), 0o600);
    std::fs::remove_dir_all(&dir).unwrap();
}
