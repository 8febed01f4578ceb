//! A write-once prefix (issue 29) on real S3 servers with Object Lock, moto and SeaweedFS: a
//! worker backs up with `--object-lock compliance`, writes several restore points, runs
//! retention, crashes holding its lease, and a second worker takes the lease over and goes
//! on. Counted at the server afterwards (its version listing, which records every write and
//! every delete): no key but the lease has a second version or a delete marker, every object
//! carries a COMPLIANCE retention, the pointers count one per restore point; every restore
//! point verifies and restores. Then the attack with the writer's credentials: what each
//! server refuses is asserted, and after it the newest restore point still verifies and
//! restores, and every locked version is still there.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::types::{ObjectLockMode, ObjectLockRetention, ObjectLockRetentionMode};
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::write_once::LockMode;
use mushroom_backup::lease::{Acquisition, BucketLease, LeaseAcquirer, LeaseConfig};
use mushroom_backup::manifest::{self, MANIFESTS_PREFIX};
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::verify::{self, VerifyOptions};
use mushroom_backup::worker::WorkerConfig;
use support::s3::create_locked_bucket;
use support::s3_servers::{Kind, S3Server};
use support::store::{config, digest, worker, write};

const PREFIX: &str = "root";
const TTL: Duration = Duration::from_secs(2);

/// The prefix `prefix` of the bucket `name` on `server`, as the writer's credentials see it.
fn prefix_of(server: &S3Server, name: &str, prefix: &str) -> DynBucket {
    Arc::new(
        S3Bucket::new(server.client(), name, prefix, S3Options::default())
            .endpoint_named(&server.endpoint),
    )
}

fn lease_config(holder: &str) -> LeaseConfig {
    LeaseConfig {
        ttl: TTL,
        holder: holder.into(),
        host: format!("host-of-{holder}"),
        store: "worm".into(),
        conditional: true,
        coalesce: false,
    }
}

/// The lease, once the one there (if any) has gone unrenewed for its TTL.
async fn take_lease(bucket: DynBucket, holder: &str) -> BucketLease {
    let mut acquirer = LeaseAcquirer::new(bucket, lease_config(holder));
    let deadline = tokio::time::Instant::now() + 20 * TTL;
    loop {
        match acquirer.try_acquire().await.expect("lease attempt") {
            Acquisition::Acquired(lease) => return lease,
            Acquisition::HeldElsewhere { retry_in, .. } => {
                assert!(tokio::time::Instant::now() < deadline, "never taken over");
                tokio::time::sleep(retry_in).await;
            }
        }
    }
}

fn locked_config() -> WorkerConfig {
    let mut c = config();
    c.object_lock = Some(LockMode::Compliance);
    c.retention.keep_for = Duration::from_secs(60);
    c
}

/// Every version and delete marker under the prefix, by key: the version ids of each,
/// and the keys with delete markers.
async fn versions(client: &Client, bucket: &str) -> (BTreeMap<String, Vec<String>>, Vec<String>) {
    support::s3::object_versions(client, bucket, &format!("{PREFIX}/")).await
}

