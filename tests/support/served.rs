//! `mushroom-backup serve` as a child of a test ([`super::binary::Running`]), configured by
//! the environment (`super::serve` is its twin configured by flags): on
//! 127.0.0.1:0 with a temp data dir, its SQLite registry and one allowed root, configured
//! only by what the test passes (every `MUSHROOMDB_BACKUP_*` variable of the test run is
//! removed). [`start`] waits for its `{"listening": …}` line; [`refused`] for it to fail.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use tonic::transport::Channel;

use super::binary::{self, Running, Stream};

/// A client of the service.
pub type Client = BackupControlClient<Channel>;

/// Generous: the machine running the tests may be busy.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The directories of one test's service.
pub struct Dirs {
    _tmp: tempfile::TempDir,
    /// The (canonical) temp directory holding the others.
    pub base: PathBuf,
    pub data: PathBuf,
    /// The allowed root (canonical).
    pub root: PathBuf,
}

pub fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let data = base.join("data");
    let root = base.join("stores");
    std::fs::create_dir_all(&root).unwrap();
    Dirs {
        _tmp: tmp,
        base,
        data,
        root,
    }
}

/// `serve --data-dir … --allow-root …` on 127.0.0.1:0 (by its variable: a `--listen` wins).
pub fn command(d: &Dirs) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("MUSHROOMDB_BACKUP_") && name != "MUSHROOMDB_BACKUP_LOG" {
            cmd.env_remove(name);
        }
    }
    cmd.env("MUSHROOMDB_BACKUP_LISTEN", "127.0.0.1:0")
        .args(["serve", "--data-dir"])
        .arg(&d.data)
        .arg("--allow-root")
        .arg(&d.root);
    cmd
}

/// Spawns `cmd` and waits for its listening line: the child and the address it listens on.
pub fn start(name: &str, cmd: Command) -> (Running, SocketAddr) {
    let mut child = Running::spawn(name, cmd);
    let addr = child.wait_for("print its listening line", DEADLINE, |line| {
        line.listening()?.parse().ok()
    });
    (child, addr)
}

/// Spawns `cmd`, which must fail to start: its stderr.
pub fn refused(name: &str, cmd: Command) -> String {
    let mut child = Running::spawn(name, cmd);
    let status = child.wait_exit(DEADLINE);
    if status.success() {
        child.fail("started (or exited 0), but should have refused to start");
    }
    stderr(&child)
}

/// Every line the child printed on stderr so far.
pub fn stderr(child: &Running) -> String {
    child
        .seen()
        .iter()
        .filter(|l| l.stream == Stream::Stderr)
        .map(|l| format!("{}\n", l.text))
        .collect()
}

/// Waits until the child has printed a line on stderr containing every one of `words`
/// (checking what it printed already first).
pub fn wait_logged(child: &mut Running, words: &[&str]) {
    let has = |text: &str| words.iter().all(|w| text.contains(w));
    if child
        .seen()
        .iter()
        .any(|l| l.stream == Stream::Stderr && has(&l.text))
    {
        return;
    }
    child.wait_for(&format!("log {words:?}"), DEADLINE, |l| {
        (l.stream == Stream::Stderr && has(&l.text)).then_some(())
    });
}

/// The token one test fleet's instances share to call each other (`serve --peer-token-file`).
pub const PEER_TOKEN: &str = "test-fleet-peer-token-0123456789";

