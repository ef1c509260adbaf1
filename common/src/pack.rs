//! Pack loading: reads `pack.yaml` and `actions/*.yaml` from disk and hands their text to
//! `attune_core::pack`, which parses and validates it.

use std::path::{Path, PathBuf};

pub use attune_core::pack::*;

fn read(file: &Path) -> Result<String, PackError> {
    std::fs::read_to_string(file).map_err(|e| PackError::new(file, None, format!("cannot read: {e}")))
}

/// Loads and validates the pack in `dir`.
pub fn load_pack(dir: &Path) -> Result<LoadedPack, PackError> {
    let manifest_file = dir.join("pack.yaml");
    let manifest = parse_manifest(&manifest_file, &read(&manifest_file)?)?;
    let actions_dir = dir.join("actions");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&actions_dir) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(PackError::new(&actions_dir, None, format!("cannot read: {e}")));
        }
    };
    files.sort();
    let mut actions: Vec<LoadedAction> = Vec::new();
    for file in files {
        let spec = parse_action(dir, &file, &read(&file)?, |path| path.is_file())?;
        let action_ref = format!("{}.{}", manifest.pack_ref, spec.name);
        if actions.iter().any(|a| a.action_ref == action_ref) {
            return Err(PackError::new(&file, Some("name"), format!("duplicate action '{action_ref}'")));
        }
        let warnings: Vec<String> = spec.warnings().into_iter().map(|w| format!("{}: {w}", file.display())).collect();
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        actions.push(LoadedAction { action_ref, spec, warnings });
    }
    Ok(LoadedPack { manifest, path: dir.to_path_buf(), actions })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempPack(PathBuf);
    impl Drop for TempPack {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn pack_with(action_yaml: &str) -> TempPack {
        let dir = std::env::temp_dir().join(format!("attune-pack-test-{}", rand::random::<u64>()));
        std::fs::create_dir_all(dir.join("actions")).unwrap();
        std::fs::write(dir.join("pack.yaml"), "ref: mypack\nversion: 1.0.0\n").unwrap();
        std::fs::write(dir.join("actions/flaky_api.py"), "print('hi')\n").unwrap();
        std::fs::write(dir.join("actions/flaky-api.yaml"), action_yaml).unwrap();
        TempPack(dir)
    }

    const SEED_ACTION: &str = "name: flaky_api_call\nruntime: python\nentrypoint: actions/flaky_api.py\ntimeout_seconds: 120 # Custom timeout (overrides global 5 min)\nmax_retries: 3 # Retry up to 3 times on failure\nparameters:\n  url:\n    type: string\n    required: true\n";

    #[test]
    fn the_seed_action_loads_as_written() {
        let pack = pack_with(SEED_ACTION);
        let loaded = load_pack(&pack.0).unwrap();
        assert_eq!(loaded.actions.len(), 1);
        let action = &loaded.actions[0];
        assert_eq!(action.action_ref, "mypack.flaky_api_call");
        assert_eq!(action.spec.timeout_seconds, Some(120));
        assert_eq!(action.spec.max_retries, Some(3));
        assert!(action.spec.parameters["url"].required);
    }

    #[test]
    fn an_entrypoint_missing_on_disk_is_named() {
        let pack = pack_with("name: x\nruntime: python\nentrypoint: actions/missing.py\n");
        let err = load_pack(&pack.0).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("entrypoint"), "{err}");
        assert!(err.reason.contains("not found"), "{err}");
    }

    #[test]
    fn the_core_pack_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs/core");
        let pack = load_pack(&dir).unwrap();
        let refs: Vec<&str> = pack.actions.iter().map(|a| a.action_ref.as_str()).collect();
        for expected in ["core.echo", "core.sleep", "core.fail", "core.noop", "core.python_echo"] {
            assert!(refs.contains(&expected), "{refs:?}");
        }
    }
}