on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_write_once_prefix_is_never_rewritten_and_survives_the_writers_keys);
async fn a_write_once_prefix_is_never_rewritten_and_survives_the_writers_keys(server: &S3Server) {
    let client = server.client();
    let name = create_locked_bucket(&client, "worm").await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");

    // Writer a: three runs under its lease, a restore point each, retention on the last.
    let mut a = worker(&store, raw.clone(), locked_config());
    let lease_a = take_lease(a.bucket(), "a").await;
    let mut points = Vec::new();
    for round in 0..3 {
        write(&store, 400, 500, 8 << 10);
        if round == 2 {
            a.request_retention();
        }
        let r = a.run_once_under(&lease_a).await.unwrap().unwrap();
        assert_eq!(r.deleted, 0, "a write-once worker deletes nothing");
        points.push(r.restore_point.expect("a restore point"));
    }
    // a crashes holding the lease; b takes it over once it has gone unrenewed for its TTL.
    drop(lease_a);
    drop(a);
    let mut b = worker(&store, raw.clone(), locked_config());
    let lease_b = take_lease(b.bucket(), "b").await;
    for _ in 0..2 {
        write(&store, 400, 500, 8 << 10);
        b.request_retention();
        let r = b.run_once_under(&lease_b).await.unwrap().unwrap();
        assert_eq!(r.deleted, 0);
        points.push(r.restore_point.expect("a restore point"));
    }
    lease_b.release().await.unwrap();
    let want = digest(&store);
    assert_eq!(points.last(), Some(&want.commit_seq));

    // Counted at the server: one version of every key but the lease, no delete marker but
    // the lease's release.
    let (by_key, markers) = versions(&client, &name).await;
    let lease_key = format!("{PREFIX}/{}", manifest::LEASE_KEY);
    let rewritten: Vec<_> = by_key
        .iter()
        .filter(|(k, v)| **k != lease_key && v.len() > 1)
        .collect();
    assert!(
        rewritten.is_empty(),
        "rewritten by the writer: {rewritten:?}"
    );
    assert!(
        markers.iter().all(|k| *k == lease_key),
        "deleted by the writer: {markers:?}"
    );
    assert!(
        !by_key.contains_key(&format!("{PREFIX}/{}", manifest::LATEST_KEY)),
        "a write-once prefix has no LATEST"
    );
    let pointers: Vec<&String> = by_key
        .keys()
        .filter(|k| k.starts_with(&format!("{PREFIX}/{}", manifest::POINTERS_PREFIX)))
        .collect();
    assert_eq!(
        pointers.len(),
        points.len(),
        "one pointer per restore point"
    );
    let manifests = by_key
        .keys()
        .filter(|k| k.starts_with(&format!("{PREFIX}/{MANIFESTS_PREFIX}")))
        .count();
    assert_eq!(manifests, points.len());
    // Every object the writer created carries a COMPLIANCE retention past the lock period.
    let floor = aws_smithy_types::DateTime::from_secs(
        i64::try_from(
            (std::time::SystemTime::now() + Duration::from_secs(23 * 3600))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        )
        .unwrap(),
    );
    for key in by_key.keys().filter(|k| **k != lease_key) {
        let h = client
            .head_object()
            .bucket(&name)
            .key(key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            h.object_lock_mode(),
            Some(&ObjectLockMode::Compliance),
            "{key}"
        );
        let until = h
            .object_lock_retain_until_date()
            .expect("a retain-until date");
        assert!(
            until.secs() >= floor.secs(),
            "{key} retained only until {until}"
        );
    }

    // Every restore point verifies and restores; the newest to the store as it is.
    let read: DynBucket = raw.clone();
    let v = verify::verify(read.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok, "{v}");
    assert_eq!(v.manifests.len(), points.len());
    let latest = v.latest.as_ref().expect("the pointer is read");
    assert_eq!(latest.commit_seq, Some(want.commit_seq), "{v}");
    for &at in &points {
        let out = t.path().join(format!("at-{at}"));
        let opts = RestoreOptions {
            at: Some(at),
            ..RestoreOptions::default()
        };
        let r = restore::restore(read.as_ref(), &out, &opts).await.unwrap();
        assert_eq!(r.commit_seq, at);
    }
    let out = t.path().join("newest");
    restore::restore(read.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap();
    assert_eq!(digest(&out), want);

    // The attack, with the writer's own credentials, on a manifest, the newest pointer and a
    // data object: deleting a locked version and shortening or weakening its retention.
    let newest_pointer = pointers.first().map(|k| k.to_string()).unwrap();
    let newest_manifest = format!("{PREFIX}/{}", manifest::manifest_key(want.commit_seq));
    let data = by_key
        .keys()
        .find(|k| k.starts_with(&format!("{PREFIX}/{}", manifest::GEN_PREFIX)))
        .unwrap()
        .clone();
    let mut refused = BTreeMap::new();
    for key in [&newest_manifest, &newest_pointer, &data] {
        let version = by_key[key][0].as_str();
        let at = |bypass| {
            client
                .delete_object()
                .bucket(&name)
                .key(key)
                .version_id(version)
                .bypass_governance_retention(bypass)
        };
        let deleted = at(false).send().await.is_err();
        refused.insert(format!("delete a locked version of {key}"), deleted);
        let bypassed = at(true).send().await.is_err();
        refused.insert(format!("delete with governance bypass of {key}"), bypassed);
        let retain = |mode, until| {
            client
                .put_object_retention()
                .bucket(&name)
                .key(key)
                .version_id(version)
                .retention(
                    ObjectLockRetention::builder()
                        .mode(mode)
                        .retain_until_date(until)
                        .build(),
                )
        };
        let earlier = aws_smithy_types::DateTime::from_secs(floor.secs() - 20 * 3600);
        let shortened = retain(ObjectLockRetentionMode::Compliance, earlier);
        let shortened = shortened.send().await.is_err();
        refused.insert(format!("shorten the retention of {key}"), shortened);
        let weakened = retain(ObjectLockRetentionMode::Governance, floor);
        let weakened = weakened.send().await.is_err();
        refused.insert(
            format!("weaken the retention of {key} to GOVERNANCE"),
            weakened,
        );
    }
    let suspend = client
        .put_bucket_versioning()
        .bucket(&name)
        .versioning_configuration(
            aws_sdk_s3::types::VersioningConfiguration::builder()
                .status(aws_sdk_s3::types::BucketVersioningStatus::Suspended)
                .build(),
        )
        .send()
        .await;
    refused.insert("suspend versioning".into(), suspend.is_err());
    eprintln!("{:?}: what the bucket refused of the attack:", server.kind);
    for (what, no) in &refused {
        eprintln!("  {}: {what}", if *no { "REFUSED" } else { "allowed" });
    }
    // What each server enforces (probed by hand and held here): both refuse every delete of
    // a COMPLIANCE version; moto lets its retention be shortened or weakened and versioning be
    // suspended, SeaweedFS refuses those too.
    for (what, no) in &refused {
        let must = what.starts_with("delete")
            || server.kind == Kind::SeaweedFs
            || !(what.starts_with("shorten")
                || what.starts_with("weaken")
                || what.starts_with("suspend"));
        if must {
            assert!(no, "{:?} allowed: {what}", server.kind);
        }
    }

    // After the attack: every version still there, the newest restore point verifies and
    // restores to the store.
    let (after, markers_after) = versions(&client, &name).await;
    assert_eq!(after, by_key, "a locked version went");
    assert_eq!(markers_after, markers);
    let v = verify::verify(read.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok, "{v}");
    let out = t.path().join("after-attack");
    restore::restore(read.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap();
    assert_eq!(digest(&out), want);
}

// A prefix holds one form of the pointer: a write-once worker refuses a prefix written in the
// mutable form (a LATEST), and a mutable worker a write-once prefix.
on_each_s3_server!(#[tokio::test] async fn a_write_once_worker_refuses_a_mutable_prefix);
async fn a_write_once_worker_refuses_a_mutable_prefix(server: &S3Server) {
    let client = server.client();
    let name = create_locked_bucket(&client, "worm-mixed").await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 300, 500, 8 << 10);
    // A mutable backup first: LATEST.
    worker(&store, raw.clone(), config())
        .run_once()
        .await
        .unwrap();
    assert!(raw.head(manifest::LATEST_KEY).await.unwrap().is_some());
    write(&store, 100, 500, 8 << 10);
    let e = worker(&store, raw.clone(), locked_config())
        .run_once()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("mutable form"), "{e}");
    // And a write-once prefix is refused by a mutable writer.
    let other = t.path().join("o");
    write(&other, 300, 500, 8 << 10);
    let locked = prefix_of(server, &name, "other");
    worker(&other, locked.clone(), locked_config())
        .run_once()
        .await
        .unwrap();
    write(&other, 100, 500, 8 << 10);
    let e = worker(&other, locked, config())
        .run_once()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("write-once form"), "{e}");
}

