//! The service's resolved configuration (the CLI merges flags, `MUSHROOMDB_BACKUP_*`
//! variables and the TOML file into it).
//!
//! Who may call operator calls is decided here, before anything listens ([`ServiceConfig::check`]):
//! an admin token, when configured, is never blank; a non-loopback listener needs TLS unless
//! `insecure`, and an admin token unless `no_operator_auth` says, separately and explicitly,
//! that operator calls are open to whoever can connect. `insecure` waives TLS only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub mod limits;
pub mod peers;

use crate::worker::WorkerConfig;
pub use limits::{DrillLimits, EventRetention, Limits, PauseLimits};
pub use peers::PeerToken;

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// How the other instances sharing the registry reach this one (see `forward.rs`).
#[derive(Debug, Clone, Default)]
pub struct PeerSettings {
    /// `HOST:PORT` the others forward calls to; `None`: the listen address, unless it is a
    /// wildcard (then this instance cannot be forwarded to, and says so at start).
    pub advertise_address: Option<String>,
    /// The failover group this instance belongs to; `None`: none.
    pub failover_group: Option<String>,
    /// The CA that signed the other instances' TLS certificates; `None`: `tls.client_ca`.
    pub peer_ca: Option<PathBuf>,
    /// How long a store's owner read from the registry is used to forward calls for it
    /// (`owner_cache.rs`); `None`: one second; zero: every forwarded call reads the registry.
    pub owner_cache: Option<Duration>,
    /// The token the fleet's instances share to call each other (`--peer-token-file`,
    /// `peer_auth.rs`); `None`: none (an instance with an admin token then forwards nothing).
    pub token: Option<PeerToken>,
}

/// The longest `--owner-cache-ms`.
pub const MAX_OWNER_CACHE: Duration = Duration::from_secs(60);

impl PeerSettings {
    fn check(&self) -> Result<(), String> {
        if let Some(a) = &self.advertise_address {
            peers::check_advertise_address(a)
                .map_err(|why| format!("--advertise-address {a:?}: {why}"))?;
        }
        if let Some(t) = self.owner_cache
            && t > MAX_OWNER_CACHE
        {
            return Err(format!(
                "--owner-cache-ms {}: at most {} (an owner change may route a call wrongly \
                 once; a stale owner beyond a minute only costs registry reads saved)",
                t.as_millis(),
                MAX_OWNER_CACHE.as_millis()
            ));
        }
        if let Some(g) = &self.failover_group {
            let ok = (1..=64).contains(&g.len())
                && g.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
            if !ok {
                return Err(format!(
                    "--failover-group {g:?}: 1 to 64 of A-Z, a-z, 0-9, '-', '_' and '.'"
                ));
            }
        }
        Ok(())
    }
}

/// `Debug` shows whether an admin token is set, never the token, and the registry URL
/// without its password.
#[derive(Clone)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Resolved (canonical) directories under which stores may be registered.
    pub allow_roots: Vec<PathBuf>,
    /// Resolved directories under which `file://` destinations must lie; empty: anywhere but
    /// an allowed root or the data directory.
    pub allow_destination_roots: Vec<PathBuf>,
    /// The endpoints an `s3://` destination sent over the API may name (normalised): the
    /// service's own (`AWS_ENDPOINT_URL`, when set) and each `--allow-endpoint`
    /// (`fleet::destination`).
    pub allow_endpoints: Vec<String>,
    pub registry_url: String,
    pub tls: Option<TlsFiles>,
    /// Operator calls need this bearer token when set; never blank. Never logged.
    pub admin_token: Option<String>,
    /// Allow a non-loopback listener without TLS (and nothing else: the admin token is still
    /// required there, see `no_operator_auth`).
    pub insecure: bool,
    /// Operator calls need no token even on a non-loopback listener: anyone who can connect
    /// may register, deregister and adopt stores. Only behind something that authenticates
    /// every caller (a mesh with mTLS and an authorization policy); logged loudly at start.
    pub no_operator_auth: bool,
    pub instance_id: String,
    /// Defaults of every store's worker (a store's options override them).
    pub worker: WorkerConfig,
    pub lease_ttl: Duration,
    /// How often this instance persists its stores' health to the registry.
    pub health_report_interval: Duration,
    /// A store whose owning instance has not reported for this long shows unhealthy.
    pub owner_silent_after: Duration,
    /// What one client may hold: streams, calls, deadlines.
    pub limits: Limits,
    /// A `Pause`'s default and longest deadline.
    pub pause: PauseLimits,
    /// How the other instances reach this one.
    pub peers: PeerSettings,
    /// The byte budget of scheduled restore drills.
    pub drill: DrillLimits,
    /// Where every event is POSTed as a CloudEvent (`serve --webhook-url`, `crate::events::webhook`).
    pub webhooks: Vec<crate::events::webhook::WebhookConfig>,
    /// How much of the fleet's event log is kept (`fleet::event_log`).
    pub event_retention: EventRetention,
    /// The price table of every store's cost estimate (`crate::cost`; the TOML's `[prices]`).
    pub prices: crate::cost::Prices,
    /// The throttle's limits: the instance's base, the schedule, the endpoints'
    /// (`serve --limit`, the TOML's `[limits]`; `crate::bucket::throttle`).
    pub throttle: crate::bucket::throttle::ThrottleSettings,
}

