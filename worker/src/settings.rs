//! The worker's settings (`Settings`, read from the environment) and what follows from them: its
//! lease, its slots and look-ahead, and the user ids its actions run as.

use std::path::PathBuf;
use std::time::Duration;

use attune_common::config::{CommonSettings, ConfigError, FromEnv, Source, read, read_optional};
use attune_core::health::HealthThresholds;
use attune_core::selection;

use crate::destination::{ALLOW_SETTING, AllowList};

#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub health: HealthThresholds,
    /// `ATTUNE_WORKER_NAME`; unique per worker (default, also when empty: host name and process
    /// id).
    pub name: String,
    /// `ATTUNE_WORKER_RUNTIMES`, comma separated (default `shell,python,builtin,http`).
    pub runtimes: Vec<String>,
    /// `ATTUNE_WORKER_CONCURRENCY`: actions run at once (default 4).
    pub concurrency: u16,
    /// `ATTUNE_WORKER_PREFETCH`: the most dispatches taken ahead of the running ones, delivered
    /// and held until a run slot is free (default 16; fewer for slow actions, see
    /// `selection::lookahead`). The worker's slots are concurrency plus the look-ahead.
    pub prefetch: u16,
    /// `ATTUNE_HEARTBEAT_INTERVAL_SECS` (default 10, well under the 30 s staleness limit).
    pub heartbeat_interval: Duration,
    /// `ATTUNE_WORKER_QUEUE_TTL_SECS` (default 300).
    pub queue_ttl: Duration,
    /// `ATTUNE_WORKER_DRAIN_SECS`: how long running actions may finish after a shutdown request
    /// before they are killed and reported as `worker_unavailable` (default 30).
    pub drain: Duration,
    /// `ATTUNE_WORKER_OUTPUT_LIMIT_BYTES`: stdout and stderr kept per execution (default 65536).
    pub output_limit: usize,
    /// `ATTUNE_WORKER_HEALTH_OVERRIDE_FILE`: a JSON file whose fields replace the reported health
    /// counters (to drain a worker, or to force its health in tests).
    pub health_override_file: Option<PathBuf>,
    /// `ATTUNE_WORKER_CANCEL_CHECK_SECS`: how often the worker looks in the database for
    /// cancellations of what it runs (default 2).
    pub cancel_check: Duration,
    /// `ATTUNE_HEALTH_WINDOW_SECS`: the window its failure rate is measured over (default 600).
    pub health_window_secs: i64,
    /// `ATTUNE_WORKER_HTTP_ALLOW`: the networks http actions may reach besides global addresses,
    /// comma-separated CIDRs (default none: loopback, private and other non-global destinations
    /// are refused; see `destination`).
    pub http_allow: AllowList,
    /// `ATTUNE_SECRETS_KEY_FILE`: opens the secrets an execution's parameters refer to and its
    /// secret parameters (`attune_common::secrets`); without it such executions fail as
    /// `invalid_parameters`.
    pub sealer: Option<attune_common::secrets::Sealer>,
    /// `ATTUNE_WORKER_ACTION_UIDS`: the user ids process actions run as, one of its own per
    /// running action (`runner::ActionUsers`); by default `DEFAULT_ACTION_UIDS` when the worker
    /// runs as root, and none (the worker's own user) otherwise or with `off`.
    pub action_uids: Option<std::ops::RangeInclusive<u32>>,
    /// `ATTUNE_ACTION_PROCESSES`: the most processes of an action run as a user of its own
    /// (`RLIMIT_NPROC`, per user: the run's alone; default 256).
    pub action_processes: u64,
    /// `ATTUNE_ACTION_FILE_SIZE_MB`: the largest file an action run as a user of its own may
    /// write (`RLIMIT_FSIZE`, default 1024 MiB).
    pub action_file_size_mb: u64,
    /// The program that supervises each action (`supervise`): the worker's own binary, set by
    /// `attune-worker`; `None` runs actions directly (their process group still dies with a
    /// timeout or a cancel, but not with the worker).
    pub supervisor: Option<PathBuf>,
}

impl Settings {
    pub fn from_env() -> Result<Self, ConfigError> {
        <Self as FromEnv>::from_env()
    }
}

