//! What the promotion tests (`promote_live`, `promote_partition`, `promote_soak`) share: a
//! primary `serve` backing a store up in `durability = sync` while the reference node commits
//! into it, both read while the test waits (so that no pipe fills), the death of its host, and
//! `promote` from its prefix.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto;

use super::binary::{self, Running};
use super::served::{self, DEADLINE};
use super::soak;

/// A `serve` of `d` on the S3 at `s3` (path-style), with the instance id `instance` and a
/// restore point every 500 ms, given the soak's key file if it has one.
pub fn serve(d: &served::Dirs, s3: &str, instance: &str) -> Command {
    let mut cmd = served::command(d);
    cmd.env("AWS_ENDPOINT_URL", s3)
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--instance-id", instance])
        .args(["--restore-point-interval-ms", "500"]);
    soak::keyed(cmd)
}

/// The directories of a round with a primary `serve` and a standby `serve`: `a`, the primary's,
/// with its store `dir` and the node's acked log `log`; `b`, the standby's, with `standby_dir`.
pub struct TwoServes {
    pub a: served::Dirs,
    pub b: served::Dirs,
    pub dir: PathBuf,
    pub standby_dir: PathBuf,
    pub log: PathBuf,
}

impl TwoServes {
    pub fn new() -> TwoServes {
        let (a, b) = (served::dirs(), served::dirs());
        let dir = a.root.join("primary");
        std::fs::create_dir_all(&dir).unwrap();
        let standby_dir = b.root.join("standby");
        std::fs::create_dir_all(&standby_dir).unwrap();
        let log = a.base.join("acked.log");
        TwoServes {
            a,
            b,
            dir,
            standby_dir,
            log,
        }
    }

    /// Round `round`'s primary: `serve` (of `a`) with `dir` registered to back up to `url`
    /// and the node committing at `rate`, once it has acknowledged `acks` commits.
    pub async fn primary(
        &self,
        round: u32,
        serve: Command,
        url: &str,
        rate: &str,
        acks: usize,
    ) -> SyncPrimary {
        let mut primary = SyncPrimary::start(
            (&format!("primary serve (round {round})"), serve),
            &format!("node (round {round})"),
            &self.dir,
            url,
            &self.log,
            rate,
        )
        .await;
        primary.wait_acked(
            &self.log,
            acks,
            &format!("no acknowledgement in round {round}"),
        );
        primary
    }
}

/// Reads both children's output until `until`, so that no pipe fills.
pub fn pump(a: &mut Running, b: &mut Running, until: Instant) {
    while Instant::now() < until {
        a.next_line(Instant::now() + Duration::from_millis(20));
        b.next_line(Instant::now() + Duration::from_millis(1));
    }
}

/// A `serve` (`srv`, at `addr`, `c` its client) with a store registered in sync durability
/// (`r`), and the reference node (`n`) committing into it.
pub struct SyncPrimary {
    pub srv: Running,
    pub addr: SocketAddr,
    pub c: served::Client,
    pub r: proto::RegisterResponse,
    pub n: Running,
}

impl SyncPrimary {
    /// Starts `serve` (named `name`), registers `dir` to back up to `url` in sync durability,
    /// and spawns the reference node (named `node`) committing into it at `rate` a second,
    /// every acknowledged commit in `log`.
    pub async fn start(
        (name, serve): (&str, Command),
        node: &str,
        dir: &Path,
        url: &str,
        log: &Path,
        rate: &str,
    ) -> SyncPrimary {
        let (srv, addr) = served::start(name, serve);
        let c = served::client(addr).await;
        let r = served::register_sync(&c, dir, url).await;
        let n = Running::spawn(
            node,
            served::sync_node(addr, dir, (&r.store_id, &r.node_token), log, rate),
        );
        SyncPrimary { srv, addr, c, r, n }
    }

    /// Reads node and `serve` until `log` holds at least `acks` acknowledged commits; panics
    /// saying `none` after [`DEADLINE`].
    pub fn wait_acked(&mut self, log: &Path, acks: usize, none: &str) {
        let deadline = Instant::now() + DEADLINE;
        while served::acked_log(log).len() < acks {
            assert!(Instant::now() < deadline, "{none}");
            self.pump_for(Duration::from_millis(50));
        }
    }

    /// Reads node and `serve` for `how_long`.
    pub fn pump_for(&mut self, how_long: Duration) {
        pump(&mut self.n, &mut self.srv, Instant::now() + how_long);
    }

    /// The host dies: `serve` and the node are SIGKILLed, and reaped. Returns when.
    pub fn kill(&mut self) -> Instant {
        self.srv.signal(libc::SIGKILL);
        self.n.signal(libc::SIGKILL);
        let killed = Instant::now();
        self.srv.wait_exit(Duration::from_secs(10));
        self.n.wait_exit(Duration::from_secs(10));
        killed
    }
}

/// `promote --from URL --dir DIR` with segments shipped every 100 ms.
pub fn promote(endpoint: &str, url: &str, dir: &Path) -> Command {
    let mut cmd = binary::command(endpoint);
    cmd.args(["promote", "--from", url, "--dir"])
        .arg(dir)
        .env("MUSHROOMDB_BACKUP_WAL_INTERVAL_MS", "100");
    cmd
}

/// The `promoted` object of the JSON line a running `promote` prints once it has promoted.
pub fn promoted(p: &mut Running) -> serde_json::Value {
    p.wait_for("promote", DEADLINE, |l| {
        let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
        v.get("promoted").cloned()
    })
}
