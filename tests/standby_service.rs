//! Standbys in the service (issue 28): `ctl standby` registers a store that a `serve` keeps
//! current from its destination (`src/service/fleet/standby.rs`), `ctl promote` makes it the
//! primary (`src/service/fleet/promote.rs`). Real moto, real gRPC over TCP, real processes.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto;
use support::binary::{self, Running};
use support::served::{self, DEADLINE};

/// The lease TTL of both services: a dead `serve`'s store lease is stale within it (and a
/// promotion with --wait-for-lease of an async primary waits about that long).
const LEASE_TTL_MS: &str = "3000";

/// A `serve` on moto with instance id `instance`, a short lease TTL and a restore point every
/// 500 ms.
fn serve(d: &served::Dirs, endpoint: &str, instance: &str) -> Command {
    let mut cmd = served::command(d);
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--instance-id", instance, "--lease-ttl-ms", LEASE_TTL_MS])
        .args(["--restore-point-interval-ms", "500"]);
    cmd
}

/// A [`serve`] in directories of its own, with a directory `sub` made under its allowed root.
struct Service {
    d: served::Dirs,
    dir: PathBuf,
    srv: Running,
    addr: SocketAddr,
    c: served::Client,
}

impl Service {
    async fn start(name: &str, endpoint: &str, instance: &str, sub: &str) -> Service {
        let d = served::dirs();
        let dir = d.root.join(sub);
        std::fs::create_dir_all(&dir).unwrap();
        let (srv, addr) = served::start(name, serve(&d, endpoint, instance));
        let c = served::client(addr).await;
        Service {
            d,
            dir,
            srv,
            addr,
            c,
        }
    }

    /// `ctl standby` of `url` into the service's directory, which must succeed: the standby's
    /// store id and node token.
    fn standby_of(&self, url: &str) -> (String, String) {
        let answer = ctl_ok(
            self.addr,
            &[
                "standby",
                "--dir",
                self.dir.to_str().unwrap(),
                "--destination",
                url,
            ],
        );
        let field = |name: &str| answer[name].as_str().unwrap().to_string();
        (field("store_id"), field("node_token"))
    }
}

/// `ctl --json ARGS` against `addr`, which must succeed: its JSON answer.
fn ctl_ok(addr: std::net::SocketAddr, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (ok, child) = served::ctl(addr, &all);
    assert!(ok, "ctl {args:?} failed: {}", child.output());
    binary::json(&child.stdout())
}

/// `ctl ARGS` against `addr`, which must fail naming `says` (and the gRPC code `code`): its
/// stderr.
fn ctl_refused(addr: std::net::SocketAddr, args: &[&str], code: &str, says: &str) -> String {
    let (ok, child) = served::ctl(addr, args);
    let err = child.stderr();
    assert!(!ok, "ctl {args:?} succeeded: {}", child.output());
    assert!(
        err.contains(code) && err.contains(says),
        "ctl {args:?}: expected {code} naming {says:?}, got: {err}"
    );
    err
}

/// `ctl health ID` as text.
fn text_health(addr: std::net::SocketAddr, id: &str) -> String {
    let (_, child) = served::ctl(addr, &["health", id]);
    child.stdout()
}