impl FromEnv for Settings {
    fn from_source(source: &dyn Source) -> Result<Self, ConfigError> {
        let default_name = format!(
            "{}-{}",
            std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "worker".into()),
            std::process::id()
        );
        let runtimes: String = read(source, "ATTUNE_WORKER_RUNTIMES")?;
        let settings = Settings {
            common: CommonSettings::from_source(source)?,
            health: HealthThresholds::from_source(source)?,
            name: read_optional(source, "ATTUNE_WORKER_NAME")
                .map(|name| name.trim().to_string())
                .unwrap_or(default_name),
            runtimes: runtimes.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect(),
            concurrency: read::<u16>(source, "ATTUNE_WORKER_CONCURRENCY")?.max(1),
            prefetch: read(source, "ATTUNE_WORKER_PREFETCH")?,
            heartbeat_interval: Duration::from_secs_f64(read(source, "ATTUNE_HEARTBEAT_INTERVAL_SECS")?),
            queue_ttl: Duration::from_secs(read(source, "ATTUNE_WORKER_QUEUE_TTL_SECS")?),
            drain: Duration::from_secs(read(source, "ATTUNE_WORKER_DRAIN_SECS")?),
            output_limit: read(source, "ATTUNE_WORKER_OUTPUT_LIMIT_BYTES")?,
            health_override_file: read_optional(source, "ATTUNE_WORKER_HEALTH_OVERRIDE_FILE").map(PathBuf::from),
            cancel_check: Duration::from_secs_f64(read(source, "ATTUNE_WORKER_CANCEL_CHECK_SECS")?),
            health_window_secs: read(source, "ATTUNE_HEALTH_WINDOW_SECS")?,
            http_allow: match read_optional(source, ALLOW_SETTING) {
                None => AllowList::default(),
                Some(text) => AllowList::parse(&text).map_err(|(entry, reason)| ConfigError {
                    name: ALLOW_SETTING.into(),
                    value: entry,
                    reason: format!(
                        "{reason}; the setting is a comma-separated list of CIDRs such as 127.0.0.1/32,10.0.0.0/8"
                    ),
                })?,
            },
            sealer: attune_common::secrets::Sealer::from_source(source)?,
            action_uids: action_uids(source, running_as_root())?,
            action_processes: at_least_one(source, ACTION_PROCESSES)?,
            action_file_size_mb: at_least_one(source, ACTION_FILE_SIZE_MB)?,
            supervisor: None,
        };
        let lease = settings.lease();
        if settings.heartbeat_interval >= lease {
            return Err(ConfigError {
                name: "ATTUNE_HEARTBEAT_INTERVAL_SECS".into(),
                value: format!("{}", settings.heartbeat_interval.as_secs_f64()),
                reason: format!(
                    "a worker stops its runs when it has not heartbeaten for {:.2} s (its lease, from \
                     ATTUNE_HEARTBEAT_MAX_AGE_SECS = {}): heartbeats must come more often than that",
                    lease.as_secs_f64(),
                    settings.health.heartbeat_max_age_secs
                ),
            });
        }
        Ok(settings)
    }
}

impl Settings {
    /// How long after the start of its last heartbeat that landed the worker may go on running
    /// actions (docs/adr/0008-a-worker-holds-a-lease-on-its-runs.md): the heartbeat age after
    /// which executors take a worker for dead, less a quarter of it (at least a second) for the
    /// runs to be stopped. Executors measure that age from the heartbeat's time in the database,
    /// which is never earlier than the start of the call.
    pub fn lease(&self) -> Duration {
        attune_common::fence::lease(self.health.heartbeat_max_age())
    }

    /// The limits of an action run as a user of its own (`action_users`).
    pub fn action_limits(&self) -> crate::runner::UserLimits {
        crate::runner::UserLimits {
            processes: self.action_processes,
            file_size_bytes: self.action_file_size_mb.saturating_mul(1 << 20),
        }
    }

    /// The most executions this worker takes at once, started or not.
    pub fn max_slots(&self) -> u16 {
        self.concurrency.saturating_add(self.prefetch)
    }

    /// Dispatches taken ahead now, given the recent execution time.
    pub fn lookahead(&self, recent_duration_ms: Option<f64>) -> u16 {
        selection::lookahead(self.concurrency, self.prefetch, recent_duration_ms, self.queue_ttl)
    }
}

/// The user ids actions run as when the worker runs as root and `ATTUNE_WORKER_ACTION_UIDS` is
/// not set: a range no account uses on a usual system (below 2^31).
pub const DEFAULT_ACTION_UIDS: std::ops::RangeInclusive<u32> = 1_900_000_000..=1_900_065_535;
pub(crate) const ACTION_UIDS: &str = "ATTUNE_WORKER_ACTION_UIDS";
const ACTION_PROCESSES: &str = "ATTUNE_ACTION_PROCESSES";
const ACTION_FILE_SIZE_MB: &str = "ATTUNE_ACTION_FILE_SIZE_MB";

/// A count setting that must be 1 or more (0 would let an action start nothing, or write
/// nothing).
fn at_least_one(source: &dyn Source, name: &str) -> Result<u64, ConfigError> {
    let value: u64 = read(source, name)?;
    if value == 0 {
        return Err(ConfigError { name: name.into(), value: "0".into(), reason: "expected 1 or more".into() });
    }
    Ok(value)
}

#[allow(unsafe_code)]
pub(crate) fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail
    unsafe { libc::geteuid() == 0 }
}

