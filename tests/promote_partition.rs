//! Issue 28: a **partitioned old primary** (alive, every bucket request of its held for seconds,
//! past the promotion) cannot fork the prefix's history, and acknowledges nothing the promoted
//! store does not hold.
//!
//! On moto: a `serve` backs a store up in `durability = sync` through a fault proxy while the
//! reference node commits into it (`--acked-log`), and a standby follows the prefix directly.
//! Then the proxy holds every request of the old primary for [`HOLD`] (its segment PUTs,
//! confirming reads, lease renewals land late, none is lost), the standby is stopped and
//! `promote` runs without `--wait-for-lease`: the old primary's lease record promises the
//! acknowledgement window, so the promotion takes its lease and waits about a second, not a
//! lease TTL. Then:
//! - the promotion finished before the held requests landed (they are delayed *past* it);
//! - every commit the node acknowledged is in the promoted store (at most what it applied);
//! - the old primary notices (its confirming read finds the lease taken) and says so;
//! - its late segments are in the bucket, but LATEST (the claim, then the promoted store's own
//!   restore point) never names them, no manifest of the promoted lineage does, no manifest of
//!   the old lineage reaches past what the promotion applied, and a restore of the prefix equals
//!   the promoted store, before and after the promoted store commits on.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::binary::{self, Running};
use support::fault_proxy::{FaultPlan, FaultProxy};
use support::primary::{self, SyncPrimary, pump};
use support::served::{self, DEADLINE};

/// How long the partition holds each of the old primary's requests.
const HOLD: Duration = Duration::from_secs(8);

/// Reads both children's output until `until`, so that no pipe fills.
async fn get_json(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> serde_json::Value {
    let o = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {key}: {e:?}"));
    let bytes = o.body.collect().await.unwrap().into_bytes();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{key}: {e}"))
}

async fn keys_under(s3: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut pages = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(prefix)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.expect("LIST");
        keys.extend(
            page.contents()
                .iter()
                .filter_map(|o| o.key().map(String::from)),
        );
    }
    keys
}