/// The acked log's highest commit, once it holds at least `n` commits.
fn wait_acked(log: &Path, n: usize) -> u64 {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let seqs = served::acked_log(log);
        if seqs.len() >= n {
            return *seqs.last().unwrap();
        }
        assert!(Instant::now() < deadline, "fewer than {n} acknowledgements");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_in_serve_follows_a_live_primary_is_promoted_and_its_node_commits_ship() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "standby-svc").await;
    let url = format!("s3://{bucket}/db");

    // The primary: a `serve` backing a store up in sync durability while a node commits.
    let Service {
        d: a,
        dir: primary_dir,
        srv: mut srv_a,
        addr: addr_a,
        c: ca,
    } = Service::start("serve A (primary)", &endpoint, "node-a", "primary").await;
    let log = a.base.join("acked.log");
    let r = served::register_sync(&ca, &primary_dir, &url).await;
    let mut node = Running::spawn(
        "node A",
        served::sync_node(
            addr_a,
            &primary_dir,
            (&r.store_id, &r.node_token),
            &log,
            "40",
        ),
    );
    wait_acked(&log, 10);
    // A restore point within its interval: the standby restores from it.
    served::wait_health(&ca, &r.store_id, "a restore point", |h| {
        h.restore_point_commit_seq > 0
    })
    .await;

    // The standby: a second `serve` following the prefix into its own directory.
    let standby = Service::start("serve B (standby)", &endpoint, "node-b", "standby").await;
    let (id, token) = standby.standby_of(&url);
    let Service {
        d: b,
        dir: standby_dir,
        srv: mut srv_b,
        addr: addr_b,
        c: cb,
    } = standby;

    // It follows while the primary commits: it applies segments (a lag behind, in commits),
    // past what was acknowledged when it was registered.
    let acked_then = wait_acked(&log, 20);
    let h = served::wait_health(&cb, &id, "the standby applying segments, behind", |h| {
        h.role == "standby"
            && h.healthy
            && h.standby_last_apply.starts_with("applied")
            && h.standby_lag_commits > 0
            && h.standby_commit_seq >= acked_then
    })
    .await;
    eprintln!(
        "behind: {} commits {} s: {}",
        h.standby_lag_commits, h.standby_lag_seconds, h.standby_last_apply
    );
    assert_eq!(h.destination, url);
    assert!(!h.standby_last_apply.is_empty(), "{h:?}");
    // A standby has no worker: a pause is refused naming why.
    ctl_refused(
        addr_b,
        &["pause", &id, "--reason", "x"],
        "FAILED_PRECONDITION",
        "is a standby",
    );
    // ctl shows the role and the lag.
    let shown = ctl_ok(addr_b, &["health", &id]);
    assert_eq!(shown["stores"][0]["role"], "standby", "{shown}");
    assert!(
        shown["stores"][0]["standby_lag_commits"].is_u64(),
        "{shown}"
    );
    let text = text_health(addr_b, &id);
    assert!(text.contains("role standby of"), "{text}");
    eprintln!("following: {text}");

    // The node stops committing: the standby catches up, lag 0.
    node.signal(libc::SIGKILL);
    node.wait_exit(Duration::from_secs(10));
    let acked = served::acked_log(&log);
    let highest_acked = *acked.last().unwrap();
    let h = served::wait_health(&cb, &id, "caught up, lag 0", |h| {
        h.standby_lag_commits == 0
            && h.standby_lag_seconds == 0.0
            && h.standby_commit_seq >= highest_acked
            && h.standby_last_apply.starts_with("caught up")
    })
    .await;
    assert!(h.healthy, "{h:?}");
    eprintln!("caught up: {}", text_health(addr_b, &id));

    // The primary's host dies.
    srv_a.signal(libc::SIGKILL);
    srv_a.wait_exit(Duration::from_secs(10));

    // The primary was in `durability = sync`: its lease record promises the acknowledgement
    // window, so the promotion takes its lease at once and waits about a second, without
    // --wait-for-lease, although a `serve` held it under its instance lease.
    let killed = Instant::now();
    let promoted = ctl_ok(addr_b, &["promote", &id]);
    eprintln!(
        "promoted {:?} after the kill: {promoted}; {} commits acknowledged, highest \
         {highest_acked}",
        killed.elapsed(),
        acked.len()
    );
    let at = promoted["commit_seq"].as_u64().unwrap();
    assert!(
        at >= highest_acked,
        "promoted at commit {at}, but commit {highest_acked} was acknowledged: {promoted}"
    );
    let missing: Vec<u64> = acked.iter().copied().filter(|s| *s > at).collect();
    assert!(
        missing.is_empty(),
        "acknowledged commits missing: {missing:?}"
    );
    served::wait_health(&cb, &id, "a primary holding its lease", |h| {
        h.role == "primary" && h.lease_held
    })
    .await;
    // The fleet's event log holds one `promoted` event of it, naming where the copy ends.
    let event = promoted_event(&cb, &id).await;
    assert_eq!(event.commit_seq, at, "{event:?}");
    assert_eq!(event.kind_name, "promoted", "{event:?}");
    assert!(
        event.detail.contains(promoted["lineage"].as_str().unwrap()),
        "the event does not name the new lineage: {event:?}"
    );

    // A second promotion is refused: it is a primary now.
    ctl_refused(
        addr_b,
        &["promote", &id],
        "FAILED_PRECONDITION",
        "is a primary, not a standby",
    );

    // A node commits into the promoted directory; its commits ship under the new lineage.
    served::node_writes(addr_b, &standby_dir, &id, &token, 15);
    let h = served::wait_health(&cb, &id, "the new commits in a restore point", |h| {
        h.restore_point_commit_seq >= at + 15
    })
    .await;
    assert!(h.healthy, "{h:?}");
    let restored = b.base.join("restored");
    let digest = binary::restore_digest(&endpoint, &url, &restored);
    assert!(
        digest["commit_seq"].as_u64().unwrap() >= at + 15,
        "the restore of the prefix lacks the promoted store's commits: {digest}"
    );
    let lineage = promoted["lineage"].as_str().unwrap();
    let on_disk = std::fs::read_to_string(standby_dir.join("backup.lineage")).unwrap();
    assert!(on_disk.contains(lineage), "{on_disk} vs {lineage}");

    // A restart of serve keeps it a primary (the registry row says so).
    served::terminate(&mut srv_b);
    drop(cb);
    let (mut srv_b, addr_b) = served::start("serve B again", serve(&b, &endpoint, "node-b"));
    let cb = served::client(addr_b).await;
    served::wait_health(&cb, &id, "a primary after the restart", |h| {
        h.role == "primary" && h.lease_held
    })
    .await;
    served::terminate(&mut srv_b);
}

