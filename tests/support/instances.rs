//! Instances of one fleet: real `serve` processes (each with its own data directory) on one
//! registry, allowed the same store root, as `tests/control_plane.rs` and
//! `tests/forward_routes.rs` run them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use tonic::transport::Channel;

use super::binary::Running;
use super::served;

/// One instance: its process, address and directories.
pub struct Instance {
    pub child: Running,
    pub addr: SocketAddr,
    id: String,
    registry: String,
    shared_root: PathBuf,
    extra: Vec<String>,
    dirs: served::Dirs,
    peer_token: bool,
}

impl Instance {
    /// `serve --instance-id id --registry registry --allow-root shared_root extra…`, with the
    /// fleet's peer token ([`served::with_peer_token`]).
    pub fn start(id: &str, registry: &str, shared_root: &Path, extra: &[&str]) -> Instance {
        Instance::start_with(id, registry, shared_root, extra, true)
    }

    /// [`Instance::start`], with the fleet's peer token or without any.
    pub fn start_with(
        id: &str,
        registry: &str,
        shared_root: &Path,
        extra: &[&str],
        peer_token: bool,
    ) -> Instance {
        let dirs = served::dirs();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (child, addr) = spawn(id, registry, shared_root, &extra, &dirs, None, peer_token);
        Instance {
            peer_token,
            child,
            addr,
            id: id.to_string(),
            registry: registry.to_string(),
            shared_root: shared_root.to_path_buf(),
            extra,
            dirs,
        }
    }

    /// SIGTERM, and a clean exit.
    pub fn stop(&mut self) {
        served::terminate(&mut self.child);
    }

    /// The same instance again, after [`Instance::stop`], on the same data directory:
    /// listening where it did when `same_address` (the port it freed), else anywhere.
    pub fn start_again(&mut self, same_address: bool) {
        let at = same_address.then_some(self.addr);
        let (child, addr) = spawn(
            &self.id,
            &self.registry,
            &self.shared_root,
            &self.extra,
            &self.dirs,
            at,
            self.peer_token,
        );
        self.child = child;
        self.addr = addr;
    }

    pub async fn client(&self) -> BackupControlClient<Channel> {
        BackupControlClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap_or_else(|e| self.child.fail(&format!("cannot be connected to: {e}")))
    }
}

fn spawn(
    id: &str,
    registry: &str,
    shared_root: &Path,
    extra: &[String],
    dirs: &served::Dirs,
    listen: Option<SocketAddr>,
    peer_token: bool,
) -> (Running, SocketAddr) {
    let mut cmd = served::command(dirs);
    if peer_token {
        served::with_peer_token(&mut cmd, dirs);
    }
    cmd.arg("--allow-root")
        .arg(shared_root)
        .args(["--registry", registry, "--instance-id", id])
        .args(["--health-report-interval-ms", "300"])
        .args(extra);
    if let Some(at) = listen {
        cmd.args(["--listen", &at.to_string()]);
    }
    served::start(&format!("serve {id}"), cmd)
}