/// The requests of `rounds` rounds of 200 commits shipped and a restore point written, then
/// of two idle steps, in a fresh prefix of `bucket` (the worker's own counts).
async fn requests_of(
    bucket: DynBucket,
    config: WorkerConfig,
    rounds: u64,
) -> (
    mushroom_backup::bucket::counting::RequestCountsSnapshot,
    u64,
) {
    use mushroom_backup::worker::StepOutcome;
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 100, 500, 8 << 10);
    let mut w = worker(&store, bucket, config);
    w.run_once().await.unwrap();
    let counts = w.counters().requests.clone();
    let start = counts.snapshot();
    for _ in 0..rounds {
        write(&store, 200, 500, 8 << 10);
        w.request_restore_point();
        while !matches!(w.step().await.unwrap(), StepOutcome::Idle) {}
    }
    let busy = counts.snapshot().since(&start);
    let before_idle = counts.snapshot();
    for _ in 0..2 {
        assert!(matches!(w.step().await.unwrap(), StepOutcome::Idle));
    }
    (busy, counts.snapshot().since(&before_idle).total)
}

// The write-once layout's request cost against the mutable one's, for one workload: shipping
// and restore points cost the same (a pointer's create for LATEST's rewrite), idle steps
// nothing in either.
on_each_s3_server!(#[tokio::test] async fn the_write_once_layout_costs_what_the_mutable_one_does);
async fn the_write_once_layout_costs_what_the_mutable_one_does(server: &S3Server) {
    let client = server.client();
    let name = create_locked_bucket(&client, "worm-cost").await;
    let at = |prefix| prefix_of(server, &name, prefix);
    let (mutable, mutable_idle) = requests_of(at("mutable"), config(), 10).await;
    let (locked, locked_idle) = requests_of(at("locked"), locked_config(), 10).await;
    eprintln!(
        "{:?}: 10 rounds of 200 commits and a restore point: mutable {mutable:?}, write-once \
         {locked:?}; idle steps: {mutable_idle} and {locked_idle} requests",
        server.kind
    );
    assert_eq!((mutable_idle, locked_idle), (0, 0));
    assert!(
        locked.total * 10 <= mutable.total * 11,
        "write-once {} requests against mutable {}",
        locked.total,
        mutable.total
    );
    assert_eq!(locked.delete, 0);
    // And the eleven restore points of that run, reusing the generation's objects, all hold.
    let now = mushroom_backup::units::unix_now_ms();
    let c = mushroom_backup::verify::immutable::check_immutable(at("locked").as_ref(), now, 4)
        .await
        .unwrap();
    eprintln!("{:?}: {c} ({} requests)", server.kind, c.requests);
    assert!(c.ok && c.kept == 11, "{c}");
}

/// Every key of `keys` in `raw` is locked until at least three days from now (less a minute).
async fn assert_held_three_days(raw: &DynBucket, keys: &[impl AsRef<str>]) {
    let floor = mushroom_backup::units::unix_now_ms() + 3 * 24 * 3600 * 1000 - 60_000;
    for key in keys.iter().map(AsRef::as_ref) {
        let lock = raw.head(key).await.unwrap().unwrap().lock.expect("locked");
        assert!(
            lock.until_ms >= floor,
            "{key} held only until {}",
            lock.until_ms
        );
    }
}

/// A new Object Lock bucket named after `hint` whose write-once prefix holds two restore
/// points of a store in a temp dir: the bucket's name, the prefix, the temp dir and the store.
async fn two_locked_restore_points(
    server: &S3Server,
    hint: &str,
) -> (String, DynBucket, tempfile::TempDir, std::path::PathBuf) {
    let name = create_locked_bucket(&server.client(), hint).await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let mut w = worker(&store, raw.clone(), locked_config());
    for _ in 0..2 {
        write(&store, 300, 500, 8 << 10);
        w.run_once().await.unwrap();
    }
    drop(w);
    (name, raw, t, store)
}

// `verify --immutable`: every object of a write-once prefix is locked at least until the
// restore points naming it must be kept; a newer unlocked version an attacker adds over a data
// object (or a prefix written without locks) is named, and the command fails.
on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn verify_immutable_names_each_object_short_of_its_date);
async fn verify_immutable_names_each_object_short_of_its_date(server: &S3Server) {
    use mushroom_backup::verify::immutable::check_immutable;
    let client = server.client();
    let (name, raw, t, _) = two_locked_restore_points(server, "worm-imm").await;
    let now = mushroom_backup::units::unix_now_ms();
    let c = check_immutable(raw.as_ref(), now, 4).await.unwrap();
    eprintln!("{:?}: {c}", server.kind);
    assert!(c.ok, "{c}");
    assert_eq!((c.kept, c.expired), (2, 0), "{c}");
    assert!(c.objects > 2, "{c}");
    // 1 LIST, a HEAD and a GET per manifest, a HEAD per other object.
    assert_eq!(c.requests, 1 + 2 * 2 + (c.objects as u64 - 2), "{c}");
    let url = format!("s3://{name}/{PREFIX}");
    let (ok, out) = cli(server, &["verify", "--from", &url, "--immutable"]);
    assert!(
        ok && out.contains("is locked as long as it must be"),
        "{out}"
    );
    // Two days on, neither restore point is kept any more: nothing to hold.
    let later = now + 2 * 24 * 3600 * 1000;
    let c = check_immutable(raw.as_ref(), later, 4).await.unwrap();
    assert!(c.ok && c.kept == 0 && c.expired == 2, "{c}");

    // The attacker puts a newer, unlocked version over a data object (same bytes, so a plain
    // verify still passes): the current version is no longer locked.
    let (by_key, _) = versions(&client, &name).await;
    let data = by_key
        .keys()
        .find(|k| {
            k.starts_with(&format!("{PREFIX}/{}", manifest::GEN_PREFIX)) && k.contains("/wal/")
        })
        .expect("a segment")
        .clone();
    let bytes = client
        .get_object()
        .bucket(&name)
        .key(&data)
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    client
        .put_object()
        .bucket(&name)
        .key(&data)
        .body(bytes.into())
        .send()
        .await
        .unwrap();
    let c = check_immutable(raw.as_ref(), now, 4).await.unwrap();
    eprintln!("{:?}: after the attack: {c}", server.kind);
    assert!(!c.ok, "{c}");
    let ours = data.strip_prefix(&format!("{PREFIX}/")).unwrap();
    let named: Vec<&str> = c.short.iter().map(|s| s.key.as_str()).collect();
    assert!(named.contains(&ours), "{ours} not named: {c}");
    assert!(c.short.iter().all(|s| s.retained_until_ms.is_none()), "{c}");
    let (ok, out) = cli(server, &["verify", "--from", &url, "--immutable"]);
    assert!(!ok, "verify --immutable passed after the attack: {out}");
    assert!(
        out.contains(&format!("SHORT {ours}: no Object Lock retention")),
        "{out}"
    );

    // A prefix written by a mutable writer has no keep date to read: each manifest is named.
    let mutable = prefix_of(server, &name, "mutable");
    let other = t.path().join("o");
    write(&other, 300, 500, 8 << 10);
    worker(&other, mutable.clone(), config())
        .run_once()
        .await
        .unwrap();
    let c = check_immutable(mutable.as_ref(), now, 4).await.unwrap();
    assert!(!c.ok && c.problems.len() == 1, "{c}");
    assert!(c.problems[0].contains("no Object Lock retention"), "{c}");
}

