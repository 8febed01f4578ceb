//! The `serve` binary on 127.0.0.1:0 for tests that talk to it over real gRPC: its directories,
//! the command (SQLite by default, or a given registry URL), and a client.
//!
//! S3 destinations point at a closed port: tests that register them need only the control
//! plane, and the workers' failing requests back off harmlessly.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::binary;

/// Generous: the machine running the tests may be busy.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The directories of one test: `base` (canonical), the allowed store root `base/stores` and
/// `base/buckets` for `file://` destinations. Each instance has its data dir `base/<name>`.
pub struct Dirs {
    _tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub root: PathBuf,
    pub buckets: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let root = base.join("stores");
    let buckets = base.join("buckets");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&buckets).unwrap();
    Dirs {
        _tmp: tmp,
        base,
        root,
        buckets,
    }
}

impl Dirs {
    /// `file://` URL of `buckets/<name>`.
    pub fn bucket(&self, name: &str) -> String {
        format!("file://{}", self.buckets.join(name).display())
    }

    /// The path under the store root, as a string.
    pub fn store(&self, name: &str) -> String {
        self.root.join(name).display().to_string()
    }

    /// The SQLite registry URL of the instance whose data dir is `base/<data>`.
    pub fn sqlite_registry(&self, data: &str) -> String {
        format!("sqlite://{}/registry.db", self.base.join(data).display())
    }
}

/// `serve` with data dir `base/<data>`, instance id `<data>`, the store root of `d`, the
/// registry `registry` (None: its own SQLite), and `extra` arguments; no admin token.
pub fn serve_command(d: &Dirs, data: &str, registry: Option<&str>, extra: &[&str]) -> Command {
    let mut cmd = binary::command("http://127.0.0.1:1");
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(d.base.join(data))
        .arg("--allow-root")
        .arg(&d.root)
        .args(["--instance-id", data])
        .args(extra)
        .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN")
        .env_remove("MUSHROOMDB_BACKUP_CONFIG")
        .env_remove("MUSHROOMDB_BACKUP_REGISTRY")
        .env_remove("MUSHROOMDB_BACKUP_ALLOW_DESTINATION_ROOTS")
        .env_remove("MUSHROOMDB_BACKUP_METRICS_LISTEN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if let Some(url) = registry {
        cmd.args(["--registry", url]);
    }
    cmd
}

/// A running `serve` and its gRPC address ([`super::serve::Serve`], started by
/// [`serve_command`]'s command).
pub type Server = super::serve::Serve;
