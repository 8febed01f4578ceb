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

pub use super::server_limits::Limits;
use crate::worker::WorkerConfig;

#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Resolved (canonical) directories under which stores may be registered.
    pub allow_roots: Vec<PathBuf>,
    /// Resolved directories under which `file://` destinations must lie; empty: anywhere but
    /// an allowed root or the data directory.
    pub allow_destination_roots: Vec<PathBuf>,
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
        if self.allow_roots.is_empty() {
            return Err("no allowed root: stores could not be registered anywhere".into());
        }
        self.limits.check()
    }
}

/// Whether a token is empty once surrounding whitespace is removed.
pub fn blank(token: &str) -> bool {
    token.trim().is_empty()
}