/// The manifest of the restore point at `commit_seq`, read from the bucket.
async fn manifest_at(bucket: &DynBucket, commit_seq: u64) -> manifest::Manifest {
    let key = manifest::manifest_key(commit_seq);
    let obj = bucket.get(&key).await.unwrap();
    manifest::Manifest::decode(&key, &obj.data).unwrap()
}

// A restore point that reuses objects locked for an earlier one holds them until it must be
// kept itself: a writer whose policy keeps restore points three days reuses what one keeping
// them a minute wrote (the same as objects growing older than their lock's slack), extends
// each reused lock once (a HEAD first: it never wrote them), and `verify --immutable` passes;
// its next restore point costs no request more for them.
on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn reused_objects_are_held_until_the_newest_restore_point_must_be_kept);
async fn reused_objects_are_held_until_the_newest_restore_point_must_be_kept(server: &S3Server) {
    use mushroom_backup::verify::immutable::check_immutable;
    let client = server.client();
    let name = create_locked_bucket(&client, "worm-hold").await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 300, 500, 8 << 10);
    let first = worker(&store, raw.clone(), locked_config())
        .run_once()
        .await
        .unwrap()
        .restore_point
        .expect("a restore point");
    let mut longer = locked_config();
    longer.retention.keep_for = Duration::from_secs(3 * 24 * 3600);
    let mut b = worker(&store, raw.clone(), longer);
    write(&store, 100, 500, 8 << 10);
    let second = b.run_once().await.unwrap().restore_point.unwrap();
    let (m1, m2) = (
        manifest_at(&raw, first).await,
        manifest_at(&raw, second).await,
    );
    let old: std::collections::BTreeSet<&str> = m1.objects().map(|o| o.key.as_str()).collect();
    let reused: Vec<&str> = m2
        .objects()
        .map(|o| o.key.as_str())
        .filter(|k| old.contains(k))
        .collect();
    let holds = b.counters().immutable.clone();
    eprintln!(
        "{:?}: restore point {second} reuses {} objects of {first}: {} HEADs, {} extensions",
        server.kind,
        reused.len(),
        holds.heads(),
        holds.extensions()
    );
    assert!(!reused.is_empty(), "nothing reused: the test shows nothing");
    assert_eq!(holds.extensions(), reused.len() as u64);
    assert_eq!(holds.heads(), reused.len() as u64);
    assert_held_three_days(&raw, &reused).await;
    let c = check_immutable(raw.as_ref(), mushroom_backup::units::unix_now_ms(), 4)
        .await
        .unwrap();
    eprintln!("{:?}: {c}", server.kind);
    assert!(c.ok && c.kept == 2, "{c}");
    // The next restore point: everything is held late enough already, in memory.
    write(&store, 100, 500, 8 << 10);
    b.run_once().await.unwrap().restore_point.unwrap();
    assert_eq!(holds.extensions(), reused.len() as u64);
    assert_eq!(holds.heads(), reused.len() as u64);
    let short = holds.short.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(short, 0);
}

