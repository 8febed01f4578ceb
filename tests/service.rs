//! The service end to end over real TCP: the `serve` binary on port 0 with a temp data dir and
//! its SQLite registry, the `node` binary streaming positions, the `ctl` binary, and raw gRPC
//! clients for what a well-behaved client cannot send (a non-UTF-8 path, a stale position).
//!
//! Every wait has a deadline and says what it waited for and what it saw last; every child
//! process is killed when its guard drops.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mushroom_backup::node_client::{
    ConnectionState, NodeClient, NodeClientConfig, NodeClientError, position_report,
};
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::store::format::WalPosition;
use tonic::Code;
use tonic::transport::Channel;

mod support;

const BIN: &str = env!("CARGO_BIN_EXE_mushroom-backup");
const ADMIN: &str = "admin-secret-for-tests";
/// Generous: the machine running the tests may be busy.
const DEADLINE: Duration = Duration::from_secs(120);

/// A child process killed (and reaped) on drop.
struct Proc {
    child: Option<Child>,
    what: String,
    log: PathBuf,
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGTERM, then waits for a clean exit.
    fn terminate(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "{} exited with {status} after SIGTERM:\n{}",
                    self.what,
                    self.log_tail()
                );
                return;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit within {DEADLINE:?} of SIGTERM:\n{}",
                    self.what,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `serve` process, its address and its directories.
struct Server {
    proc: Proc,
    addr: String,
}

use support::served::{Dirs, dirs};

fn serve(d: &Dirs, admin: Option<&str>, log_name: &str) -> Server {
    let log = d.base.join(log_name);
    let mut cmd = support::serve::command(&d.data, &d.root, &[]);
    cmd.env("MUSHROOMDB_BACKUP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(t) = admin {
        cmd.env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("spawn serve");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc {
        child: Some(child),
        what: "serve".into(),
        log,
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
        panic!(
            "serve printed no listening line within {DEADLINE:?}:\n{}",
            proc.log_tail()
        )
    });
    assert!(
        !line.is_empty(),
        "serve exited before printing its listening line:\n{}",
        proc.log_tail()
    );
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!(
            "serve's first line {line:?} is not JSON ({e}):\n{}",
            proc.log_tail()
        )
    });
    let addr = v["listening"].as_str().expect("listening").to_string();
    assert!(v["instance_id"].is_string(), "{v}");
    Server { proc, addr }
}

impl Server {
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn client(&self) -> BackupControlClient<Channel> {
        BackupControlClient::connect(self.url())
            .await
            .expect("connect to serve")
    }
}

/// A request with the admin token.
fn admin<T>(msg: T) -> tonic::Request<T> {
    support::with_token(msg, ADMIN)
}

fn file_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

async fn health(c: &mut BackupControlClient<Channel>, id: &str) -> proto::StoreHealth {
    support::served::health_of(c, id, admin).await
}

/// Waits until the store is healthy with `commits` durable and shipped.
async fn wait_shipped(c: &mut BackupControlClient<Channel>, id: &str, commits: u64) {
    support::wait_for(
        DEADLINE,
        &format!("store {id} healthy with {commits} shipped"),
        || {
            let mut c = c.clone();
            async move {
                let h = health(&mut c, id).await;
                if h.healthy && h.durable_commit_seq == commits && h.shipped_commit_seq == commits {
                    Ok(())
                } else {
                    Err(format!("{h:?}"))
                }
            }
        },
    )
    .await
}

async fn all_points(c: &mut BackupControlClient<Channel>, id: &str) -> Vec<proto::RestorePoint> {
    c.list_restore_points(admin(proto::ListRestorePointsRequest {
        store_id: id.into(),
        ..Default::default()
    }))
    .await
    .expect("ListRestorePoints")
    .into_inner()
    .restore_points
}

/// Triggers a restore point and waits until one names `commits`.
async fn restore_point(c: &mut BackupControlClient<Channel>, id: &str, commits: u64) {
    c.trigger(admin(proto::TriggerRequest {
        store_id: id.into(),
        kind: proto::TriggerKind::RestorePoint as i32,
    }))
    .await
    .expect("Trigger");
    support::wait_for(
        DEADLINE,
        &format!("a restore point at commit {commits}"),
        || {
            let mut c = c.clone();
            async move {
                let points = all_points(&mut c, id).await;
                let h = health(&mut c, id).await;
                if points
                    .iter()
                    .any(|p| p.commit_seq == commits && p.is_latest)
                    && h.restore_point_commit_seq == commits
                {
                    Ok(())
                } else {
                    Err(format!("{points:?} / {h:?}"))
                }
            }
        },
    )
    .await
}

