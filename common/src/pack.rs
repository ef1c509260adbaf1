//! Pack loading: reads `pack.yaml`, `actions/*.yaml`, `workflows/*.yaml`, `webhooks/*.yaml` and `rules/*.yaml` from disk and hands their text to
//! `attune_core::pack`, which parses and validates it.

use std::path::{Path, PathBuf};

pub use attune_core::pack::*;

/// Reads `file`, which must lie inside `root` (the pack directory, resolved) once every symbolic
/// link is followed.
fn read(root: &Path, file: &Path) -> Result<String, PackError> {
    inside(root, file)?;
    std::fs::read_to_string(file).map_err(|e| PackError::new(file, None, format!("cannot read: {e}")))
}

/// Refuses a `file` that resolves outside `root`.
fn inside(root: &Path, file: &Path) -> Result<(), PackError> {
    let resolved = std::fs::canonicalize(file).map_err(|e| PackError::new(file, None, format!("cannot read: {e}")))?;
    if resolved.starts_with(root) {
        Ok(())
    } else {
        Err(PackError::new(file, None, "is a symbolic link leading outside the pack directory"))
    }
}

/// Where a pack may be registered from: `path` (relative to `packs_dir`, or absolute) resolved
/// with every symbolic link followed, which must be a directory strictly under `packs_dir`
/// (`ATTUNE_PACKS_DIR`, resolved too). Whoever can register a pack chooses code that workers run:
/// it comes only from where the operator put packs.
pub fn resolve_in_packs_dir(packs_dir: &Path, path: &Path) -> Result<PathBuf, PackLocationError> {
    let root = std::fs::canonicalize(packs_dir)
        .map_err(|e| PackLocationError::NoPacksDir(packs_dir.display().to_string(), e.to_string()))?;
    let wanted = if path.is_absolute() { path.to_path_buf() } else { root.join(path) };
    let resolved =
        std::fs::canonicalize(&wanted).map_err(|_| PackLocationError::NotFound(path.display().to_string()))?;
    if !resolved.starts_with(&root) || resolved == root {
        return Err(PackLocationError::Outside {
            path: path.display().to_string(),
            packs_dir: root.display().to_string(),
        });
    }
    if !resolved.join("pack.yaml").is_file() {
        return Err(PackLocationError::NotFound(path.display().to_string()));
    }
    Ok(resolved)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackLocationError {
    #[error("the packs directory {0} (ATTUNE_PACKS_DIR) cannot be read: {1}")]
    NoPacksDir(String, String),
    #[error("no pack at '{0}' (a directory with a pack.yaml)")]
    NotFound(String),
    #[error(
        "'{path}' is not under the packs directory {packs_dir} (ATTUNE_PACKS_DIR), once symbolic links are followed: packs are registered only from there"
    )]
    Outside { path: String, packs_dir: String },
}

/// Loads and validates the pack in `dir`. Every file it reads, and every entrypoint, must lie
/// inside the pack directory once symbolic links are followed.
pub fn load_pack(dir: &Path) -> Result<LoadedPack, PackError> {
    let root = std::fs::canonicalize(dir).map_err(|e| PackError::new(dir, None, format!("cannot read: {e}")))?;
    let manifest_file = dir.join("pack.yaml");
    let manifest = parse_manifest(&manifest_file, &read(&root, &manifest_file)?)?;
    let mut actions: Vec<LoadedAction> = Vec::new();
    for file in yaml_files(&dir.join("actions"))? {
        let spec = parse_action(dir, &file, &read(&root, &file)?, |path| {
            std::fs::canonicalize(path).is_ok_and(|resolved| resolved.starts_with(&root) && resolved.is_file())
        })?;
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
    let mut workflows: Vec<LoadedWorkflow> = Vec::new();
    for file in yaml_files(&dir.join("workflows"))? {
        let spec = attune_core::workflow::parse(&file, &read(&root, &file)?)?;
        let workflow_ref = format!("{}.{}", manifest.pack_ref, spec.name);
        if actions.iter().any(|a| a.action_ref == workflow_ref)
            || workflows.iter().any(|w| w.workflow_ref == workflow_ref)
        {
            return Err(PackError::new(
                &file,
                Some("name"),
                format!("'{workflow_ref}' names an action or workflow already"),
            ));
        }
        for (name, param) in &spec.input {
            if param.secret {
                return Err(PackError::new(
                    &file,
                    Some(&format!("input.{name}.secret")),
                    "a workflow's input is not sealed for its steps: pass a stored secret's reference ({\"$secret\": NAME}) \
                     to a step's secret parameter instead",
                ));
            }
        }
        workflows.push(LoadedWorkflow { workflow_ref, file, spec });
    }
    let mut webhooks: Vec<attune_core::rules::WebhookSpec> = Vec::new();
    for file in yaml_files(&dir.join("webhooks"))? {
        let spec = attune_core::rules::parse_webhook(&file, &read(&root, &file)?)?;
        if webhooks.iter().any(|w| w.name == spec.name) {
            return Err(PackError::new(&file, Some("name"), format!("duplicate webhook '{}'", spec.name)));
        }
        webhooks.push(spec);
    }
    let mut rules: Vec<attune_core::pack::LoadedRule> = Vec::new();
    for file in yaml_files(&dir.join("rules"))? {
        let spec = attune_core::rules::parse_rule(&file, &read(&root, &file)?)?;
        let rule_ref = format!("{}.{}", manifest.pack_ref, spec.name);
        if rules.iter().any(|r| r.rule_ref == rule_ref) {
            return Err(PackError::new(&file, Some("name"), format!("duplicate rule '{rule_ref}'")));
        }
        rules.push(attune_core::pack::LoadedRule { rule_ref, file, spec });
    }
    Ok(LoadedPack { manifest, path: dir.to_path_buf(), actions, workflows, webhooks, rules })
}

/// The `.yaml`/`.yml` files of `dir`, sorted; none if it does not exist.
fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, PackError> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(PackError::new(dir, None, format!("cannot read: {e}"))),
    };
    files.sort();
    Ok(files)
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
    fn every_pack_of_the_repository_loads() {
        let packs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packs");
        let mut loaded = Vec::new();
        for entry in std::fs::read_dir(&packs).unwrap() {
            let dir = entry.unwrap().path();
            if dir.join("pack.yaml").is_file() {
                let pack = load_pack(&dir).unwrap_or_else(|e| panic!("{e}"));
                loaded.push((pack.manifest.pack_ref, pack.actions.len() + pack.workflows.len()));
            }
        }
        loaded.sort();
        let refs: Vec<&str> = loaded.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(refs, ["bench", "core", "examples"], "{loaded:?}");
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