/// Runs the binary's `args` against `server`; its success and stdout.
fn cli(server: &S3Server, args: &[&str]) -> (bool, String) {
    let out = support::binary::command(&server.endpoint)
        .args(args)
        .output()
        .expect("run the binary");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "{args:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), stdout)
}

// `--bucket-as-of TIME`: after an attacker with the writer's keys puts newer versions over the
// newest manifest and a segment, delete markers over the newest pointer and an older manifest,
// and a forged LATEST, the prefix read as of a moment before the attack verifies, lists and
// restores as before it (library and CLI); read so, the bucket refuses every write.
on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn a_prefix_read_as_of_before_the_attack_restores_as_before_it);
async fn a_prefix_read_as_of_before_the_attack_restores_as_before_it(server: &S3Server) {
    use mushroom_backup::bucket::{Body, PutCondition};
    let client = server.client();
    let (name, raw, t, store) = two_locked_restore_points(server, "worm-asof").await;
    let want = digest(&store);
    // The servers stamp versions to the second: the instant is a second clear of both sides.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let at_ms = mushroom_backup::units::unix_now_ms();
    let at = mushroom_backup::units::rfc3339_ms(at_ms);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let (by_key, _) = versions(&client, &name).await;
    let under = |p: &str| format!("{PREFIX}/{p}");
    let newest_pointer = by_key
        .keys()
        .find(|k| k.starts_with(&under(manifest::POINTERS_PREFIX)))
        .unwrap()
        .clone();
    let manifests: Vec<&String> = by_key
        .keys()
        .filter(|k| k.starts_with(&under(MANIFESTS_PREFIX)))
        .collect();
    let segment = by_key
        .keys()
        .find(|k| k.starts_with(&under(manifest::GEN_PREFIX)) && k.contains("/wal/"))
        .unwrap()
        .clone();
    let newest_manifest = under(&manifest::manifest_key(want.commit_seq));
    for key in [&newest_manifest, &segment, &under(manifest::LATEST_KEY)] {
        client
            .put_object()
            .bucket(&name)
            .key(key)
            .body(b"ransom".to_vec().into())
            .send()
            .await
            .unwrap();
    }
    for key in [&newest_pointer, manifests[0]] {
        client
            .delete_object()
            .bucket(&name)
            .key(key)
            .send()
            .await
            .unwrap();
    }
    let v = verify::verify(raw.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(
        !v.ok,
        "the attack changed nothing the current versions show: {v}"
    );

    let before: DynBucket = Arc::new(
        S3Bucket::new(server.client(), &name, PREFIX, S3Options::default())
            .endpoint_named(&server.endpoint)
            .as_of(at_ms),
    );
    let v = verify::verify(before.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok && v.manifests.len() == 2, "{v}");
    let out = t.path().join("as-of");
    restore::restore(before.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap();
    assert_eq!(digest(&out), want);
    let e = before
        .put("x", Body::from(vec![1]), PutCondition::IfNoneMatch)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("read-only"), "{e}");

    let url = format!("s3://{name}/{PREFIX}");
    let cli_out = t.path().join("cli-as-of");
    let to = cli_out.to_str().unwrap();
    let (ok, _) = cli(
        server,
        &["restore", "--from", &url, "--to", to, "--bucket-as-of", &at],
    );
    assert!(ok);
    assert_eq!(digest(&cli_out), want);
    let (ok, listed) = cli(
        server,
        &["ls", "--from", &url, "--bucket-as-of", &at, "--json"],
    );
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert!(ok && listed.len() == 2, "{listed:?}");
    let (ok, _) = cli(server, &["verify", "--from", &url, "--bucket-as-of", &at]);
    assert!(ok);
    let (ok, _) = cli(server, &["verify", "--from", &url]);
    assert!(!ok, "the prefix as it is now verifies after the attack");
}

// Health reports the worker's check of each restore point it writes: a running worker that
// reuses objects another wrote (locked for a shorter policy) extends their locks and its store
// health shows the check, none short; where the bucket refuses the extensions, the store is
// unhealthy, counting the objects short of their date.
on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn health_reports_the_immutability_check);
async fn health_reports_the_immutability_check(server: &S3Server) {
    let i = immutability_health(server, false).await;
    assert!(i.objects_short == 0 && i.lock_extensions > 0, "{i:?}");
    assert!(i.lock_heads >= i.lock_extensions, "{i:?}");
    // `Hooked` passes on every request but PutObjectRetention, which it leaves to the trait's
    // default: refused, as by a bucket whose policy denies it.
    let i = immutability_health(server, true).await;
    assert!(i.objects_short > 0, "{i:?}");
}

