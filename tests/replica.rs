//! A second destination (`backup --replica URL`): its own worker, lease and health.
//!
//! The primary's bucket is reached through a [`FaultProxy`] that is taken down for a minute
//! while a writer commits at 100 commits/s; the replica's bucket is reached straight. Each
//! destination names its own endpoint in its URL's query (the process's `AWS_ENDPOINT_URL`
//! points nowhere), so the query is what reaches them. What must hold: the primary turns
//! unhealthy, the replica never does and stays current (a restore from it, during the outage,
//! equals the store), and once the primary's bucket is back it catches up: both prefixes
//! verify and restore to the store, at the same commit.

mod support;

use std::time::{Duration, Instant};

use support::binary::{self, FollowSettings, Health, Running};
use support::fault_proxy::{FaultPlan, FaultProxy};

const TTL: Duration = Duration::from_millis(2000);
/// Commits per second of the writer.
const RATE: u32 = 100;
/// How long the primary's bucket is away.
const OUTAGE: Duration = Duration::from_secs(60);
/// Where nothing listens: the environment's endpoint, which no destination may end up using.
const NOWHERE: &str = "http://127.0.0.1:9";

fn is(role: &str) -> impl Fn(&Health) -> bool + '_ {
    move |h| h.destination == role
}

#[test]
fn the_replica_stays_healthy_and_current_while_the_primary_bucket_is_away_a_minute() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let began = Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let primary_bucket = rt.block_on(support::s3::create_bucket(&endpoint, "replica-primary"));
    let replica_bucket = rt.block_on(support::s3::create_bucket(&endpoint, "replica-second"));
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());
    let primary = format!("s3://{primary_bucket}/p?endpoint={}", proxy.url());
    let replica = format!("s3://{replica_bucket}/r?endpoint={endpoint}&region=us-east-1");
    let (tmp, store, mut writer) = binary::store_being_written(RATE);
    let settings = FollowSettings {
        lease_ttl: TTL,
        wal_interval: Duration::from_millis(100),
        restore_point_interval: Duration::from_millis(500),
    };
    let mut cmd = binary::follower(NOWHERE, &store, &primary, &settings);
    cmd.args(["--replica", &replica]);
    let mut follower = Running::spawn("follower with a replica", cmd);
    // Both in one pass: health lines come only on a change, in either order, and a line read
    // while waiting for one destination is not seen again by a second wait.
    let mut up = [false; 2];
    follower.wait_for_health(
        "report the primary and the replica healthy under their leases",
        Duration::from_secs(30),
        |h| {
            for (i, role) in ["primary", "replica"].into_iter().enumerate() {
                if is(role)(h) {
                    up[i] = h.healthy && h.lease_held;
                }
            }
            up == [true, true]
        },
    );

    proxy.set_down(true);
    let down_at = Instant::now();
    let replica_unhealthy = |h: &Health| {
        assert!(
            !is("replica")(h) || h.healthy,
            "the replica turned unhealthy while only the primary's bucket was away: {h:?}"
        );
    };
    let (h, at) = follower.wait_for_health(
        "report the primary unhealthy",
        OUTAGE - Duration::from_secs(15),
        |h| {
            replica_unhealthy(h);
            is("primary")(h) && !h.healthy
        },
    );
    eprintln!(
        "the primary unhealthy {:?} into the outage: {h:?}",
        at - down_at
    );

    // The writer stops while the primary is still away: the replica must hold every commit.
    follower.watch_until(
        down_at + OUTAGE - Duration::from_secs(14),
        replica_unhealthy,
    );
    writer.signal(libc::SIGTERM);
    assert!(writer.wait_exit(Duration::from_secs(10)).success());
    let source = binary::store_digest(&store);
    let mut n = 0;
    let current_at = loop {
        n += 1;
        let restored = binary::restore_digest(
            NOWHERE,
            &replica,
            &tmp.path().join(format!("replica-during-{n}")),
        );
        if restored == source {
            break Instant::now();
        }
        assert!(
            Instant::now() < down_at + OUTAGE,
            "the replica did not hold the store's {source} before the primary's bucket came \
             back: last restore {restored}"
        );
        follower.watch_until(
            Instant::now() + Duration::from_millis(500),
            replica_unhealthy,
        );
    };
    eprintln!(
        "a restore from the replica equals the store ({source}) {:?} into the outage",
        current_at - down_at
    );
    follower.watch_until(down_at + OUTAGE, replica_unhealthy);
    assert!(
        follower
            .healths()
            .iter()
            .any(|h| is("primary")(h) && !h.healthy),
        "the primary never looked unhealthy"
    );

    proxy.set_down(false);
    let up_at = Instant::now();
    let (h, at) = follower.wait_for_health(
        "report the primary healthy again",
        Duration::from_secs(60),
        |h| {
            replica_unhealthy(h);
            is("primary")(h) && h.healthy && h.lease_held
        },
    );
    eprintln!(
        "the primary healthy again {:?} after its bucket came back: {h:?}",
        at - up_at
    );
    follower.signal(libc::SIGTERM);
    let status = follower.wait_exit(Duration::from_secs(40));
    if !status.success() {
        follower.fail(&format!("exited with {status} after SIGTERM"));
    }
    let summary = binary::json(&follower.stdout());
    let commits = &source["commit_seq"];
    assert_eq!(&summary["restore_point_commit_seq"], commits, "{summary}");
    assert_eq!(
        &summary["replica"]["restore_point_commit_seq"], commits,
        "{summary}"
    );

    for (role, url) in [("primary", &primary), ("replica", &replica)] {
        let verified = binary::verify_ok(NOWHERE, url, role);
        assert!(verified.latest.is_some(), "{role}: no LATEST");
        let restored = binary::restore_digest(NOWHERE, url, &tmp.path().join(role));
        assert_eq!(
            restored, source,
            "{role}: the restore differs from the store"
        );
    }
    for (role, url) in [("primary", &primary), ("replica", &replica)] {
        let mut ls = binary::command(NOWHERE);
        ls.args(["ls", "--from", url, "--json"]);
        let listed = binary::json(&binary::run_ok(role, ls, Duration::from_secs(30)));
        let latest = listed
            .as_array()
            .and_then(|a| a.iter().find(|p| p["is_latest"] == true))
            .unwrap_or_else(|| panic!("{role}: ls shows no latest restore point: {listed}"));
        assert_eq!(&latest["commit_seq"], commits, "{role}: {latest}");
    }
    eprintln!(
        "{commits} commits in both prefixes; proxy {:?}; {:?} in all",
        proxy.counts(),
        began.elapsed()
    );
    assert!(
        proxy.counts().refused_down > 0,
        "the proxy refused nothing while down: {:?}",
        proxy.counts()
    );
}