/// The `promoted` event of `store_id` in the fleet's event log (replayed from its start).
async fn promoted_event(cb: &served::Client, store_id: &str) -> proto::BackupEvent {
    let mut events = cb
        .clone()
        .watch_events(proto::WatchEventsRequest {
            store_id: store_id.to_string(),
            after: Some(0),
        })
        .await
        .expect("WatchEvents")
        .into_inner();
    let what = format!("{store_id}'s promoted event");
    let seen = served::until_event(&mut events, &what, |e| {
        e.kind == proto::EventKind::Promoted as i32
    })
    .await;
    seen.into_iter().last().expect("the promoted event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_and_promote_refuse_bad_input_naming_what_was_wrong() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "standby-bad").await;
    let d = served::dirs();
    let (mut srv, addr) = served::start("serve", serve(&d, &endpoint, "node-c"));
    let dir = d.root.join("s");
    std::fs::create_dir_all(&dir).unwrap();
    let dir_s = dir.to_str().unwrap();
    let url = format!("s3://{bucket}/p");

    let missing = d.root.join("missing");
    let err = ctl_refused(
        addr,
        &[
            "standby",
            "--dir",
            missing.to_str().unwrap(),
            "--destination",
            &url,
        ],
        "INVALID_ARGUMENT",
        "missing",
    );
    assert!(err.contains("Register"), "{err}");
    ctl_refused(
        addr,
        &["standby", "--dir", dir_s, "--destination", "http://h/x"],
        "INVALID_ARGUMENT",
        "http://h/x",
    );
    ctl_refused(
        addr,
        &[
            "standby",
            "--dir",
            dir_s,
            "--destination",
            &url,
            "--replica",
            &format!("s3://{bucket}/q"),
        ],
        "INVALID_ARGUMENT",
        "a standby writes to no destination",
    );
    ctl_refused(
        addr,
        &["promote", "4b6c3f0e-0a57-4a3c-9d55-1a2b3c4d5e6f"],
        "NOT_FOUND",
        "no store 4b6c3f0e-0a57-4a3c-9d55-1a2b3c4d5e6f",
    );
    ctl_refused(
        addr,
        &["promote", "bad id!"],
        "INVALID_ARGUMENT",
        "store_id must be a store id",
    );

    // A primary is not promoted.
    let primary = d.root.join("p");
    std::fs::create_dir_all(&primary).unwrap();
    let c = served::client(addr).await;
    let primary_id = served::register(
        &c,
        support::register_req(&primary, &format!("s3://{bucket}/primary")),
    )
    .await;
    ctl_refused(
        addr,
        &["promote", &primary_id],
        "FAILED_PRECONDITION",
        "is a primary, not a standby",
    );

    // A standby of an empty prefix waits for a restore point, unhealthy only after failures,
    // and is deregistered cleanly.
    let standby = ctl_ok(addr, &["standby", "--dir", dir_s, "--destination", &url]);
    let id = standby["store_id"].as_str().unwrap().to_string();
    let h = served::wait_health(&c, &id, "a standby with no restore point to follow", |h| {
        h.role == "standby" && !h.last_error.is_empty()
    })
    .await;
    assert_eq!(h.standby_commit_seq, 0, "{h:?}");
    // Promoting it fails naming why (nothing to promote from), and it stays a standby.
    let (ok, child) = served::ctl(addr, &["promote", &id]);
    assert!(!ok, "promoting a standby of an empty prefix succeeded");
    assert!(child.stderr().contains("Promote"), "{}", child.stderr());
    served::wait_health(&c, &id, "still a standby", |h| h.role == "standby").await;
    ctl_ok(addr, &["deregister", &id]);
    let stores = served::list_stores(&c).await;
    assert!(stores.iter().all(|s| s.store_id != id), "{stores:?}");
    served::terminate(&mut srv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_standbys_promoted_at_once_one_wins_and_the_other_names_it_and_stops() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "standby-race").await;
    let url = format!("s3://{bucket}/db");
    let Service {
        d: _a,
        dir: primary_dir,
        srv: mut srv_a,
        addr: addr_a,
        c: ca,
    } = Service::start("serve A (primary)", &endpoint, "node-a", "primary").await;
    let r = ca
        .clone()
        .register(support::register_req(&primary_dir, &url))
        .await
        .expect("Register")
        .into_inner();
    served::node_writes(addr_a, &primary_dir, &r.store_id, &r.node_token, 30);
    served::wait_health(&ca, &r.store_id, "30 commits in a restore point", |h| {
        h.restore_point_commit_seq >= 30
    })
    .await;

    // Two standbys on two services.
    let mut standbys = Vec::new();
    for name in ["node-b", "node-c"] {
        let standby = Service::start(name, &endpoint, name, "standby").await;
        let (id, _) = standby.standby_of(&url);
        let Service {
            d, srv, addr, c, ..
        } = standby;
        served::wait_health(&c, &id, "caught up at 30", |h| {
            h.standby_commit_seq >= 30 && h.standby_last_apply.starts_with("caught up")
        })
        .await;
        standbys.push((name, d, srv, addr, c, id));
    }
    srv_a.signal(libc::SIGKILL);
    srv_a.wait_exit(Duration::from_secs(10));

    // Both promotions at once.
    let mut calls: Vec<Running> = standbys
        .iter()
        .map(|(name, _, _, addr, _, id)| {
            let mut cmd = binary::command("http://unused.invalid");
            cmd.args(["ctl", "--json", "--server", &format!("http://{addr}")])
                .args(["promote", id, "--wait-for-lease"]);
            Running::spawn(&format!("promote on {name}"), cmd)
        })
        .collect();
    let ok: Vec<bool> = calls
        .iter_mut()
        .map(|c| c.wait_exit(DEADLINE).success())
        .collect();
    assert_eq!(
        ok.iter().filter(|o| **o).count(),
        1,
        "not exactly one promotion won: {}\n{}",
        calls[0].output(),
        calls[1].output()
    );
    let (won, lost) = if ok[0] { (0, 1) } else { (1, 0) };
    let winner = binary::json(&calls[won].stdout());
    let lineage = winner["lineage"].as_str().unwrap();
    let refusal = calls[lost].stderr();
    let winner_name = standbys[won].0;
    assert!(
        refusal.contains("FAILED_PRECONDITION")
            && (refusal.contains(lineage) || refusal.contains(winner_name)),
        "the losing promotion does not name the winner ({winner_name}, lineage {lineage}): \
         {refusal}"
    );
    eprintln!("the loser was told: {refusal}");
    let (_, _, _, _, c, id) = &standbys[won];
    served::wait_health(c, id, "the winner a primary", |h| h.role == "primary").await;
    // The loser follows no more: its LATEST names the winner's lineage.
    let (_, _, _, _, c, id) = &standbys[lost];
    let h = served::wait_health(c, id, "the loser stopped, naming the promotion", |h| {
        h.role == "standby" && !h.healthy && h.reason.contains(lineage)
    })
    .await;
    eprintln!("the loser's health: {}", h.reason);
    for (_, _, mut srv, _, _, _) in standbys {
        served::terminate(&mut srv);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_standalone_primary_is_fenced_at_once_by_promote_and_loses_its_lease() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "standby-live").await;
    let url = format!("s3://{bucket}/db");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    binary::write_store(&src, 50);
    let settings = binary::FollowSettings {
        lease_ttl: Duration::from_secs(2),
        wal_interval: Duration::from_millis(200),
        restore_point_interval: Duration::from_millis(500),
    };
    let mut old = Running::spawn(
        "old primary (backup)",
        binary::follower(&endpoint, &src, &url, &settings),
    );
    old.wait_for_health("a restore point at 50", DEADLINE, |h| {
        h.lease_held && h.restore_point_commit_seq >= 50
    });

    let standby = Service::start("serve (standby)", &endpoint, "node-s", "standby").await;
    let (id, _) = standby.standby_of(&url);
    let Service {
        d,
        dir,
        mut srv,
        addr,
        c,
    } = standby;
    served::wait_health(&c, &id, "following at 50", |h| h.standby_commit_seq >= 50).await;

    // The old primary is alive and shipping (10 commits a second) when the promotion comes:
    // its lease is taken over at once (no --wait-for-lease needed: a standalone lease's
    // deadline is read from the bucket's clock).
    let mut writer = Running::spawn("writer", binary::writer(&src, 100_000, 10));
    let promoted = ctl_ok(addr, &["promote", &id]);
    let at = promoted["commit_seq"].as_u64().unwrap();
    assert!(at >= 50, "{promoted}");
    assert!(
        promoted["fenced"].as_str().unwrap().contains("(store "),
        "the promotion does not name the holder it took over: {promoted}"
    );
    // The old primary reports that it lost the lease.
    old.wait_for_health("report the lease lost", DEADLINE, |h| !h.lease_held);
    writer.signal(libc::SIGTERM);
    writer.wait_exit(DEADLINE);
    served::wait_health(&c, &id, "a primary holding its lease", |h| {
        h.role == "primary" && h.lease_held
    })
    .await;
    // The old primary, run again, is refused: the promoted store's lease holds.
    let mut once = binary::backup_once(&endpoint, &src, &url, &[]);
    once.env("MUSHROOMDB_BACKUP_LEASE_TTL_MS", "2000");
    let out = once.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the old primary shipped again: {err}"
    );
    assert!(
        err.contains("node-s") || err.contains("prefix refused"),
        "the old primary's refusal does not name the promoted store's holder: {err}"
    );

    // Commits into the promoted directory ship, under the new lineage.
    binary::write_store(&dir, 20);
    served::wait_health(&c, &id, "the new commits in a restore point", |h| {
        h.restore_point_commit_seq >= at + 20
    })
    .await;
    let restored = d.base.join("restored");
    let digest = binary::restore_digest(&endpoint, &url, &restored);
    assert_eq!(
        digest,
        binary::store_digest(&dir),
        "the prefix does not restore to the promoted store"
    );
    old.kill();
    served::terminate(&mut srv);
}