/// Gives `cmd` the fleet's peer token: written 0600 into `d`, passed as `--peer-token-file`.
pub fn with_peer_token(cmd: &mut Command, d: &Dirs) {
    use std::os::unix::fs::PermissionsExt as _;
    let path = d.base.join("peer-token");
    std::fs::write(&path, format!("{PEER_TOKEN}\n")).expect("write the peer token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    cmd.arg("--peer-token-file").arg(path);
}

/// [`command`] with a fast worker (WAL every 50 ms, a restore point every 100 ms) and `extra`.
pub fn fast_serve(d: &Dirs, extra: &[&str]) -> Command {
    let mut cmd = command(d);
    cmd.args([
        "--wal-interval-ms",
        "50",
        "--restore-point-interval-ms",
        "100",
    ])
    .args(extra);
    cmd
}

/// A client of the service at `addr`.
pub async fn client(addr: SocketAddr) -> Client {
    BackupControlClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// Registers `dir` to back up to `url` in `durability = sync`, at most 20 WAL PUTs a second:
/// the answer (store id and node token).
pub async fn register_sync(c: &Client, dir: &Path, url: &str) -> proto::RegisterResponse {
    let mut req = super::register_req(dir, url);
    req.options = Some(proto::StoreOptions {
        durability: proto::Durability::Sync as i32,
        wal_puts_per_second: 20,
        ..Default::default()
    });
    c.clone()
        .register(req)
        .await
        .expect("Register")
        .into_inner()
}

/// Registers `req`: its store id.
pub async fn register(c: &Client, req: proto::RegisterRequest) -> String {
    c.clone()
        .register(req)
        .await
        .expect("Register")
        .into_inner()
        .store_id
}

/// Registers `req` with the store options `options`: its store id.
pub async fn register_with(
    c: &Client,
    mut req: proto::RegisterRequest,
    options: proto::StoreOptions,
) -> String {
    req.options = Some(options);
    register(c, req).await
}

/// Every store `c` lists (`ListStores`).
pub async fn list_stores(c: &Client) -> Vec<proto::StoreInfo> {
    c.clone()
        .list_stores(proto::ListStoresRequest {})
        .await
        .expect("ListStores")
        .into_inner()
        .stores
}

/// The health of store `id` (not fresh) as `c` answers it, the request made by `request`
/// (`tonic::Request::new`, or one carrying a token): exactly one store.
pub async fn health_of(
    c: &mut Client,
    id: &str,
    request: impl FnOnce(proto::HealthRequest) -> tonic::Request<proto::HealthRequest>,
) -> proto::StoreHealth {
    let r = c
        .health(request(proto::HealthRequest {
            store_id: id.into(),
            fresh: false,
        }))
        .await
        .expect("Health")
        .into_inner();
    assert_eq!(r.stores.len(), 1, "{r:?}");
    r.stores.into_iter().next().unwrap()
}

/// One `Health` of store `id` through `c` (`fresh`: the owner's own view, asked of it): the
/// store's record, or what is wrong (the call failed, or it did not name exactly that store).
pub async fn health(c: &Client, id: &str, fresh: bool) -> Result<proto::StoreHealth, String> {
    let r = c
        .clone()
        .health(proto::HealthRequest {
            store_id: id.into(),
            fresh,
        })
        .await
        .map_err(|e| format!("Health (fresh: {fresh}): {e}"))?
        .into_inner();
    match r.stores.as_slice() {
        [h] if h.store_id == id => Ok(h.clone()),
        _ => Err(format!("not one record of store {id}: {r:?}")),
    }
}

/// Waits until the store's health satisfies `ok`.
pub async fn wait_health(
    c: &Client,
    id: &str,
    what: &str,
    ok: impl Fn(&proto::StoreHealth) -> bool,
) -> proto::StoreHealth {
    wait_health_as(c, id, false, what, ok).await
}

/// Waits until the store's health, asked `fresh` or not ([`health`]), satisfies `ok`.
pub async fn wait_health_as(
    c: &Client,
    id: &str,
    fresh: bool,
    what: &str,
    ok: impl Fn(&proto::StoreHealth) -> bool,
) -> proto::StoreHealth {
    super::wait_for(DEADLINE, &format!("store {id}: {what}"), || {
        let ok = &ok;
        async move {
            let h = health(c, id, fresh).await?;
            if ok(&h) { Ok(h) } else { Err(format!("{h:?}")) }
        }
    })
    .await
}

/// `Pause` of store `id` for `reason`, until the server's default deadline.
pub async fn pause(c: &Client, id: &str, reason: &str) -> proto::PauseResponse {
    c.clone()
        .pause(proto::PauseRequest {
            store_id: id.into(),
            reason: reason.into(),
            until_unix_ms: 0,
        })
        .await
        .expect("Pause")
        .into_inner()
}

/// `Resume` of store `id`: whether it was paused.
pub async fn resume(c: &Client, id: &str) -> bool {
    c.clone()
        .resume(proto::ResumeRequest {
            store_id: id.into(),
        })
        .await
        .expect("Resume")
        .into_inner()
        .was_paused
}

/// `node`: writes `commits` commits into the store, reporting each position to the service.
pub fn node_writes(addr: SocketAddr, dir: &Path, id: &str, token: &str, commits: u64) {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.arg("node")
        .arg("--store")
        .arg(dir)
        .args(["--server", &format!("http://{addr}"), "--store-id", id])
        .args(["--commits", &commits.to_string()])
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", token);
    binary::run_ok("node", cmd, DEADLINE);
}

/// `ctl --server http://ADDR ARGS`, run to its end: whether it exited 0, and the finished
/// child (its stdout, its whole output).
pub fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, Running) {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["ctl", "--server", &format!("http://{addr}")])
        .args(args);
    let mut child = Running::spawn("ctl", cmd);
    let status = child.wait_exit(DEADLINE);
    (status.success(), child)
}