/// `(start, end)` of a segment key `…/wal/<start>-<end>.seg`.
fn segment_range(key: &str) -> Option<(u64, u64)> {
    let name = key.rsplit('/').next()?.strip_suffix(".seg")?;
    let (a, b) = name.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn restored_equals(endpoint: &str, url: &str, store: &Path, into: &Path, when: &str) {
    let restored = binary::restore_digest(endpoint, url, into);
    let held = binary::store_digest(store);
    assert_eq!(
        restored, held,
        "{when}: a restore of the prefix is not the promoted store's history"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_old_primary_acknowledges_nothing_past_the_promotion_and_forks_nothing() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "promote-partition").await;
    let s3 = support::s3::client(&endpoint);
    let url = format!("s3://{bucket}/p");
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());
    let d = served::dirs();
    let dir = d.root.join("primary");
    std::fs::create_dir_all(&dir).unwrap();
    let (standby_dir, log) = (d.base.join("standby"), d.base.join("acked.log"));
    let mut cmd = served::command(&d);
    cmd.env("AWS_ENDPOINT_URL", proxy.url())
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--restore-point-interval-ms", "500"]);
    let mut primary =
        SyncPrimary::start(("old primary", cmd), "node", &dir, &url, &log, "40").await;
    primary.wait_acked(&log, 40, "no acknowledgements");
    let SyncPrimary { mut srv, mut n, .. } = primary;
    let mut s = Running::spawn(
        "standby",
        binary::standby(&endpoint, &url, &standby_dir, 100, 200),
    );
    let target = *served::acked_log(&log).last().unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let caught_up = s
            .next_line(Instant::now() + Duration::from_millis(20))
            .is_some_and(|l| {
                serde_json::from_str::<serde_json::Value>(&l.text)
                    .ok()
                    .and_then(|v| v["commit_seq"].as_u64())
                    .is_some_and(|seq| seq >= target)
            });
        if caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never reached {target}"
        );
        pump(&mut n, &mut srv, Instant::now() + Duration::from_millis(5));
    }

    // The partition: the old primary's requests from now on land HOLD late.
    proxy.set_hold(Some(HOLD));
    let held_from = Instant::now();
    pump(
        &mut n,
        &mut srv,
        Instant::now() + Duration::from_millis(300),
    );
    s.signal(libc::SIGTERM);
    assert!(s.wait_exit(DEADLINE).success(), "the standby failed");
    let mut promote = primary::promote(&endpoint, &url, &standby_dir);
    promote.env("MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS", "500");
    let mut p = Running::spawn("promote", promote);
    let promoted = primary::promoted(&mut p);
    let took = held_from.elapsed();
    assert!(
        took < HOLD,
        "the promotion took {took:?}: the old primary's held writes were not delayed past it"
    );
    let applied = promoted["applied"]["commit_seq"].as_u64().unwrap();
    let generation = promoted["applied"]["generation"].as_u64().unwrap();
    let wal_end = promoted["applied"]["wal_end"].as_u64().unwrap();
    let new_lineage = promoted["new_lineage"].as_str().unwrap().to_string();
    let old_lineage = promoted["parent"]["lineage"].as_str().unwrap().to_string();
    eprintln!("promoted {took:?} into the partition, at commit {applied}");

    // The old primary's held requests land; its next confirming read finds the lease taken.
    let deadline = Instant::now() + DEADLINE;
    while !served::stderr(&srv).contains("the bucket lease was taken over") {
        assert!(
            Instant::now() < deadline,
            "the old primary never noticed the takeover"
        );
        pump(&mut n, &mut p, Instant::now() + Duration::from_millis(50));
        srv.next_line(Instant::now() + Duration::from_millis(20));
    }
    proxy.set_hold(None);
    // Every request held is answered by now (HOLD after it arrived), and the node committed on.
    let settle = held_from + HOLD + HOLD + Duration::from_secs(1);
    pump(&mut n, &mut srv, settle.max(Instant::now()));
    n.signal(libc::SIGKILL);
    n.wait_exit(Duration::from_secs(10));
    let acked = served::acked_log(&log);
    let newest_acked = acked.iter().copied().max().unwrap_or(0);
    assert!(
        newest_acked <= applied,
        "the old primary acknowledged commit {newest_acked}, the promoted store holds {applied}"
    );
    let at_risk = support::store::digest(&dir).commit_seq;
    assert!(
        at_risk > applied,
        "the old store committed nothing past the promotion: nothing was at risk"
    );
    eprintln!(
        "acknowledged {} commits, newest {newest_acked}; the old store reached {at_risk}",
        acked.len()
    );

    // Its late writes are in the bucket: segments of the generation past what was applied.
    let late: Vec<String> = keys_under(&s3, &bucket, &format!("p/gen/{generation:010}/wal/"))
        .await
        .into_iter()
        .filter(|k| segment_range(k).is_some_and(|(_, end)| end > wal_end))
        .collect();
    assert!(
        !late.is_empty(),
        "no segment of the old primary landed after the promotion: the partition held nothing"
    );
    // LATEST is the claim, which stops the history at what the promotion applied, or already
    // the promoted store's own first restore point (of what it applied, in a generation of
    // its own).
    let latest = get_json(&s3, &bucket, "p/LATEST").await;
    let first = d.base.join("restored-1");
    if latest["lineage"] == old_lineage.as_str() {
        assert_eq!(latest["adopted_by"], new_lineage.as_str(), "{latest}");
        assert_eq!(latest["adopted_at"]["commit_seq"], applied, "{latest}");
        // Still the claim: a late segment of the old writer past it makes a restore refuse
        // (exit 3, `tests/standby.rs`) until told a partial restore is wanted; then it is
        // exactly the promoted store's history, and leaves out only what lies past the claim.
        let wal_end = latest["adopted_at"]["wal_end"].as_u64().unwrap();
        let mut cmd = binary::command(&endpoint);
        cmd.args([
            "restore",
            "--allow-partial",
            "--json",
            "--from",
            &url,
            "--to",
        ])
        .arg(&first);
        let report = binary::json(&binary::run_ok(
            "restore --allow-partial",
            cmd,
            Duration::from_secs(60),
        ));
        for l in report["left_out"].as_array().into_iter().flatten() {
            assert!(
                l["start"].as_u64().unwrap() >= wal_end,
                "left out before the claim: {l}"
            );
        }
        assert_eq!(
            binary::store_digest(&first),
            binary::store_digest(&standby_dir),
            "after the late writes: a restore of the prefix is not the promoted store's history"
        );
    } else {
        assert_eq!(latest["lineage"], new_lineage.as_str(), "{latest}");
        assert_eq!(latest["commit_seq"], applied, "{latest}");
        restored_equals(
            &endpoint,
            &url,
            &standby_dir,
            &first,
            "after the late writes",
        );
    }

    // The promoted store commits on; its restore point moves LATEST to its lineage.
    binary::write_store(&standby_dir, 5);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let latest = get_json(&s3, &bucket, "p/LATEST").await;
        if latest["lineage"] == new_lineage.as_str() && latest["commit_seq"] == applied + 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "LATEST never named the promoted store's commit {}: {latest}",
            applied + 5
        );
        pump(
            &mut p,
            &mut srv,
            Instant::now() + Duration::from_millis(100),
        );
    }
    // No manifest names the old primary's late writes: the promoted lineage's name none of
    // them, the old lineage's reach no further than the promotion applied.
    for key in keys_under(&s3, &bucket, "p/manifests/").await {
        let m = get_json(&s3, &bucket, &key).await;
        let lineage = m["lineage"].as_str().unwrap_or_default();
        let named: Vec<&str> = m["segments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["key"].as_str())
            .collect();
        for l in &late {
            let short = l.strip_prefix("p/").unwrap_or(l);
            assert!(!named.contains(&short), "{key} names a late write {l}");
        }
        if lineage == old_lineage {
            assert!(
                m["commit_seq"].as_u64().unwrap() <= applied,
                "{key}: a restore point of the old primary past the promotion"
            );
        } else {
            assert_eq!(lineage, new_lineage, "{key}: a third lineage");
        }
    }
    let second = d.base.join("restored-2");
    restored_equals(&endpoint, &url, &standby_dir, &second, "after new commits");

    // The old primary never ships again: its store is refused the prefix or waits as a
    // standby on the promoted store's lease; LATEST stays the promoted store's.
    pump(&mut p, &mut srv, Instant::now() + Duration::from_secs(2));
    let latest = get_json(&s3, &bucket, "p/LATEST").await;
    assert_eq!(latest["lineage"], new_lineage.as_str(), "{latest}");
    p.signal(libc::SIGTERM);
    p.wait_exit(DEADLINE);
    srv.signal(libc::SIGTERM);
    srv.wait_exit(DEADLINE);
}
