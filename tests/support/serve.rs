//! The `serve` binary on 127.0.0.1:0 for gRPC tests: its address from the listening line it
//! prints, its output captured ([`Running`]), killed when dropped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use tonic::transport::Channel;

use super::binary::{self, Running};

/// Generous: the machine running the tests may be busy.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// `serve` with its data dir `data`, the allowed root `root`, fast intervals (50 ms WAL ticks,
/// a 3 s lease) and `extra` arguments; no admin token, nothing from the environment's service
/// settings.
pub fn command(data: &Path, root: &Path, extra: &[&str]) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .arg("--allow-root")
        .arg(root)
        .args([
            "--wal-interval-ms",
            "50",
            "--restore-point-interval-ms",
            "3600000",
            "--lease-ttl-ms",
            "3000",
        ])
        .args(extra)
        .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN")
        .env_remove("MUSHROOMDB_BACKUP_CONFIG")
        .env_remove("MUSHROOMDB_BACKUP_REGISTRY")
        .env_remove("MUSHROOMDB_BACKUP_INSTANCE_ID")
        .env_remove("MUSHROOMDB_BACKUP_METRICS_LISTEN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    cmd
}

/// A running `serve`.
pub struct Serve {
    pub child: Running,
    pub addr: String,
}

impl Serve {
    /// Spawns `cmd` and waits for its listening line.
    pub fn start(name: &str, cmd: Command) -> Serve {
        let mut child = Running::spawn(name, cmd);
        let addr = tokio::task::block_in_place(|| {
            child.wait_for(
                "print its listening line",
                DEADLINE,
                binary::Line::listening,
            )
        });
        Serve { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> BackupControlClient<Channel> {
        BackupControlClient::connect(self.url())
            .await
            .unwrap_or_else(|e| self.child.fail(&format!("cannot connect: {e}")))
    }

    /// SIGTERM, then a clean exit within [`DEADLINE`].
    pub fn terminate(mut self) {
        self.child.signal(libc::SIGTERM);
        let status = tokio::task::block_in_place(|| self.child.wait_exit(DEADLINE));
        if !status.success() {
            self.child
                .fail(&format!("exited with {status} after SIGTERM"));
        }
    }
}