/// SIGTERM, and the exit, which must be 0.
pub fn terminate(child: &mut binary::Running) {
    child.signal(libc::SIGTERM);
    let status = child.wait_exit(DEADLINE);
    if !status.success() {
        child.fail(&format!("exited with {status} after SIGTERM, not 0"));
    }
}

/// The commit sequence numbers of the acked log. A torn last line (the kill came during its
/// write, before its fsync) was not acknowledged yet and is left out; any other line that is
/// not three numbers fails the test.
pub fn acked_log(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut seqs = Vec::with_capacity(lines.len());
    for (i, l) in lines.iter().enumerate() {
        let f: Vec<&str> = l.split(' ').collect();
        let parsed = (f.len() == 3)
            .then(|| {
                f.iter()
                    .map(|x| x.parse::<u64>().ok())
                    .collect::<Option<Vec<u64>>>()
            })
            .flatten();
        match parsed {
            Some(v) => seqs.push(v[0]),
            None if i + 1 == lines.len() && !complete => {}
            None => panic!(
                "line {} of the acked log is not three numbers: {l:?}",
                i + 1
            ),
        }
    }
    seqs
}

/// The reference node committing into `dir` at `rate` a second in `durability = sync`, its
/// acknowledged commits in `log` (`--acked-log`).
pub fn sync_node(
    addr: SocketAddr,
    dir: &Path,
    (id, token): (&str, &str),
    log: &Path,
    rate: &str,
) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.arg("node")
        .arg("--store")
        .arg(dir)
        .args(["--server", &format!("http://{addr}"), "--store-id", id])
        .args([
            "--commits",
            "10000000",
            "--rate",
            rate,
            "--value-size",
            "256",
        ])
        .args(["--durability", "sync", "--ack-timeout-ms", "20000"])
        .arg("--acked-log")
        .arg(log)
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", token);
    cmd
}

/// Reads `events` until one that `wanted` accepts, within [`DEADLINE`]: every event read, that
/// one last. Panics naming `what` and the kinds seen when none comes.
pub async fn until_event(
    events: &mut tonic::Streaming<proto::BackupEvent>,
    what: &str,
    wanted: impl Fn(&proto::BackupEvent) -> bool,
) -> Vec<proto::BackupEvent> {
    let mut seen = Vec::new();
    let read = async {
        loop {
            let e = events
                .message()
                .await
                .expect("the stream fails")
                .expect("the stream ends");
            let done = wanted(&e);
            seen.push(e);
            if done {
                return;
            }
        }
    };
    if tokio::time::timeout(DEADLINE, read).await.is_err() {
        let kinds: Vec<&str> = seen.iter().map(|e| e.kind_name.as_str()).collect();
        panic!("waited {DEADLINE:?} for {what}; saw {kinds:?}");
    }
    seen
}

/// `ctl --json standby --dir DIR --destination URL` on the service at `addr`, which must
/// succeed: the standby's store id.
pub fn ctl_standby(addr: SocketAddr, dir: &Path, url: &str) -> String {
    let (ok, out) = ctl(
        addr,
        &[
            "--json",
            "standby",
            "--dir",
            dir.to_str().unwrap(),
            "--destination",
            url,
        ],
    );
    assert!(ok, "ctl standby: {}", out.output());
    binary::json(&out.stdout())["store_id"]
        .as_str()
        .unwrap()
        .to_string()
}