/// A destination's query is checked before anything is touched: unknown keys, blank values,
/// an endpoint with credentials in it, a query on `file://`; the refusal names the key and
/// never echoes a secret.
#[test]
fn a_bad_destination_query_is_refused_by_name() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let store = tmp.path().join("store");
    binary::write_store(&store, 3);
    for (url, says) in [
        ("s3://b/p?regoin=eu-west-1", "unknown query key \"regoin\""),
        ("s3://b/p?region=", "region is blank"),
        (
            "s3://b/p?endpoint=http://u:s3cr3t@h:1",
            "must not hold a user",
        ),
        ("file:///tmp/x?region=r", "takes no query"),
    ] {
        for args in [
            vec!["ls", "--from", url],
            vec!["verify", "--from", url],
            vec!["restore", "--from", url, "--to", "/nonexistent/x"],
        ] {
            let out = binary::command(NOWHERE).args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} succeeded");
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(!err.contains("s3cr3t"), "{args:?} echoed the secret: {err}");
        }
        let mut backup = binary::command(NOWHERE);
        backup
            .arg("backup")
            .arg("--store")
            .arg(&store)
            .args(["--to", &format!("file://{}/b", tmp.path().display())])
            .args(["--replica", url, "--once"]);
        let out = backup.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "backup --replica {url} succeeded");
        assert!(err.contains(says), "backup --replica {url}: {err}");
        assert!(
            !err.contains("s3cr3t"),
            "backup --replica echoed the secret: {err}"
        );
    }
}

