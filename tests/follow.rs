//! Follow mode with real processes over real S3 (moto): two followers of one store on one
//! prefix while a writer commits. The second uploads nothing while the first lives; after the
//! first is SIGKILLed, the second takes the lease over within a TTL and a third (DESIGN.md
//! section 7) and ships; on SIGTERM it flushes, releases the lease and exits 0; a restore then
//! has every commit and `verify` passes.
//!
//! Every wait reads what the children print as they print it ([`support::binary::Running`]),
//! with a deadline and the children's output in the failure message.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use support::binary::{self, FollowSettings, Health, Running};
use support::s3_servers::S3Server;

/// The lease TTL of both followers.
const TTL: Duration = Duration::from_millis(2000);
/// Commits per second of the writer.
const RATE: u32 = 250;
/// What the takeover bound allows for on top of TTL + TTL/3: the follower's health is looked
/// at every `wal_interval` (200 ms), the test reads the bucket every 50 ms, and a debug build
/// talking to moto takes some tens of milliseconds per request.
const POLLING_ALLOWANCE: Duration = Duration::from_millis(1000);
/// How long after the takeover the first new segment may come: the successor first resumes
/// from the bucket — LATEST, its manifest, a listing of `gen/`, and one GET per segment shipped
/// past that manifest (to check it against the local WAL), of which there are many because
/// restore points are rare under a steady writer (see the ignored test below) — in a debug
/// build on a shared machine. Measured: 0.1–2.3 s.
const RESUME_ALLOWANCE: Duration = Duration::from_millis(3000);

const PREFIX: &str = "follow";

