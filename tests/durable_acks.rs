//! Durable acknowledgements (issue 27) through the real `serve` binary and moto, over gRPC:
//!
//! - a sync-mode store's reference node (`node --durability sync --acked-log FILE`) gets every
//!   commit acknowledged, the acked log only ever rises, a restore taken right after the last
//!   acknowledgement holds it, and health shows the mode and the position in the bucket;
//! - once everything is in a restore point, an idle sync store sends moto no request at all
//!   over a window (counted at moto, for the store's prefix);
//! - a wait pending when the service goes away fails with a reason (never an ack), and a wait
//!   on the restarted service resumes and succeeds; an async store acknowledges only at its
//!   `wal_interval`;
//! - the `wal_puts_per_second` cap and the `durability` option refuse values outside their
//!   range, naming them, through gRPC, `ctl` and `serve`'s flags.

mod support;

#[path = "../benches/support/moto.rs"]
#[allow(dead_code)]
mod moto;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mushroom_backup::node_client::{NodeClient, NodeClientConfig, NodeClientError};
use mushroom_backup::service::proto;
use support::binary::{self, Running};
use support::served::{self, DEADLINE, Dirs};

/// `serve` against moto at `endpoint`, restore points every 200 ms, listening on `listen`.
fn serve(d: &Dirs, endpoint: &str, listen: &str, extra: &[&str]) -> Command {
    let mut cmd = served::command(d);
    // (The region and test credentials are `binary::command`'s.)
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--listen", listen, "--restore-point-interval-ms", "200"])
        .args(extra);
    cmd
}

/// Requests moto logged for objects under `prefix/` of `bucket` (LISTs by their prefix).
fn moto_requests(m: &moto::Moto, bucket: &str, prefix: &str) -> usize {
    let objects = format!("/{bucket}/{prefix}/");
    let listed = format!("prefix={prefix}%2F");
    m.request_lines()
        .iter()
        .filter(|l| l.contains(&objects) || l.contains(&listed))
        .count()
}

