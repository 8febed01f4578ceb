//! Throttle classes (issue 44) through the real binaries: `serve --limit`, `ctl limits`,
//! `ctl health --json`'s `traffic`, a store's limits in its options, and
//! `restore --limit-bytes-per-second` against moto through a relay that counts the bytes the
//! server sends as they pass (`support::tcp_meter`).
//!
//! Every timed assertion is a lower bound the pacing makes certain (a limited transfer cannot
//! be faster than its limit allows, however idle the machine), or a comparison of two runs of
//! the same bytes where one is held to a rate far below the other's; the figures are printed.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto;
use support::binary;
use support::served::{self, client, fast_serve as serve, terminate, wait_health};
use support::tcp_meter::TcpMeter;

/// `store write` of `commits` commits of 16 KiB values into `dir`.
fn write_store(dir: &Path, commits: u64) {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["store", "write"]).arg(dir).args([
        "--commits",
        &commits.to_string(),
        "--value-size",
        "16384",
    ]);
    binary::run_ok("store write", cmd, Duration::from_secs(120));
}

fn json_of(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `ctl` with `args`, which must succeed; its JSON.
fn ctl_json(addr: std::net::SocketAddr, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (ok, out) = served::ctl(addr, &all);
    let text = out.stdout();
    assert!(ok, "ctl {args:?}: {text} {}", served::stderr(&out));
    json_of(&text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_limit_slows_a_drill_not_a_restore_and_limits_change_live_and_last() {
    let d = served::dirs();
    let dir = d.root.join("limited");
    let bucket = d.base.join("bucket");
    let url = support::file_url(&bucket);
    // About 8 MB.
    write_store(&dir, 500);
    let limits = [
        "--limit",
        "check=2000000",
        "--limit",
        "housekeeping=unlimited,requests=500",
    ];
    let (mut server, addr) = served::start("serve", serve(&d, &limits));
    let c = client(addr).await;
    let options = proto::StoreOptions {
        limits: vec!["bulk=50000000".into()],
        ..Default::default()
    };
    let id = served::register_with(&c, support::register_req(&dir, &url), options).await;
    wait_health(&c, &id, "a restore point", |h| {
        h.healthy && h.restore_point_commit_seq == 500
    })
    .await;

    // The instance's limits as given, and the store's own with the instance's beside them.
    let v = ctl_json(addr, &["limits", "show"]);
    assert_eq!(v["classes"]["check"]["limit"], 2_000_000, "{v}");
    assert_eq!(v["classes"]["housekeeping"]["requests_limit"], 500, "{v}");
    assert_eq!(v["classes"]["restore"]["limit"], 0, "{v}");
    let v = ctl_json(addr, &["limits", "show", &id]);
    assert_eq!(v["limits"], serde_json::json!(["bulk=50000000"]), "{v}");
    assert_eq!(v["classes"]["bulk"]["limit"], 50_000_000, "{v}");
    assert_eq!(v["classes"]["check"]["instance_limit"], 2_000_000, "{v}");
    // The store's first backup went up as bulk, and health shows it.
    let v = ctl_json(addr, &["health", &id]);
    let traffic = &v["stores"][0]["traffic"];
    assert_eq!(traffic["bulk"]["limit"], 50_000_000, "{v}");
    assert!(traffic["wal"]["rate"].is_number(), "{v}");

    // A drill (check, 2 MB/s) and an unlimited restore of the same prefix, side by side.
    let drill = {
        let c = c.clone();
        let id = id.clone();
        tokio::spawn(async move {
            c.clone()
                .drill(proto::DrillRequest {
                    store_id: id,
                    at_commit_seq: 0,
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let target = d.base.join("restored");
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["restore", "--from", &url, "--json", "--to"])
        .arg(&target);
    let started = Instant::now();
    let out =
        tokio::task::block_in_place(|| binary::run_ok("restore", cmd, Duration::from_secs(120)));
    let restore_seconds = started.elapsed().as_secs_f64();
    let report = json_of(&out);
    let drilled = drill.await.unwrap().expect("Drill").into_inner();
    assert!(drilled.ok, "{drilled:?}");
    let floor = drilled.bytes as f64 / 2_000_000.0;
    eprintln!(
        "throttle: drill of {} B at check=2 MB/s took {:.2} s (floor {floor:.2} s); the \
         unlimited restore beside it {restore_seconds:.2} s",
        drilled.bytes, drilled.seconds
    );
    assert!(drilled.bytes > 6_000_000, "{drilled:?}");
    assert!(drilled.seconds >= 0.9 * floor, "{drilled:?}");
    assert!(
        restore_seconds < 0.5 * drilled.seconds,
        "the restore is not held by the drill's limit: {restore_seconds} s {report}"
    );

    // Changed live: the instance's check limit lifted, the store's bulk limit set.
    let v = ctl_json(addr, &["limits", "set", "check=unlimited"]);
    assert_eq!(v["classes"]["check"]["limit"], 0, "{v}");
    let v = ctl_json(
        addr,
        &["limits", "set", "--store", &id, "bulk=1000000,requests=20"],
    );
    assert_eq!(v["classes"]["bulk"]["limit"], 1_000_000, "{v}");
    assert_eq!(v["classes"]["bulk"]["requests_limit"], 20, "{v}");
    let v = ctl_json(addr, &["health", &id]);
    assert_eq!(v["stores"][0]["traffic"]["bulk"]["limit"], 1_000_000, "{v}");
    let started = Instant::now();
    let drilled = c
        .clone()
        .drill(proto::DrillRequest {
            store_id: id.clone(),
            at_commit_seq: 0,
        })
        .await
        .expect("Drill")
        .into_inner();
    eprintln!(
        "throttle: the same drill with check lifted took {:.2} s",
        started.elapsed().as_secs_f64()
    );
    assert!(drilled.seconds < 0.5 * floor, "{drilled:?}");

    // Refused, naming what is wrong; nothing changed.
    let (ok, out) = served::ctl(addr, &["limits", "set", "wal=5"]);
    let said = served::stderr(&out);
    assert!(
        !ok && said.contains("INVALID_ARGUMENT") && said.contains("wal=5"),
        "{said}"
    );
    let (ok, out) = served::ctl(addr, &["limits", "show", "no-such-store"]);
    assert!(!ok, "{}", out.stdout());

    // The store's limit is its option: a restart keeps it (the instance's live change is gone).
    terminate(&mut server);
    let (mut server, addr) = served::start("serve again", serve(&d, &limits));
    let v = ctl_json(addr, &["limits", "show", &id]);
    assert_eq!(
        v["limits"],
        serde_json::json!(["bulk=1000000,requests=20"]),
        "{v}"
    );
    let v = ctl_json(addr, &["limits", "show"]);
    assert_eq!(v["classes"]["check"]["limit"], 2_000_000, "{v}");
    terminate(&mut server);
}

#[test]
fn serve_refuses_a_limit_it_cannot_hold_naming_it() {
    let d = served::dirs();
    for (limit, says) in [
        ("wal=1000", "never throttled"),
        ("bulk=0", "out of range"),
        ("bulk", "CLASS=BYTES_PER_SECOND"),
        ("uploads=5", "unknown class"),
    ] {
        let said = served::refused("serve", serve(&d, &["--limit", limit]));
        assert!(
            said.contains(limit) && said.contains(says),
            "{limit}: {said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_a_limit_holds_it_at_the_server() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "throttle-restore").await;
    let url = format!("s3://{bucket}/store");
    let root = tempfile::tempdir().unwrap();
    let store = root.path().join("store");
    // About 24 MB.
    write_store(&store, 1500);
    binary::run_ok(
        "backup --once",
        binary::backup_once(&endpoint, &store, &url, &[]),
        Duration::from_secs(120),
    );
    let proxy = TcpMeter::start(&endpoint).await;
    let restore = |to: &str, extra: &[&str]| {
        let mut cmd = binary::command(proxy.url());
        cmd.args(["restore", "--from", &url, "--json", "--to"])
            .arg(root.path().join(to))
            .args(extra);
        let (before, started) = (proxy.down(), Instant::now());
        let out = binary::run_ok("restore", cmd, Duration::from_secs(300));
        let bytes = proxy.down() - before;
        (json_of(&out), bytes, started.elapsed().as_secs_f64())
    };
    let (_, free_bytes, free_seconds) = tokio::task::block_in_place(|| restore("free", &[]));
    // A limit well under what this machine does unlimited, sampled at the proxy meanwhile.
    let limit = 4_000_000.0;
    let (done, samples) = (
        std::sync::atomic::AtomicBool::new(false),
        std::sync::Mutex::new(Vec::new()),
    );
    let before = proxy.down();
    let (report, bytes, seconds) = std::thread::scope(|s| {
        s.spawn(|| {
            let started = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = proxy.down() - before;
                let at = (started.elapsed().as_secs_f64(), sent);
                samples.lock().unwrap().push(at);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let out = tokio::task::block_in_place(|| {
            restore("limited", &["--limit-bytes-per-second", "4000000"])
        });
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        out
    });
    let floor = bytes as f64 / limit;
    eprintln!(
        "throttle: restore of {bytes} B unlimited {free_seconds:.2} s ({:.1} MB/s), at \
         4 MB/s {seconds:.2} s ({:.2} MB/s at the server; floor {floor:.2} s)",
        free_bytes as f64 / free_seconds / 1e6,
        bytes as f64 / seconds / 1e6
    );
    assert!(bytes > 20_000_000, "{report}");
    assert!(seconds >= 0.9 * floor, "{seconds} s for {bytes} B");
    let samples = samples.into_inner().unwrap();
    // Past the first 2 s (when the sockets' buffers fill: what the server sends before the
    // restore has read it), no 2 s window at the server is over the limit.
    let first = samples.iter().find(|s| s.1 > 0).map_or(0.0, |s| s.0);
    let widest = samples
        .iter()
        .filter(|a| a.0 >= first + 2.0)
        .flat_map(|a| samples.iter().map(move |b| (a, b)))
        .filter(|(a, b)| (b.0 - a.0 - 2.0).abs() < 0.05)
        .map(|(a, b)| (b.1 - a.1) as f64 / (b.0 - a.0))
        .fold(0.0, f64::max);
    let start: u64 = samples
        .iter()
        .filter(|s| s.0 <= first + 2.0)
        .map(|s| s.1)
        .max()
        .unwrap_or(0);
    eprintln!(
        "throttle: the first 2 s at the server carried {:.1} MB; the fastest 2 s window after \
         them {:.2} MB/s",
        start as f64 / 1e6,
        widest / 1e6
    );
    assert!(widest <= 1.2 * limit, "{widest} B/s over 2 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_housekeeping_request_limit_holds_through_a_retention_of_many_restore_points() {
    use mushroom_backup::bucket::DynBucket;
    use mushroom_backup::bucket::counting::{CountingBucket, RequestCounts};
    use mushroom_backup::bucket::throttle::{Lane, LimitSet, Throttle, Throttled};
    use std::sync::Arc;

    let tmp = tempfile::tempdir().unwrap();
    let (dir, root) = (tmp.path().join("store"), tmp.path().join("bucket"));
    // 12 generations, a restore point each: the pass below deletes all but the newest.
    support::store::generations(&dir, &root, 12).await;
    let before = support::store::keys_under(&support::store::fs_bucket(&root), "").await;
    // Counted where the requests reach the bucket (under the throttle): the server's side.
    let counts = RequestCounts::new();
    let counted: DynBucket = Arc::new(CountingBucket::with_counts(
        support::store::fs_bucket(&root),
        counts.clone(),
    ));
    const RATE: u64 = 20;
    let limits = LimitSet::parse_all(&[format!("housekeeping=unlimited,requests={RATE}")]);
    let throttle = Throttle::new(LimitSet::none().with(&limits.unwrap()));
    let scope = throttle.store("store", &LimitSet::none());
    let bucket: DynBucket = Arc::new(Throttled::new(
        counted,
        Lane::new(&throttle, Some(scope), None),
    ));
    let mut config = support::store::config();
    config.retention = support::store::newest_generation_only();
    let mut worker = support::store::worker(&dir, bucket, config);
    // Sampled every 50 ms: (seconds, requests, deletes).
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = {
        let (samples, counts) = (samples.clone(), counts.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let s = counts.snapshot();
                let total = s.get + s.get_range + s.head + s.put + s.delete + s.list;
                let at = (started.elapsed().as_secs_f64(), total, s.delete);
                samples.lock().unwrap().push(at);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = Instant::now();
    let report = worker.run_once().await.expect("a run with its retention");
    let seconds = started.elapsed().as_secs_f64();
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let after = support::store::keys_under(&support::store::fs_bucket(&root), "").await;
    let deletes = counts.snapshot().delete;
    assert!(
        deletes >= 30 && after.len() + 30 <= before.len(),
        "the pass deleted {deletes}: {report:?}"
    );
    // From the pass's first delete on, every request is the pass's: no 1 s window holds more
    // than the limit and its burst (a tenth of a second of it).
    let first = samples.iter().position(|s| s.2 > 0).expect("a delete");
    let mut most = 0;
    for (i, a) in samples.iter().enumerate().skip(first) {
        if let Some(b) = samples[i..].iter().find(|b| b.0 >= a.0 + 1.0) {
            most = most.max(b.1 - a.1);
        }
    }
    let pass = samples.last().unwrap().0 - samples[first].0;
    let pass_requests = samples.last().unwrap().1 - samples[first].1;
    eprintln!(
        "throttle: retention of 11 generations under housekeeping requests={RATE}: {deletes} \
         deletes, {pass_requests} requests in {pass:.2} s from the first delete (run {seconds:.2} \
         s); the busiest 1 s window {most} requests"
    );
    assert!(most <= RATE + RATE / 10 + 2, "{most} requests in 1 s");
    assert!(
        pass >= 0.9 * pass_requests as f64 / RATE as f64 - 0.2,
        "{pass} s"
    );
}