impl std::fmt::Debug for ServiceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            listen,
            data_dir,
            allow_roots,
            allow_destination_roots,
            allow_endpoints,
            registry_url,
            tls,
            admin_token,
            insecure,
            no_operator_auth,
            instance_id,
            worker,
            lease_ttl,
            health_report_interval,
            owner_silent_after,
            limits,
            pause,
            peers,
            drill,
            webhooks,
            event_retention,
            prices,
            throttle,
        } = self;
        f.debug_struct("ServiceConfig")
            .field("listen", listen)
            .field("data_dir", data_dir)
            .field("allow_roots", allow_roots)
            .field("allow_destination_roots", allow_destination_roots)
            .field("allow_endpoints", allow_endpoints)
            .field("registry_url", &crate::registry::redact_url(registry_url))
            .field("tls", tls)
            .field("admin_token", &admin_token.as_ref().map(|_| "<redacted>"))
            .field("insecure", insecure)
            .field("no_operator_auth", no_operator_auth)
            .field("instance_id", instance_id)
            .field("worker", worker)
            .field("lease_ttl", lease_ttl)
            .field("health_report_interval", health_report_interval)
            .field("owner_silent_after", owner_silent_after)
            .field("limits", limits)
            .field("pause", pause)
            .field("peers", peers)
            .field("drill", drill)
            .field(
                "webhooks",
                &webhooks.iter().map(|w| w.target.name()).collect::<Vec<_>>(),
            )
            .field("event_retention", event_retention)
            .field("prices", prices)
            .field("throttle", throttle)
            .finish()
    }
}

impl ServiceConfig {
    /// Refuses a configuration that would expose the control plane unprotected.
    pub fn check(&self) -> Result<(), String> {
        if self.admin_token.as_deref().is_some_and(blank) {
            return Err("the admin token is blank: it would let every operator call pass".into());
        }
        if self.no_operator_auth && self.admin_token.is_some() {
            return Err(
                "an admin token and no_operator_auth are both set: remove one of them".into(),
            );
        }
        if !self.listen.ip().is_loopback() {
            if self.tls.is_none() && !self.insecure {
                return Err(format!(
                    "refusing to listen on {} (not loopback) without TLS (--tls-cert/--tls-key); \
                     pass --insecure to listen in plaintext anyway",
                    self.listen
                ));
            }
            if self.admin_token.is_none() && !self.no_operator_auth {
                return Err(format!(
                    "refusing to listen on {} (not loopback) without an admin token \
                     (MUSHROOMDB_BACKUP_ADMIN_TOKEN or admin_token_file); --insecure waives TLS \
                     only: pass --no-operator-auth to open operator calls to anyone who can connect",
                    self.listen
                ));
            }
        }
        self.pause.check()?;
        self.peers.check()?;
        self.check_peer_token()?;
        self.check_silence()?;
        self.prices.check().map_err(|e| e.to_string())?;
        if self.allow_roots.is_empty() {
            return Err("no allowed root: stores could not be registered anywhere".into());
        }
        self.limits.check()
    }
}