/// `(commit_seq, commit_ms, ack_ms)` of each line of the acked log.
fn acked_lines(path: &Path) -> Vec<(u64, i64, i64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(
                f.len(),
                3,
                "a line of the acked log is not three numbers: {l:?}"
            );
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("127.0.0.1:{}", l.local_addr().unwrap().port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sync_acks_arrive_a_restore_after_one_holds_it_and_an_idle_sync_store_costs_nothing() {
    if support::s3::endpoint().is_none() {
        return;
    }
    let d = served::dirs();
    let m = moto::Moto::start(&d.base.join("moto.log")).expect("start moto");
    let bucket = support::s3::create_bucket(&m.url, "acks").await;
    let dir = d.root.join("synced");
    std::fs::create_dir_all(&dir).unwrap();
    let (mut server, addr) = served::start("serve", serve(&d, &m.url, "127.0.0.1:0", &[]));
    let c = served::client(addr).await;
    let url = format!("s3://{bucket}/synced");
    let r = served::register_sync(&c, &dir, &url).await;

    let acked_log = d.base.join("acked.log");
    let mut node = binary::command("http://unused.invalid");
    node.arg("node")
        .arg("--store")
        .arg(&dir)
        .args([
            "--server",
            &format!("http://{addr}"),
            "--store-id",
            &r.store_id,
        ])
        .args(["--commits", "60", "--rate", "30", "--durability", "sync"])
        .arg("--acked-log")
        .arg(&acked_log)
        .env("MUSHROOMDB_BACKUP_NODE_TOKEN", &r.node_token);
    let out = binary::json(&binary::run_ok("node", node, DEADLINE));
    assert_eq!(out["acknowledged"], 60, "{out}");
    assert_eq!(out["unacknowledged"], 0, "{out}");

    // Right after the last acknowledgement: a restore holds every acknowledged commit.
    let lines = acked_lines(&acked_log);
    let seqs: Vec<u64> = lines.iter().map(|l| l.0).collect();
    assert_eq!(
        seqs,
        (1..=60).collect::<Vec<u64>>(),
        "one line per commit, in order"
    );
    assert!(
        lines.windows(2).all(|w| w[0].2 <= w[1].2),
        "acknowledgements went backwards: {lines:?}"
    );
    assert!(
        lines.iter().all(|(_, commit, ack)| ack >= commit),
        "{lines:?}"
    );
    let restored = binary::restore_digest(&m.url, &url, &d.base.join("restored"));
    assert!(
        restored["commit_seq"].as_u64().unwrap() >= 60,
        "the restore misses acknowledged commits: {restored}"
    );
    let mut delays: Vec<i64> = lines.iter().map(|(_, c, a)| a - c).collect();
    delays.sort_unstable();
    eprintln!(
        "ack delay ms: p50 {} max {}",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );

    // Health shows the mode and the position in the bucket.
    served::wait_health(&c, &r.store_id, "in a restore point, durable 60", |h| {
        h.durability == "sync"
            && h.bucket_durable_commit_seq == 60
            && h.restore_point_commit_seq == 60
    })
    .await;

    // Idle (the node is gone, everything in a restore point): no request over a window.
    let before = moto_requests(&m, &bucket, "synced");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = moto_requests(&m, &bucket, "synced");
    assert_eq!(
        before,
        after,
        "an idle sync store sent {} requests in 3 s",
        after - before
    );
    served::terminate(&mut server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_pending_when_the_stream_is_lost_fails_and_later_waits_resume() {
    if support::s3::endpoint().is_none() {
        return;
    }
    let d = served::dirs();
    let m = moto::Moto::start(&d.base.join("moto.log")).expect("start moto");
    let bucket = support::s3::create_bucket(&m.url, "lost").await;
    let dir = d.root.join("lost");
    support::store::write(&dir, 5, 0, 0);
    let listen = free_port();
    // Async with a long wal_interval: a commit reported now waits a minute to be shipped.
    let slow = ["--wal-interval-ms", "60000"];
    let (mut server, addr) = served::start("serve", serve(&d, &m.url, &listen, &slow));
    let c = served::client(addr).await;
    let url = format!("s3://{bucket}/lost");
    let r = c
        .clone()
        .register(support::register_req(&dir, &url))
        .await
        .expect("Register")
        .into_inner();
    // (Health's other fields are the supervisor's, evaluated every wal_interval; the bucket's
    // figures, the position in it among them, as soon as a step changes them.)
    let h = served::wait_health(&c, &r.store_id, "the first restore point", |h| {
        h.bucket_durable_commit_seq == 5
    })
    .await;
    assert_eq!(h.durability, "async");

    let mut engine = support::store::open_engine(&dir);
    let client = NodeClient::connect(NodeClientConfig::new(
        format!("http://{addr}"),
        r.store_id.clone(),
        r.node_token.clone(),
    ))
    .unwrap();
    client.report(engine.position());
    let ack = client
        .wait_durable(5, DEADLINE)
        .await
        .expect("commit 5 is durable");
    assert!(ack.commit_seq >= 5 && ack.named_by_restore_point, "{ack:?}");

    let pos = support::store::commit_synced(&mut engine, 3);
    client.report(pos);
    // Not shipped before the next wal_interval: still pending after a while.
    let early = client.wait_durable(8, Duration::from_millis(1500)).await;
    assert!(
        matches!(
            early,
            Err(NodeClientError::NotDurable { commit_seq: 8, .. })
        ),
        "{early:?}"
    );
    let pending = client.wait_durable(8, DEADLINE);
    let killer = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.kill();
    };
    let (waited, ()) = tokio::join!(pending, killer);
    match waited {
        Err(NodeClientError::DurabilityLost(why)) => {
            assert!(!why.is_empty(), "no reason given");
            eprintln!("the wait failed as it should: {why}");
        }
        other => panic!("a wait pending while the service died ended with {other:?}"),
    }

    // The service again, same address and data, now sync by default (the store was
    // registered with the service's default): the new stream's acknowledgements count, and
    // come at once.
    let sync = ["--wal-interval-ms", "60000", "--durability", "sync"];
    let (mut server, addr2) = served::start("serve again", serve(&d, &m.url, &listen, &sync));
    assert_eq!(addr2.to_string(), listen);
    let ack = client
        .wait_durable(8, Duration::from_secs(30))
        .await
        .expect("commit 8 is durable on the new stream");
    assert!(ack.commit_seq >= 8, "{ack:?}");
    // Sync now: a commit is acknowledged long before the 60 s wal_interval.
    let pos = support::store::commit_synced(&mut engine, 1);
    client.report(pos);
    let ack = client
        .wait_durable(9, Duration::from_secs(20))
        .await
        .expect("commit 9 acknowledged in sync mode");
    assert!(ack.commit_seq >= 9, "{ack:?}");
    let h = served::health(&served::client(addr2).await, &r.store_id, false)
        .await
        .unwrap();
    assert_eq!(h.durability, "sync", "{h:?}");
    let restored = binary::restore_digest(&m.url, &url, &d.base.join("restored"));
    assert!(restored["commit_seq"].as_u64().unwrap() >= 9, "{restored}");
    client.close().await;
    drop(engine);
    served::terminate(&mut server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_options_out_of_range_are_refused_naming_them() {
    let d = served::dirs();
    let dir = d.root.join("s");
    std::fs::create_dir_all(&dir).unwrap();
    let (mut server, addr) = served::start("serve", served::command(&d));
    let c = served::client(addr).await;
    let dest = support::file_url(&d.base.join("bucket"));
    for (options, field) in [
        (
            proto::StoreOptions {
                wal_puts_per_second: 1001,
                ..Default::default()
            },
            "wal_puts_per_second",
        ),
        (
            proto::StoreOptions {
                durability: 7,
                ..Default::default()
            },
            "durability",
        ),
    ] {
        let mut req = support::register_req(&dir, &dest);
        req.options = Some(options);
        let e = c.clone().register(req).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{e:?}");
    }
    let (ok, child) = ctl_register(addr, &dir, &dest, &["--wal-puts-per-second", "1001"]);
    assert!(!ok, "ctl register accepted 1001 WAL PUTs a second");
    assert!(
        served::stderr(&child).contains("wal_puts_per_second"),
        "{}",
        served::stderr(&child)
    );
    let (ok, child) = ctl_register(addr, &dir, &dest, &["--durability", "eventually"]);
    assert!(!ok, "ctl register accepted durability eventually");
    assert!(served::stderr(&child).contains("eventually"));
    // Registered in range: ListStores shows it as registered.
    let (ok, child) = ctl_register(
        addr,
        &dir,
        &dest,
        &["--durability", "sync", "--wal-puts-per-second", "5"],
    );
    assert!(ok, "{}", served::stderr(&child));
    let stores = served::list_stores(&c).await;
    let o = stores[0].options.clone().unwrap();
    assert_eq!(o.durability, proto::Durability::Sync as i32);
    assert_eq!(o.wal_puts_per_second, 5);
    served::terminate(&mut server);

    let mut cmd = served::command(&d);
    cmd.args(["--wal-puts-per-second", "0"]);
    let e = served::refused("serve", cmd);
    assert!(
        e.contains("--wal-puts-per-second = 0 is out of range"),
        "{e}"
    );
}

/// `ctl register --dir DIR --destination DEST EXTRA`: whether it exited 0, and the child.
fn ctl_register(addr: SocketAddr, dir: &Path, dest: &str, extra: &[&str]) -> (bool, Running) {
    let mut args = vec![
        "register",
        "--dir",
        dir.to_str().unwrap(),
        "--destination",
        dest,
    ];
    args.extend_from_slice(extra);
    served::ctl(addr, &args)
}