/// Runs the `node` binary to completion; returns its JSON line.
fn node(
    d: &Dirs,
    s: &Server,
    dir: &Path,
    id: &str,
    token: &str,
    extra: &[&str],
) -> serde_json::Value {
    let log = d.base.join("node.log");
    let mut cmd = Command::new(BIN);
    cmd.arg("node")
        .arg("--store")
        .arg(dir)
        .args(["--server", &s.url(), "--store-id", id])
        .args(extra)
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", token)
        .env("MUSHROOMDB_BACKUP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let child = cmd.spawn().expect("spawn node");
    let mut proc = Proc {
        child: Some(child),
        what: "node".into(),
        log,
    };
    let start = Instant::now();
    let status = loop {
        if let Some(st) = proc.child.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "node did not finish within {DEADLINE:?}:\n{}",
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(
        proc.child.as_mut().unwrap().stdout.as_mut().unwrap(),
        &mut out,
    )
    .unwrap();
    assert!(
        status.success(),
        "node failed ({status}):\n{}",
        proc.log_tail()
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("node printed {out:?}: {e}"))
}

fn digest_of(dir: &Path) -> (u64, String) {
    let d = mushroom_backup::store::engine::digest(dir).expect("digest");
    (d.commit_seq, d.digest)
}

fn restore_cli(from: &str, to: &Path) {
    let o = Command::new(BIN)
        .args(["restore", "--from", from, "--to"])
        .arg(to)
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .output()
        .expect("run restore");
    assert!(
        o.status.success(),
        "restore failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_streams_health_restore_points_restart_and_adopt() {
    let d = dirs();
    let bucket = d.base.join("bucket");
    let dest = file_url(&bucket);
    let store = d.root.join("s1");
    let server = serve(&d, Some(ADMIN), "serve1.log");
    let mut c = server.client().await;

    let reg = c
        .register(admin(support::register_req(&store, &dest)))
        .await
        .expect("Register")
        .into_inner();
    let id = reg.store_id.clone();
    assert!(!reg.node_token.is_empty());

    // 2,000 commits through the node binary, with snapshots and rotations on the way.
    let args = [
        "--commits",
        "2000",
        "--seed",
        "7",
        "--snapshot-every",
        "800",
        "--rotate-bytes",
        "65536",
    ];
    let out = node(&d, &server, &store, &id, &reg.node_token, &args);
    assert_eq!(out["commit_seq"], 2000, "{out}");
    assert_eq!(out["stopped"], false, "{out}");
    let node_digest = out["digest"].as_str().unwrap().to_string();
    assert_eq!(digest_of(&store), (2000, node_digest.clone()));
    wait_shipped(&mut c, &id, 2000).await;

    restore_point(&mut c, &id, 2000).await;
    let restored = d.base.join("restored-2000");
    restore_cli(&dest, &restored);
    assert_eq!(digest_of(&restored), (2000, node_digest));

    // More restore points, for paging.
    for target in [2010u64, 2020] {
        let out = node(
            &d,
            &server,
            &store,
            &id,
            &reg.node_token,
            &["--commits", "10", "--seed", "7"],
        );
        assert_eq!(out["commit_seq"], target);
        wait_shipped(&mut c, &id, target).await;
        restore_point(&mut c, &id, target).await;
    }
    let everything = all_points(&mut c, &id).await;
    let mut paged = Vec::new();
    let mut token = String::new();
    for page in 0.. {
        assert!(page < 1000, "paging does not end");
        let r = c
            .list_restore_points(admin(proto::ListRestorePointsRequest {
                store_id: id.clone(),
                page_size: 1,
                page_token: token.clone(),
            }))
            .await
            .expect("ListRestorePoints page")
            .into_inner();
        assert!(r.restore_points.len() <= 1, "{r:?}");
        paged.extend(r.restore_points);
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(paged, everything, "page_size 1 pages differ from one page");
    let seqs: Vec<u64> = paged.iter().map(|p| p.commit_seq).collect();
    assert!(seqs.len() >= 3, "{seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[0] >= w[1]),
        "not newest first: {seqs:?}"
    );
    for want in [2000, 2010, 2020] {
        assert!(seqs.contains(&want), "no restore point at {want}: {seqs:?}");
    }
    assert_eq!(paged.iter().filter(|p| p.is_latest).count(), 1);
    assert!(paged[0].is_latest && paged[0].commit_seq == 2020);
    let bad_token = c
        .list_restore_points(admin(proto::ListRestorePointsRequest {
            store_id: id.clone(),
            page_size: 1,
            page_token: "not-a-token".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(bad_token.code(), Code::InvalidArgument, "{bad_token:?}");

    // A restart keeps the registry and respawns the worker.
    drop(c);
    server.proc.terminate();
    let server = serve(&d, Some(ADMIN), "serve2.log");
    let mut c = server.client().await;
    let stores = c
        .list_stores(admin(proto::ListStoresRequest {}))
        .await
        .expect("ListStores")
        .into_inner()
        .stores;
    assert_eq!(stores.len(), 1, "{stores:?}");
    assert_eq!(stores[0].store_id, id);
    assert_eq!(stores[0].store_dir, store.to_str().unwrap());
    assert_eq!(stores[0].destination, dest);
    wait_shipped(&mut c, &id, 2020).await;

    // Adopt: the first store steps aside (flushing), its restore into a new directory adopts
    // the prefix, and its own restore points continue there.
    c.deregister(admin(proto::DeregisterRequest {
        store_id: id.clone(),
        flush: true,
    }))
    .await
    .expect("Deregister");
    let gone = c
        .health(admin(proto::HealthRequest {
            store_id: id.clone(),
            fresh: false,
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    let adopted_dir = d.root.join("adopted");
    let adopted = c
        .adopt(admin(proto::AdoptRequest {
            store_dir: adopted_dir.to_str().unwrap().into(),
            destination: dest.clone(),
            ..Default::default()
        }))
        .await
        .expect("Adopt")
        .into_inner();
    assert_eq!(adopted.commit_seq, 2020, "{adopted:?}");
    assert!(adopted.parent_manifest.contains("2020"), "{adopted:?}");
    let aid = adopted.store_id.clone();
    assert_ne!(aid, id);
    wait_shipped(&mut c, &aid, 2020).await;
    let out = node(
        &d,
        &server,
        &adopted_dir,
        &aid,
        &adopted.node_token,
        &["--commits", "15", "--seed", "7"],
    );
    assert_eq!(out["commit_seq"], 2035);
    wait_shipped(&mut c, &aid, 2035).await;
    restore_point(&mut c, &aid, 2035).await;
    let points = all_points(&mut c, &aid).await;
    let lineages: BTreeSet<&str> = points.iter().map(|p| p.lineage.as_str()).collect();
    assert!(
        lineages.len() >= 2,
        "the parent's and the adopter's lineage: {points:?}"
    );
    assert!(
        points.iter().any(|p| p.commit_seq == 2020 && !p.is_latest),
        "{points:?}"
    );
    assert!(
        points[0].commit_seq == 2035 && points[0].is_latest,
        "{points:?}"
    );
    let restored = d.base.join("restored-2035");
    restore_cli(&dest, &restored);
    assert_eq!(digest_of(&restored), digest_of(&adopted_dir));

    drop(c);
    server.proc.terminate();
}

/// A `RegisterRequest` whose `store_dir` is raw bytes: what a client in another language
/// could send, and what tonic's generated types cannot.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRegisterRequest {
    #[prost(bytes = "vec", tag = "1")]
    store_dir: Vec<u8>,
    #[prost(string, tag = "2")]
    destination: String,
}

async fn raw_register(
    server: &Server,
    store_dir: Vec<u8>,
    dest: &str,
) -> Result<proto::RegisterResponse, tonic::Status> {
    let channel = Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec: tonic_prost::ProstCodec<RawRegisterRequest, proto::RegisterResponse> =
        tonic_prost::ProstCodec::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/mushroom.backup.v1.BackupControl/Register",
    );
    let req = admin(RawRegisterRequest {
        store_dir,
        destination: dest.into(),
    });
    grpc.unary(req, path, codec).await.map(|r| r.into_inner())
}

/// Runs `ctl` against the server; returns (success, stdout, stderr).
fn ctl(server: &Server, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(["ctl", "--server", &server.url()])
        .args(args)
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN");
    if let Some(t) = token {
        cmd.env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", t);
    }
    let o = cmd.output().expect("run ctl");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Asserts ctl failed with exactly one line naming `code`.
fn ctl_fails(server: &Server, token: Option<&str>, args: &[&str], code: &str) {
    let (ok, _, err) = ctl(server, token, args);
    assert!(!ok, "ctl {args:?} succeeded");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "ctl {args:?}: one line expected, got {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(code),
        "ctl {args:?}: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bad_input_is_answered_with_its_code() {
    let d = dirs();
    let dest = file_url(&d.base.join("bucket"));
    let server = serve(&d, Some(ADMIN), "serve.log");
    let mut c = server.client().await;
    let code = |r: Result<tonic::Response<proto::RegisterResponse>, tonic::Status>| match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    let reg = |dir: &str, dest: &str| proto::RegisterRequest {
        store_dir: dir.into(),
        destination: dest.into(),
        ..Default::default()
    };
    let root = d.root.to_str().unwrap().to_string();

    // Paths.
    assert_eq!(
        code(c.register(admin(reg("relative/s", &dest))).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.register(admin(reg(&format!("{root}/a/../b"), &dest)))
                .await
        ),
        Code::InvalidArgument
    );
    let long = format!("{root}/{}", "x/".repeat(2100));
    assert!(long.len() > 4096);
    assert_eq!(
        code(c.register(admin(reg(&long, &dest))).await),
        Code::InvalidArgument
    );
    let mut raw = format!("{root}/bad-").into_bytes();
    raw.extend_from_slice(&[0xff, 0xfe, b'x']);
    let r = raw_register(&server, raw, &dest).await;
    assert_eq!(
        r.as_ref().map_err(|s| s.code()).unwrap_err(),
        Code::InvalidArgument,
        "{r:?}"
    );
    // The raw client itself works: a valid path through it registers.
    let ok = raw_register(&server, format!("{root}/raw-ok").into_bytes(), &dest).await;
    assert!(ok.is_ok(), "{ok:?}");
    let outside = d.base.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, d.root.join("escape")).unwrap();
    assert_eq!(
        code(
            c.register(admin(reg(&format!("{root}/escape/s"), &dest)))
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            c.register(admin(reg(outside.join("s").to_str().unwrap(), &dest)))
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(c.register(admin(reg(&root, &dest))).await),
        Code::PermissionDenied
    );

    // Destinations and duplicates.
    assert_eq!(
        code(
            c.register(admin(reg(&format!("{root}/s2"), "ftp://host/x")))
                .await
        ),
        Code::InvalidArgument
    );
    // (Each registered store has its own destination: a prefix holds one store's backups.)
    let first = c
        .register(admin(reg(
            &format!("{root}/dup"),
            &file_url(&d.base.join("bucket-dup")),
        )))
        .await
        .expect("Register")
        .into_inner();
    assert_eq!(
        code(c.register(admin(reg(&format!("{root}/dup"), &dest))).await),
        Code::AlreadyExists
    );
    // The same directory through a link inside the root is the same store.
    std::os::unix::fs::symlink(d.root.join("dup"), d.root.join("dup-link")).ok();
    std::fs::create_dir_all(d.root.join("dup")).unwrap();
    assert_eq!(
        code(
            c.register(admin(reg(&format!("{root}/dup-link"), &dest)))
                .await
        ),
        Code::AlreadyExists
    );

    // Unknown store ids.
    let unknown = "00000000-0000-0000-0000-000000000000".to_string();
    let h = c
        .health(admin(proto::HealthRequest {
            store_id: unknown.clone(),
            fresh: false,
        }))
        .await;
    assert_eq!(h.unwrap_err().code(), Code::NotFound);
    let t = c
        .trigger(admin(proto::TriggerRequest {
            store_id: unknown.clone(),
            kind: proto::TriggerKind::Ship as i32,
        }))
        .await;
    assert_eq!(t.unwrap_err().code(), Code::NotFound);
    let t = c
        .deregister(admin(proto::DeregisterRequest {
            store_id: unknown.clone(),
            flush: false,
        }))
        .await;
    assert_eq!(t.unwrap_err().code(), Code::NotFound);
    let t = c
        .list_restore_points(admin(proto::ListRestorePointsRequest {
            store_id: unknown.clone(),
            ..Default::default()
        }))
        .await;
    assert_eq!(t.unwrap_err().code(), Code::NotFound);
    let t = c
        .trigger(admin(proto::TriggerRequest {
            store_id: first.store_id.clone(),
            kind: 0,
        }))
        .await;
    assert_eq!(t.unwrap_err().code(), Code::InvalidArgument);

    // Adopt into a non-empty directory.
    std::fs::create_dir_all(d.root.join("full")).unwrap();
    std::fs::write(d.root.join("full/something"), b"x").unwrap();
    let a = c
        .adopt(admin(proto::AdoptRequest {
            store_dir: format!("{root}/full"),
            destination: file_url(&d.base.join("bucket-adopt")),
            ..Default::default()
        }))
        .await;
    assert_eq!(a.unwrap_err().code(), Code::FailedPrecondition);

    // The admin token: missing, wrong.
    let none = c
        .list_stores(tonic::Request::new(proto::ListStoresRequest {}))
        .await;
    assert_eq!(none.unwrap_err().code(), Code::Unauthenticated);
    let wrong = c
        .list_stores(support::with_token(proto::ListStoresRequest {}, "wrong"))
        .await;
    assert_eq!(wrong.unwrap_err().code(), Code::Unauthenticated);
    let wrong = c
        .register(support::with_token(
            reg(&format!("{root}/s3"), &dest),
            "wrong",
        ))
        .await;
    assert_eq!(wrong.unwrap_err().code(), Code::Unauthenticated);

    // The node token: missing, wrong, another store's; an unknown store. Raw streams first.
    let pos = WalPosition {
        snapshot_id: None,
        wal_id: uuid::Uuid::new_v4(),
        wal_number: 1,
        durable_len: 48,
        commit_seq: 0,
    };
    let report = |id: &str| futures::stream::iter(vec![position_report(id, &pos)]);
    let r = c
        .report_position(tonic::Request::new(report(&first.store_id)))
        .await;
    assert_eq!(r.map(|_| ()).unwrap_err().code(), Code::Unauthenticated);
    let r = c
        .report_position(support::with_token(report(&first.store_id), "wrong"))
        .await;
    assert_eq!(r.map(|_| ()).unwrap_err().code(), Code::Unauthenticated);
    let r = c
        .report_position(support::with_token(report(&unknown), &first.node_token))
        .await;
    // An unknown store is answered like a wrong token (tests/node_reports.rs has the detail).
    assert_eq!(r.map(|_| ()).unwrap_err().code(), Code::Unauthenticated);
    let other = ok.unwrap();
    let r = c
        .report_position(support::with_token(
            report(&first.store_id),
            &other.node_token,
        ))
        .await;
    assert_eq!(r.map(|_| ()).unwrap_err().code(), Code::Unauthenticated);

    // NodeClient: a refusal is permanent (no reconnect loop) and says why.
    let mut cfg = NodeClientConfig::new(server.url(), first.store_id.clone(), "wrong-token");
    cfg.first_backoff = Duration::from_millis(10);
    let nc = NodeClient::connect(cfg).expect("connect");
    let e = rejected_unauthenticated(&nc, pos).await;
    assert!(e.is_permanent());
    assert_eq!(nc.state(), ConnectionState::Failed);
    assert!(e.to_string().contains("UNAUTHENTICATED"), "{e}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(nc.state(), ConnectionState::Failed, "it must not retry");
    let nc =
        NodeClient::connect(NodeClientConfig::new(server.url(), unknown.clone(), "t")).unwrap();
    rejected_unauthenticated(&nc, pos).await;
    assert!(matches!(
        NodeClient::connect(NodeClientConfig::new("ftp://x", "id", "t")),
        Err(NodeClientError::Config(_))
    ));

    // ctl: readable text, JSON, and one line naming the code on error.
    let (ok, out, err) = ctl(&server, Some(ADMIN), &["list-stores"]);
    assert!(ok, "{err}");
    assert!(out.contains(&first.store_id), "{out}");
    let (ok, out, err) = ctl(&server, Some(ADMIN), &["--json", "health", &first.store_id]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("health JSON");
    assert_eq!(v["stores"][0]["store_id"], first.store_id.as_str(), "{v}");
    // It answered: exit 0 when the store shown is healthy, 3 when not (an empty directory).
    assert_eq!(ok, v["stores"][0]["healthy"] == true, "{err} {v}");
    ctl_fails(&server, None, &["list-stores"], "UNAUTHENTICATED");
    ctl_fails(&server, Some("wrong"), &["list-stores"], "UNAUTHENTICATED");
    ctl_fails(&server, Some(ADMIN), &["health", &unknown], "NOT_FOUND");
    ctl_fails(
        &server,
        Some(ADMIN),
        &["register", "--dir", "relative", "--destination", &dest],
        "INVALID_ARGUMENT",
    );
    ctl_fails(
        &server,
        Some(ADMIN),
        &[
            "register",
            "--dir",
            &format!("{root}/dup"),
            "--destination",
            &dest,
        ],
        "ALREADY_EXISTS",
    );
    let (ok, out, err) = ctl(
        &server,
        Some(ADMIN),
        &[
            "--json",
            "register",
            "--dir",
            &format!("{root}/via-ctl"),
            "--destination",
            &file_url(&d.base.join("bucket-via-ctl")),
            "--label",
            "team=db",
        ],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("register JSON");
    let via = v["store_id"].as_str().unwrap().to_string();
    assert!(
        v["node_token"].as_str().is_some_and(|t| !t.is_empty()),
        "{v}"
    );
    let (ok, out, err) = ctl(
        &server,
        Some(ADMIN),
        &["--json", "watch-health", &via, "--count", "1"],
    );
    assert!(ok, "{err}");
    assert!(out.contains(&via), "{out}");
    let (ok, _, err) = ctl(&server, Some(ADMIN), &["trigger", &via, "ship"]);
    assert!(ok, "{err}");
    let (ok, _, err) = ctl(&server, Some(ADMIN), &["deregister", &via]);
    assert!(ok, "{err}");
    ctl_fails(&server, Some(ADMIN), &["deregister", &via], "NOT_FOUND");

    drop(c);
    server.proc.terminate();
}

/// Reports `pos` through `nc`, whose flush must fail as refused: UNAUTHENTICATED.
async fn rejected_unauthenticated(nc: &NodeClient, pos: WalPosition) -> NodeClientError {
    nc.report(pos);
    let e = nc.flush(DEADLINE).await.unwrap_err();
    assert!(
        matches!(
            e,
            NodeClientError::Rejected {
                code: Code::Unauthenticated,
                ..
            }
        ),
        "{e:?}"
    );
    e
}

/// Segments of the bucket, as (generation, start, end).
fn segments(bucket: &Path) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let Ok(gens) = std::fs::read_dir(bucket.join("gen")) else {
        return out;
    };
    for g in gens {
        let g = g.unwrap();
        let generation: u64 = g.file_name().to_str().unwrap().parse().unwrap();
        let Ok(segs) = std::fs::read_dir(g.path().join("wal")) else {
            continue;
        };
        for s in segs {
            let name = s.unwrap().file_name().to_str().unwrap().to_string();
            let (range, _) = name.split_once(".seg").expect("a .seg name");
            let (a, b) = range.split_once('-').unwrap();
            out.push((generation, a.parse().unwrap(), b.parse().unwrap()));
        }
    }
    out.sort();
    out
}

use support::store::commit_synced as commit;

/// A `serve` without an admin token, and its store `name`, held open (and locked) by an engine
/// in this process that reports its positions by hand, registered to back up to `bucket`.
struct Held {
    d: Dirs,
    bucket: PathBuf,
    server: Server,
    c: BackupControlClient<Channel>,
    engine: mushroom_backup::store::engine::Engine,
    reg: proto::RegisterResponse,
}

async fn held_store(name: &str, log_name: &str) -> Held {
    let d = dirs();
    let bucket = d.base.join("bucket");
    let store = d.root.join(name);
    let server = serve(&d, None, log_name);
    let mut c = server.client().await;
    let engine = support::store::open_engine(&store);
    let reg = c
        .register(tonic::Request::new(support::register_req(
            &store,
            &file_url(&bucket),
        )))
        .await
        .expect("Register")
        .into_inner();
    Held {
        d,
        bucket,
        server,
        c,
        engine,
        reg,
    }
}

/// For two seconds, health never shows the store `id` shipped past commit `at_most`.
async fn ships_nothing_past(c: &mut BackupControlClient<Channel>, id: &str, at_most: u64) {
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(2) {
        let h = health(c, id).await;
        assert!(
            h.shipped_commit_seq <= at_most,
            "shipped past the reported position: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_position_is_refreshed_and_nothing_ships_past_it() {
    // The engine holds the store open (and locked) in this process and reports by hand.
    let Held {
        d: _d,
        bucket,
        server,
        mut c,
        mut engine,
        reg,
    } = held_store("stale", "serve.log").await;
    let id = reg.store_id.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<proto::PositionReport>(16);
    tx.send(position_report(&id, &engine.position()))
        .await
        .unwrap();
    let mut commands = c
        .report_position(support::with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            &reg.node_token,
        ))
        .await
        .expect("ReportPosition")
        .into_inner();

    // Same WAL file: 100 commits on disk, 60 reported. Only 60 ship.
    let p60 = commit(&mut engine, 60);
    let p100 = commit(&mut engine, 40);
    tx.send(position_report(&id, &p60)).await.unwrap();
    wait_shipped(&mut c, &id, 60).await;
    ships_nothing_past(&mut c, &id, 60).await;
    let segs = segments(&bucket);
    assert!(!segs.is_empty());
    assert!(
        segs.iter().all(|&(_, _, end)| end <= p60.durable_len),
        "a segment past durable_len {}: {segs:?}",
        p60.durable_len
    );
    tx.send(position_report(&id, &p100)).await.unwrap();
    wait_shipped(&mut c, &id, 100).await;
    let gens_before: BTreeSet<u64> = segments(&bucket).iter().map(|s| s.0).collect();

    // The files move on (a snapshot: new snapshot.bin and wal.bin, then more commits) and the
    // node does not say so: the worker defers, asks for a refresh, ships nothing new.
    commit(&mut engine, 30);
    engine.snapshot().expect("snapshot");
    let fresh = commit(&mut engine, 20);
    // The stream also carries durable acknowledgements (`Durable`): passed over here.
    let refresh = tokio::time::timeout(DEADLINE, async {
        loop {
            let cmd = commands
                .message()
                .await
                .expect("the command stream")
                .expect("a command");
            if !matches!(cmd.command, Some(proto::node_command::Command::Durable(_))) {
                return cmd;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no Refresh within {DEADLINE:?}"));
    match refresh.command {
        Some(proto::node_command::Command::Refresh(r)) => assert!(!r.reason.is_empty()),
        other => panic!("expected a Refresh, got {other:?}"),
    }
    ships_nothing_past(&mut c, &id, 100).await;
    let segs = segments(&bucket);
    let gens: BTreeSet<u64> = segs.iter().map(|s| s.0).collect();
    assert_eq!(
        gens, gens_before,
        "a generation the node never reported: {segs:?}"
    );
    assert!(
        segs.iter().all(|&(_, _, end)| end <= p100.durable_len),
        "a segment past durable_len {}: {segs:?}",
        p100.durable_len
    );

    // Reporting the fresh position catches up.
    tx.send(position_report(&id, &fresh)).await.unwrap();
    wait_shipped(&mut c, &id, 150).await;

    // NodeClient on the same store: connects, reports, answers a refresh by re-reporting.
    drop(tx);
    let more = commit(&mut engine, 5);
    let nc = NodeClient::connect(NodeClientConfig::new(
        server.url(),
        id.clone(),
        reg.node_token.clone(),
    ))
    .expect("connect");
    let mut refreshes = nc.refresh_requests();
    nc.report(more);
    nc.flush(DEADLINE).await.expect("flush");
    wait_shipped(&mut c, &id, 155).await;
    engine.snapshot().expect("snapshot");
    let after = commit(&mut engine, 1);
    let r = tokio::time::timeout(DEADLINE, refreshes.recv())
        .await
        .expect("a Refresh reaches the NodeClient")
        .expect("the refresh channel");
    assert!(!r.reason.is_empty());
    nc.report(after);
    nc.flush(DEADLINE).await.expect("flush");
    wait_shipped(&mut c, &id, 156).await;
    nc.close().await;
    assert_eq!(nc.state(), ConnectionState::Closed);

    drop(c);
    server.proc.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_node_client_reconnects_and_resends_the_newest_position() {
    let Held {
        d,
        server,
        mut c,
        mut engine,
        reg,
        ..
    } = held_store("re", "serve1.log").await;
    let mut cfg = NodeClientConfig::new(server.url(), reg.store_id.clone(), reg.node_token.clone());
    cfg.first_backoff = Duration::from_millis(50);
    cfg.max_backoff = Duration::from_millis(400);
    let nc = NodeClient::connect(cfg).expect("connect");
    nc.report(commit(&mut engine, 10));
    nc.flush(DEADLINE).await.expect("flush");
    wait_shipped(&mut c, &reg.store_id, 10).await;

    // The service goes away; reports keep being cheap; it comes back on another port... the
    // client is bound to its address, so restart on the same one.
    let addr = server.addr.clone();
    drop(c);
    server.proc.terminate();
    let p = commit(&mut engine, 7);
    nc.report(p);
    support::wait_for(
        DEADLINE,
        "the client to notice the server is gone",
        || async {
            match nc.state() {
                ConnectionState::Backoff { .. } | ConnectionState::Connecting => Ok(()),
                s => Err(format!("{s:?}")),
            }
        },
    )
    .await;
    assert!(nc.last_error().is_some_and(|e| !e.is_permanent()));
    let log = d.base.join("serve2.log");
    let child = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(&d.data)
        .arg("--allow-root")
        .arg(&d.root)
        .args(["--wal-interval-ms", "50"])
        .env("MUSHROOMDB_BACKUP_LOG", "info")
        .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn serve");
    let proc = Proc {
        child: Some(child),
        what: "serve".into(),
        log,
    };
    nc.flush(DEADLINE).await.unwrap_or_else(|e| {
        panic!(
            "the newest position was not resent after the restart: {e}\n{}",
            proc.log_tail()
        )
    });
    let server = Server { proc, addr };
    let mut c = server.client().await;
    wait_shipped(&mut c, &reg.store_id, 17).await;
    nc.close().await;
    drop(engine);
    drop(c);
    server.proc.terminate();
}

/// ListRestorePoints and Adopt only read a destination: one that is not there is
/// FAILED_PRECONDITION saying so, and is not created (no directory, `.lock` or `.tmp/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_restore_points_and_adopt_create_nothing_in_a_destination() {
    let d = dirs();
    let server = serve(&d, Some(ADMIN), "serve.log");
    let mut c = server.client().await;

    let never = d.base.join("never-written");
    let adopted = d.root.join("adopted");
    let a = c
        .adopt(admin(proto::AdoptRequest {
            store_dir: adopted.to_str().unwrap().into(),
            destination: file_url(&never),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(a.code(), Code::FailedPrecondition, "{a:?}");
    let said = format!("{} does not exist", file_url(&never));
    assert!(a.message().contains(&said), "{a:?}");
    assert!(!never.exists(), "Adopt created {}", never.display());
    assert!(!adopted.exists());

    // A registered store whose destination directory is removed under it.
    let dest = d.base.join("removed");
    let id = c
        .register(admin(support::register_req(
            &d.root.join("s"),
            &file_url(&dest),
        )))
        .await
        .expect("Register")
        .into_inner()
        .store_id;
    support::wait_for(DEADLINE, "the destination removed", || {
        let dest = dest.clone();
        async move {
            match std::fs::remove_dir_all(&dest) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                // The worker wrote into it meanwhile.
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let r = c
        .list_restore_points(admin(proto::ListRestorePointsRequest {
            store_id: id,
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(r.code(), Code::FailedPrecondition, "{r:?}");
    let said = format!("{} does not exist", file_url(&dest));
    assert!(r.message().contains(&said), "{r:?}");
    assert!(
        !dest.exists(),
        "ListRestorePoints created {}",
        dest.display()
    );
}