on_each_s3_server!(#[test] fn a_second_follower_waits_then_takes_over_within_a_ttl_and_a_third);
fn a_second_follower_waits_then_takes_over_within_a_ttl_and_a_third(server: &S3Server) {
    let endpoint = server.endpoint.clone();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(server.create_bucket("follow"));
    let s3 = server.client();
    let url = format!("s3://{bucket}/{PREFIX}");
    let (tmp, store, mut writer) = binary::store_being_written(RATE);
    let settings = FollowSettings {
        lease_ttl: TTL,
        wal_interval: Duration::from_millis(200),
        restore_point_interval: Duration::from_millis(1000),
    };
    let segments = || rt.block_on(segment_keys(&s3, &bucket));

    let mut first = Running::spawn(
        "first follower",
        binary::follower(&endpoint, &store, &url, &settings),
    );
    let (h, _) = first.wait_for_health("hold the lease", Duration::from_secs(20), |h| h.lease_held);
    let first_holder = h.lease_holder.clone();
    assert!(!first_holder.is_empty(), "no holder named: {h:?}");
    // It ships while it holds.
    let deadline = Instant::now() + Duration::from_secs(10);
    while segments().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first follower shipped no segment within 10 s; its output:\n{}",
            first.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut second = Running::spawn(
        "second follower",
        binary::follower(&endpoint, &store, &url, &settings),
    );
    let (h, _) = second.wait_for_health(
        "report the first follower as the lease holder",
        Duration::from_secs(20),
        |h| !h.lease_held && !h.lease_holder.is_empty(),
    );
    assert!(
        h.lease_holder.starts_with(&format!("{first_holder}@")),
        "the second follower names {:?} as the holder, not the first ({first_holder}): {h:?}",
        h.lease_holder
    );
    assert!(
        !h.healthy && h.reason.contains("held by another instance"),
        "{h:?}"
    );

    // For two TTLs both run: the second must not take the lease nor upload anything, while
    // the first keeps it and keeps shipping.
    let before = segments();
    let window = Instant::now() + 2 * TTL;
    let waits_quietly = |h: &Health| {
        assert!(
            !h.lease_held && h.objects_shipped == 0,
            "the second follower acted while the first holds the lease: {h:?}"
        );
        assert!(
            h.lease_holder.starts_with(&format!("{first_holder}@")),
            "the second follower names another holder: {h:?}"
        );
    };
    second.watch_until(window, waits_quietly);
    while let Some(line) = first.next_line(Instant::now()) {
        if let Some(h) = line.health() {
            assert!(h.lease_held, "the first follower let the lease go: {h:?}");
        }
    }
    let during = segments();
    assert!(
        during.len() > before.len(),
        "the first follower shipped nothing in {:?} ({} segments before and after)",
        2 * TTL,
        before.len()
    );

    // SIGKILL the first: the second takes over within TTL + TTL/3 and ships new segments.
    first.kill();
    let killed = Instant::now();
    let at_kill = segments();
    let (h, took_over) = second.wait_for_health(
        "take the lease over",
        TTL * 3 + Duration::from_secs(5),
        |h| {
            if !h.lease_held {
                assert_eq!(h.objects_shipped, 0, "shipped without the lease: {h:?}");
            }
            h.lease_held
        },
    );
    let takeover = took_over - killed;
    let mut new_segment = None;
    let deadline = killed + TTL * 3 + Duration::from_secs(5);
    while new_segment.is_none() {
        new_segment = segments().difference(&at_kill).next().cloned();
        if new_segment.is_none() {
            if Instant::now() > deadline {
                second.fail("shipped no new segment after the takeover");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let shipped = killed.elapsed();
    let resumed = shipped.saturating_sub(takeover);
    let bound = TTL + TTL / 3;
    eprintln!(
        "takeover: the second follower held the lease {takeover:?} after the SIGKILL of the first \
         (bound {bound:?} + {POLLING_ALLOWANCE:?}) and had shipped a new segment ({}) {shipped:?} after it, \
         {resumed:?} after the takeover (bound {RESUME_ALLOWANCE:?})",
        new_segment.as_deref().unwrap_or("?")
    );
    assert!(
        takeover <= bound + POLLING_ALLOWANCE,
        "the takeover took {takeover:?}, more than TTL + TTL/3 = {bound:?} + {POLLING_ALLOWANCE:?}: {h:?}"
    );
    if resumed > RESUME_ALLOWANCE {
        second.fail(&format!(
            "shipped its first new segment {resumed:?} after it took the lease over, more than \
             {RESUME_ALLOWANCE:?}"
        ));
    }
    assert!(
        h.lease_holder != first_holder && !h.lease_holder.is_empty(),
        "{h:?}"
    );

    // Stop the writer; then SIGTERM the second, which flushes, releases the lease, exits 0.
    writer.signal(libc::SIGTERM);
    let status = writer.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "the writer failed: {status}");
    let wrote = binary::json(&writer.stdout());
    let source = binary::store_digest(&store);
    assert_eq!(
        wrote["commit_seq"], source["commit_seq"],
        "{wrote} vs {source}"
    );
    let commits = source["commit_seq"].as_u64().expect("a commit_seq");
    assert!(commits > 1000, "the writer wrote only {commits} commits");

    second.signal(libc::SIGTERM);
    let stopping = Instant::now();
    let status = second.wait_exit(Duration::from_secs(30));
    let stopped_in = stopping.elapsed();
    eprintln!("the second follower exited {stopped_in:?} after SIGTERM ({status})");
    if !status.success() {
        second.fail(&format!("exited with {status} after SIGTERM"));
    }
    assert!(
        stopped_in <= Duration::from_secs(5),
        "the second follower took {stopped_in:?} to stop after SIGTERM"
    );
    let summary = binary::json(&second.stdout());
    assert_eq!(summary["shipped_commit_seq"], commits, "{summary}");
    assert_eq!(summary["restore_point_commit_seq"], commits, "{summary}");
    assert!(summary["objects_shipped"].as_u64() > Some(0), "{summary}");
    assert_eq!(summary["lease_acquisitions"], 1, "{summary}");
    let lease = rt.block_on(
        s3.head_object()
            .bucket(&bucket)
            .key(format!("{PREFIX}/lease"))
            .send(),
    );
    assert!(
        lease.is_err_and(|e| e.into_service_error().is_not_found()),
        "the lease object is still there after a clean shutdown"
    );

    // Every commit is in the bucket, and every restore point verifies.
    let verified = binary::verify_ok(&endpoint, &url, "after the clean shutdown");
    assert!(verified.latest.is_some(), "no LATEST: {verified:?}");
    let restored = binary::restore_digest(&endpoint, &url, &tmp.path().join("restored"));
    assert_eq!(restored, source, "the restore differs from the store");
    eprintln!(
        "{commits} commits restored; {} restore points; {} segments",
        verified.manifests.len(),
        segments().len()
    );
}

on_each_s3_server!(#[test] fn restore_points_keep_their_interval_under_a_steady_writer);
/// DESIGN.md section 5: a follower writes a restore point every `restore_point_interval`
/// (and as soon as a new generation's objects are up). Under a steady writer it does not:
/// `BackupWorker::step` ships a segment whenever durable data is unshipped and looks at the
/// restore point only when a step finds nothing to ship, which a writer committing faster than
/// a step takes rarely allows; the runner therefore ships one segment a tick and then writes a
/// due restore point (`tick_step` in `src/worker/runner/tick.rs`). This guards that.
fn restore_points_keep_their_interval_under_a_steady_writer(server: &S3Server) {
    let endpoint = server.endpoint.clone();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(server.create_bucket("follow-rp"));
    let url = format!("s3://{bucket}/{PREFIX}");
    let (_tmp, store, mut writer) = binary::store_being_written(RATE);
    let interval = Duration::from_millis(500);
    let settings = FollowSettings {
        lease_ttl: TTL,
        wal_interval: Duration::from_millis(200),
        restore_point_interval: interval,
    };
    let mut follower = Running::spawn(
        "follower",
        binary::follower(&endpoint, &store, &url, &settings),
    );
    let (_, held_at) =
        follower.wait_for_health("hold the lease", Duration::from_secs(20), |h| h.lease_held);
    let watched = Duration::from_secs(6);
    follower.watch_until(held_at + watched, |_| {});
    follower.kill();
    writer.signal(libc::SIGTERM);
    writer.wait_exit(Duration::from_secs(10));
    let verified = binary::verify_ok(&endpoint, &url, "after the follower");
    let expected = (watched.as_millis() / interval.as_millis()) as usize / 2;
    eprintln!(
        "{} restore points in {watched:?} with an interval of {interval:?}",
        verified.manifests.len()
    );
    assert!(
        verified.manifests.len() >= expected,
        "{} restore points in {watched:?} with an interval of {interval:?} (at least {expected} expected)",
        verified.manifests.len()
    );
}

/// Every segment key under the prefix (`.../wal/<start>-<end>.seg`).
async fn segment_keys(s3: &aws_sdk_s3::Client, bucket: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut pages = s3
        .list_objects_v2()
        .bucket(bucket)
        .prefix(format!("{PREFIX}/gen/"))
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.unwrap_or_else(|e| panic!("list {bucket}: {e:?}"));
        for o in page.contents() {
            if let Some(k) = o.key().filter(|k| k.ends_with(".seg")) {
                keys.insert(k.to_string());
            }
        }
    }
    keys
}