/// The health of a running worker's store after its first restore point, which reuses objects
/// locked for a shorter policy, the extensions refused when `refuse`.
async fn immutability_health(
    server: &S3Server,
    refuse: bool,
) -> mushroom_backup::health::ImmutableHealth {
    let name = create_locked_bucket(&server.client(), "worm-health").await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 300, 500, 8 << 10);
    worker(&store, raw.clone(), locked_config())
        .run_once()
        .await
        .unwrap();
    let mut longer = locked_config();
    longer.retention.keep_for = Duration::from_secs(3 * 24 * 3600);
    write(&store, 100, 500, 8 << 10);
    let bucket: DynBucket = match refuse {
        true => Arc::new(support::hooked::Hooked {
            inner: raw,
            hook: |_, _: &str| {},
        }),
        false => raw,
    };
    let tasks = tokio_util::task::TaskTracker::new();
    let running = worker(&store, bucket, longer).spawn(
        lease_config("running"),
        tokio_util::sync::CancellationToken::new(),
        &tasks,
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let h = loop {
        let h = running.health();
        if h.restore_point_commit_seq == 400 && h.immutable.is_some() {
            break h;
        }
        assert!(tokio::time::Instant::now() < deadline, "{h:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    running.shutdown(false).await;
    let i = h.immutable.unwrap();
    eprintln!("{:?} (refused: {refuse}): {i:?}; {}", server.kind, h.reason);
    assert_eq!(h.healthy, !refuse, "{h:#?}");
    if refuse {
        assert!(h.reason.contains("locked for less time than"), "{h:#?}");
    }
    i
}

// An encrypted write-once prefix: the wrappers of a generation's data key are held with the
// objects a restore point reuses (without one nothing decrypts), and `verify --immutable`
// checks them too.
on_each_s3_server!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn an_encrypted_restore_point_holds_its_wrapped_keys);
async fn an_encrypted_restore_point_holds_its_wrapped_keys(server: &S3Server) {
    use mushroom_backup::crypto::{Encryption, WriterEncryption, key_objects};
    use mushroom_backup::verify::immutable::check_immutable;
    let (wrap, unwrap) = support::keks::key_file_kek();
    let encrypted = |mut c: WorkerConfig| {
        c.encryption = WriterEncryption {
            keys: Some(Encryption {
                wrap: vec![wrap.clone()],
                unwrap: vec![unwrap.clone()],
                warnings: Vec::new(),
            }),
            allow_mixed: false,
        };
        c
    };
    let name = create_locked_bucket(&server.client(), "worm-sealed").await;
    let raw = prefix_of(server, &name, PREFIX);
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 300, 500, 8 << 10);
    worker(&store, raw.clone(), encrypted(locked_config()))
        .run_once()
        .await
        .unwrap();
    let mut longer = encrypted(locked_config());
    longer.retention.keep_for = Duration::from_secs(3 * 24 * 3600);
    write(&store, 100, 500, 8 << 10);
    worker(&store, raw.clone(), longer)
        .run_once()
        .await
        .unwrap()
        .restore_point
        .unwrap();
    let wrappers: Vec<String> = mushroom_backup::bucket::list_all(raw.as_ref(), "gen/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| key_objects::is_wrapper_key(k))
        .collect();
    assert!(!wrappers.is_empty());
    assert_held_three_days(&raw, &wrappers).await;
    let c = check_immutable(raw.as_ref(), mushroom_backup::units::unix_now_ms(), 4)
        .await
        .unwrap();
    eprintln!("{:?}: {c} ({} requests)", server.kind, c.requests);
    assert!(c.ok, "{c}");
}