/// `ctl register --replica URL` against a running `serve`: the replica (on S3, reached by its
/// URL's own endpoint; the primary a local directory) gets a worker of its own, and
/// `ctl health` shows its health beside the store's; both restore to the store. A second
/// store whose replica bucket does not exist has a healthy primary and an unhealthy replica
/// naming why. A replica with a bad query, or sharing the store's prefix, is refused.
#[test]
fn ctl_register_replica_runs_a_second_worker_with_its_own_health() {
    use support::served;
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(support::s3::create_bucket(&endpoint, "replica-ctl"));
    let d = served::dirs();
    let (mut serve, addr) = served::start(
        "serve",
        served::fast_serve(&d, &["--allow-endpoint", &endpoint]),
    );
    let ctl = |args: &[&str]| {
        let (ok, child) = served::ctl(addr, args);
        (ok, child.stdout(), child.output())
    };
    let commits = 300;
    let store = d.root.join("s");
    binary::write_store(&store, commits);
    let primary = format!("file://{}", d.base.join("primary").display());
    let replica = format!("s3://{bucket}/r?endpoint={endpoint}&region=us-east-1");

    for (bad, says) in [
        ("s3://b/r?regoin=x", "unknown query key"),
        (primary.as_str(), "shares objects"),
        // An endpoint the operator did not allow: no request is signed for it.
        (
            "s3://b/r?endpoint=http://attacker.invalid",
            "--allow-endpoint",
        ),
    ] {
        let (ok, _, out) = ctl(&[
            "register",
            "--dir",
            store.to_str().unwrap(),
            "--destination",
            &primary,
            "--replica",
            bad,
        ]);
        assert!(!ok, "registered with --replica {bad}");
        assert!(
            out.contains("options.replica") && out.contains(says),
            "{out}"
        );
    }
    // `ctl --json register` of `dir` to `to` with `--replica`, which must succeed: the store id.
    let register = |dir: &std::path::Path, to: &str, replica: &str| {
        let (ok, stdout, out) = ctl(&[
            "--json",
            "register",
            "--dir",
            dir.to_str().unwrap(),
            "--destination",
            to,
            "--replica",
            replica,
        ]);
        assert!(ok, "{out}");
        binary::json(&stdout)["store_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // `ctl health` of `id` polled until `until` holds, panicking with `never` after the
    // deadline. It exits non-zero while a store is unhealthy: its JSON is what counts here.
    let health_until = |id: &str, never: &str, until: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + served::DEADLINE;
        loop {
            let (_, stdout, _) = ctl(&["--json", "health", id]);
            let h = binary::json(&stdout)["stores"][0].clone();
            if until(&h) {
                break h;
            }
            assert!(Instant::now() < deadline, "{never}: {h:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let id = register(&store, &primary, &replica);
    let h = health_until(&id, "never both current", &|h| {
        let r = &h["replica"];
        h["healthy"] == true
            && h["restore_point_commit_seq"] == commits
            && r["healthy"] == true
            && r["restore_point_commit_seq"] == commits
    });
    assert_eq!(h["replica"]["destination"], replica.as_str(), "{h:#}");
    assert_eq!(h["replica"]["lease_held"], true, "{h:#}");
    assert_eq!(h["destination"], primary.as_str(), "{h:#}");
    let (ok, stdout, out) = ctl(&["health", &id]);
    assert!(ok && stdout.contains("replica s3://"), "{out}");
    // The primary's health does not count the replica's: its fields are the primary's.

    let source = binary::store_digest(&store);
    for (role, url) in [("primary", &primary), ("replica", &replica)] {
        let restored = binary::restore_digest(NOWHERE, url, &d.base.join(format!("r-{role}")));
        assert_eq!(restored, source, "{role}");
    }

    // A replica that fails is unhealthy on its own.
    let other = d.root.join("other");
    binary::write_store(&other, 10);
    let missing = format!(
        "s3://no-such-bucket-{}/r?endpoint={endpoint}",
        std::process::id()
    );
    let other_id = register(
        &other,
        &format!("file://{}", d.base.join("other-primary").display()),
        &missing,
    );
    let h = health_until(&other_id, "the replica never looked unhealthy", &|h| {
        h["replica"]["healthy"] == false && h["restore_point_commit_seq"] == 10
    });
    assert_eq!(
        h["healthy"], true,
        "a failing replica made the primary unhealthy: {h:#}"
    );
    let said = format!("{} {}", h["replica"]["reason"], h["replica"]["last_error"]);
    assert!(said.contains("no-such-bucket"), "{h:#}");
    eprintln!("a failing replica: {:#}", h["replica"]);
    served::terminate(&mut serve);
}

/// `backup --once --replica URL` ships to both destinations, each under its own lease, and
/// prints the replica's summary under `replica`; both restore to the store. A replica equal
/// to `--to` is refused.
#[test]
fn backup_once_with_a_replica_fills_both_prefixes() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let store = tmp.path().join("store");
    binary::write_store(&store, 500);
    let primary = format!("file://{}", tmp.path().join("a").display());
    let replica = format!("file://{}", tmp.path().join("b").display());
    let cmd = binary::backup_once(NOWHERE, &store, &primary, &["--replica", &replica]);
    let summary = binary::json(&binary::run_ok(
        "backup --once",
        cmd,
        Duration::from_secs(60),
    ));
    assert_eq!(summary["restore_point_commit_seq"], 500, "{summary}");
    assert_eq!(
        summary["replica"]["restore_point_commit_seq"], 500,
        "{summary}"
    );
    let source = binary::store_digest(&store);
    for (role, url) in [("primary", &primary), ("replica", &replica)] {
        let restored = binary::restore_digest(NOWHERE, url, &tmp.path().join(role));
        assert_eq!(restored, source, "{role}");
    }
    let out = binary::backup_once(NOWHERE, &store, &primary, &["--replica", &primary])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is the --to destination itself"), "{err}");
}