/// `ATTUNE_WORKER_ACTION_UIDS`: `off`, `<first>-<last>` (root only), or unset (the default range
/// as root, none otherwise).
pub(crate) fn action_uids(
    source: &dyn Source,
    root: bool,
) -> Result<Option<std::ops::RangeInclusive<u32>>, ConfigError> {
    let Some(text) = read_optional(source, ACTION_UIDS) else {
        return Ok(root.then_some(DEFAULT_ACTION_UIDS));
    };
    let error = |reason: &str| ConfigError { name: ACTION_UIDS.into(), value: text.clone(), reason: reason.into() };
    if text.trim() == "off" {
        return Ok(None);
    }
    let range = text
        .trim()
        .split_once('-')
        .and_then(|(first, last)| Some(first.trim().parse::<u32>().ok()?..=last.trim().parse::<u32>().ok()?))
        .filter(|range| *range.start() > 0 && range.start() <= range.end())
        .ok_or_else(|| error("expected `off` or a range of user ids, `<first>-<last>` (first at least 1)"))?;
    if !root {
        return Err(error("running actions as other users needs the worker to run as root; set `off`"));
    }
    Ok(Some(range))
}

#[cfg(test)]
mod settings_tests {
    use super::*;
    use attune_common::config::Defaults;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let s = Settings::from_source(&Defaults).unwrap();
        assert_eq!(s.runtimes, ["shell", "python", "builtin", "http"]);
        assert_eq!((s.concurrency, s.prefetch, s.output_limit), (4, 16, 65536));
        assert_eq!(
            (s.heartbeat_interval, s.queue_ttl, s.drain),
            (Duration::from_secs(10), Duration::from_secs(300), Duration::from_secs(30))
        );
        assert!(s.name.ends_with(&format!("-{}", std::process::id())), "host name and pid: {}", s.name);
        assert_eq!(s.health_override_file, None);
        assert_eq!(s.http_allow, AllowList::default(), "http actions reach global addresses only");
    }

    #[test]
    fn actions_run_as_their_own_users_by_default_as_root_and_only_as_root() {
        use attune_common::settings::Vars;
        let none = Vars(&[]);
        assert_eq!(action_uids(&none, true).unwrap(), Some(DEFAULT_ACTION_UIDS));
        assert_eq!(action_uids(&none, false).unwrap(), None, "a worker that is not root runs them as itself");
        let off = Vars(&[(ACTION_UIDS, "off")]);
        assert_eq!(action_uids(&off, true).unwrap(), None);
        let range = Vars(&[(ACTION_UIDS, "70000-70009")]);
        assert_eq!(action_uids(&range, true).unwrap(), Some(70000..=70009));
        assert_eq!(action_uids(&range, false).unwrap_err().name, ACTION_UIDS, "a range needs root");
        for bad in ["0-10", "10-5", "x", "5", "-5"] {
            let vars: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(ACTION_UIDS, bad)]));
            assert_eq!(action_uids(&Vars(vars), true).unwrap_err().name, ACTION_UIDS, "{bad}");
        }
    }

    #[test]
    fn an_action_users_processes_and_file_size_default_and_a_bad_value_is_named() {
        use attune_common::settings::Vars;
        let defaults = Settings::from_source(&Defaults).unwrap();
        assert_eq!((defaults.action_processes, defaults.action_file_size_mb), (256, 1024));
        assert_eq!(defaults.action_limits(), crate::runner::UserLimits { processes: 256, file_size_bytes: 1 << 30 });
        let set = Settings::from_source(&Vars(&[(ACTION_PROCESSES, "16"), (ACTION_FILE_SIZE_MB, "1")])).unwrap();
        assert_eq!(set.action_limits(), crate::runner::UserLimits { processes: 16, file_size_bytes: 1 << 20 });
        for (name, bad) in [
            (ACTION_PROCESSES, "0"),
            (ACTION_PROCESSES, "many"),
            (ACTION_FILE_SIZE_MB, "0"),
            (ACTION_FILE_SIZE_MB, "-1"),
            (ACTION_FILE_SIZE_MB, "1.5"),
        ] {
            let vars: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(name, bad)]));
            let error = Settings::from_source(&Vars(vars)).unwrap_err();
            assert_eq!(error.name, name, "{bad}: {error}");
            assert!(error.to_string().contains(bad), "{error}");
        }
    }

    #[test]
    fn the_http_allow_list_is_read_and_a_bad_entry_is_named() {
        use attune_common::settings::Vars;
        let allowed = Settings::from_source(&Vars(&[("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32, ::1/128")])).unwrap();
        assert!(
            allowed.http_allow.admits("127.0.0.1".parse().unwrap())
                && allowed.http_allow.admits("::1".parse().unwrap())
        );
        assert!(!allowed.http_allow.admits("10.0.0.1".parse().unwrap()));
        let error =
            Settings::from_source(&Vars(&[("ATTUNE_WORKER_HTTP_ALLOW", "127.0.0.1/32,10.0.0.0/33")])).unwrap_err();
        assert!(
            error.to_string().starts_with("invalid value \"10.0.0.0/33\" for ATTUNE_WORKER_HTTP_ALLOW: "),
            "{error}"
        );
    }
}
