//! Instances of one fleet: real `serve` processes (each with its own data directory and its
//! own allowed root) on one registry, allowed the same shared store root, as the fleet tests
//! (`control_plane`, `forward_routes`, `failover`, `drain`, …) run them; and the [`Fleet`]
//! they share.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use tonic::transport::Channel;

use super::binary::Running;
use super::postgres::{self, Database};
use super::served;

/// What the instances of one fleet test share: a database of the test's own on the test
/// PostgreSQL (the registry), and a temp directory holding the store root every instance is
/// allowed (`stores/`, left to the test to fill) and a bucket directory (`bucket/`, created).
pub struct Fleet {
    pub db: Database,
    _tmp: tempfile::TempDir,
    /// The (canonical) temp directory.
    pub base: PathBuf,
    pub shared_root: PathBuf,
    pub bucket: PathBuf,
}

impl Fleet {
    /// The fleet of the test `name`; `None` without a PostgreSQL (see [`postgres::server`]:
    /// the test then skips, or fails under `CI=true`).
    pub async fn create(name: &str) -> Option<Fleet> {
        let db = Database::create(&postgres::server()?, name).await;
        let tmp = tempfile::tempdir().expect("temp dir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
        let bucket = base.join("bucket");
        std::fs::create_dir_all(&bucket).unwrap();
        Some(Fleet {
            db,
            _tmp: tmp,
            shared_root: base.join("stores"),
            bucket,
            base,
        })
    }

    /// [`Instance::start`] of the instance `id` of this fleet, with `extra` arguments.
    pub fn start(&self, id: &str, extra: &[&str]) -> Instance {
        Instance::start(id, &self.db.url, &self.shared_root, extra)
    }
}

/// The settings of a member of the failover group `g` that is quick to test: fast steps (WAL
/// every 50 ms, a restore point every 100 ms), and a silence limit and lease TTL of `ms`.
pub const fn group_member(ms: &'static str) -> [&'static str; 10] {
    [
        "--wal-interval-ms",
        "50",
        "--restore-point-interval-ms",
        "100",
        "--failover-group",
        "g",
        "--owner-silent-after-ms",
        ms,
        "--lease-ttl-ms",
        ms,
    ]
}

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

    /// The root only this instance is allowed (beside the shared one).
    pub fn root(&self) -> &Path {
        &self.dirs.root
    }

    /// Registers `req` through this instance (a failure fails the test with its output).
    pub async fn register(&self, req: proto::RegisterRequest) -> proto::RegisterResponse {
        self.client()
            .await
            .register(req)
            .await
            .unwrap_or_else(|e| self.child.fail(&format!("Register: {e}")))
            .into_inner()
    }

    /// A store of `commits` commits written into `root()/<name>`, which only this instance
    /// sees, registered through it with the destination `bucket/<name>`: its store id.
    pub async fn register_own_store(&self, name: &str, commits: u64, bucket: &Path) -> String {
        let dir = self.root().join(name);
        super::binary::write_store(&dir, commits);
        let destination = super::file_url(&bucket.join(name));
        self.register(super::register_req(&dir, &destination))
            .await
            .store_id
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
