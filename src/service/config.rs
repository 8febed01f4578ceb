//! The service's resolved configuration (the CLI merges flags, `MUSHROOMDB_BACKUP_*`
//! variables and the TOML file into it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Operator calls need this bearer token when set. Never logged.
    pub admin_token: Option<String>,
    /// Allow a non-loopback listener without TLS and an admin token.
    pub insecure: bool,
    pub instance_id: String,
    /// Defaults of every store's worker (a store's options override them).
    pub worker: WorkerConfig,
    pub lease_ttl: Duration,
    /// How often this instance persists its stores' health to the registry.
    pub health_report_interval: Duration,
    /// A store whose owning instance has not reported for this long shows unhealthy.
    pub owner_silent_after: Duration,
}

impl ServiceConfig {
    /// Refuses a configuration that would expose the control plane unprotected.
    pub fn check(&self) -> Result<(), String> {
        if !self.listen.ip().is_loopback()
            && !self.insecure
            && (self.tls.is_none() || self.admin_token.is_none())
        {
            return Err(format!(
                "refusing to listen on {} (not loopback) without TLS (--tls-cert/--tls-key) and an admin token \
                 (MUSHROOMDB_BACKUP_ADMIN_TOKEN); pass --insecure to do it anyway",
                self.listen
            ));
        }
        if self.allow_roots.is_empty() {
            return Err("no allowed root: stores could not be registered anywhere".into());
        }
        Ok(())
    }
}