impl ServiceConfig {
    /// The peer token is not the admin token (it would then pass as one), and over TLS this
    /// instance's id can be named in a certificate (`peer_auth.rs`).
    fn check_peer_token(&self) -> Result<(), String> {
        let Some(token) = &self.peers.token else {
            return Ok(());
        };
        if self.admin_token.as_deref() == Some(token.expose()) {
            return Err(
                "--peer-token-file holds the admin token: the peers' token must be another \
                 (a peer token is never accepted as the admin token)"
                    .into(),
            );
        }
        if self.tls.is_some() {
            peers::peer_server_name(&self.instance_id)
                .map_err(|why| format!("--instance-id: {why}"))?;
        }
        Ok(())
    }
}

/// How many heartbeats (`--health-report-interval-ms`) a member of a failover group must miss
/// at least before its group claims its stores (`--owner-silent-after-ms`).
pub const MIN_MISSED_HEARTBEATS: u32 = 3;

impl ServiceConfig {
    /// With a failover group, refuses a silence limit under [`MIN_MISSED_HEARTBEATS`]
    /// heartbeats: one late report (a pause of the process, a slow registry) would have a live
    /// owner's stores claimed from it.
    fn check_silence(&self) -> Result<(), String> {
        let least = self
            .health_report_interval
            .saturating_mul(MIN_MISSED_HEARTBEATS);
        if self.peers.failover_group.is_none() || self.owner_silent_after >= least {
            return Ok(());
        }
        Err(format!(
            "--owner-silent-after-ms {} is under {MIN_MISSED_HEARTBEATS} x \
             --health-report-interval-ms {}: with --failover-group an owner must miss \
             {MIN_MISSED_HEARTBEATS} heartbeats before its group claims its stores, or a live \
             owner's stores are claimed after one late report; raise --owner-silent-after-ms to \
             at least {} or lower --health-report-interval-ms",
            self.owner_silent_after.as_millis(),
            self.health_report_interval.as_millis(),
            least.as_millis(),
        ))
    }
}

/// Whether a token is empty once surrounding whitespace is removed.
pub fn blank(token: &str) -> bool {
    token.trim().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ServiceConfig {
        ServiceConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: PathBuf::from("/d"),
            allow_roots: vec![],
            allow_destination_roots: vec![],
            allow_endpoints: vec![],
            registry_url: "postgres://backup:hunter2@db/registry".into(),
            tls: None,
            admin_token: Some("s3cret-t0ken".into()),
            insecure: false,
            no_operator_auth: false,
            instance_id: "i".into(),
            worker: WorkerConfig::default(),
            lease_ttl: Duration::from_secs(30),
            health_report_interval: Duration::from_secs(3),
            owner_silent_after: Duration::from_secs(15),
            limits: Limits::default(),
            pause: Default::default(),
            peers: Default::default(),
            drill: Default::default(),
            webhooks: vec![],
            event_retention: Default::default(),
            prices: Default::default(),
            throttle: Default::default(),
        }
    }

    #[test]
    fn debug_shows_no_secret() {
        let config = sample();
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret-t0ken"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn a_failover_group_needs_a_silence_limit_of_three_heartbeats() {
        let grouped = |silent_ms: u64, report_ms: u64, group: bool| ServiceConfig {
            allow_roots: vec![PathBuf::from("/r")],
            owner_silent_after: Duration::from_millis(silent_ms),
            health_report_interval: Duration::from_millis(report_ms),
            peers: PeerSettings {
                failover_group: group.then(|| "g".to_string()),
                ..Default::default()
            },
            ..sample()
        };
        let refused = grouped(899, 300, true).check().unwrap_err();
        for says in [
            "--owner-silent-after-ms 899",
            "--health-report-interval-ms 300",
            "at least 900",
        ] {
            assert!(refused.contains(says), "{refused}");
        }
        assert_eq!(grouped(900, 300, true).check(), Ok(()));
        // No group, no claims: the limit only marks stores unhealthy.
        assert_eq!(grouped(100, 300, false).check(), Ok(()));
    }
}
