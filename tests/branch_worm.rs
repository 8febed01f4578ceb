//! A branch of a write-once parent (`backup --object-lock compliance`) on real S3 servers with
//! Object Lock, moto and SeaweedFS: `branch --object-lock compliance` writes the write-once
//! layout (a pointer, no `LATEST`), creates every object once under a COMPLIANCE lock, holds
//! every parent object it names (and its pin) until the branch must be kept, restores
//! byte-identical to `restore --at` of the parent; the most aggressive retention of the parent
//! leaves it restoring; `branch delete --object-lock` creates the release and deletes nothing.
//! Counted at the server (its version listing records every write and every delete): no key
//! but the leases has a second version, no delete marker but theirs. Then retention reclaims.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::types::ObjectLockMode;
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::manifest::{self, Manifest};
use mushroom_backup::worker::RetentionPolicy;
use mushroom_backup::worker::retention_pass::pass;
use support::binary::{command, json, run_ok, store_digest};
use support::s3::create_locked_bucket;
use support::s3_servers::S3Server;

const T: Duration = Duration::from_secs(120);
const DAY: i64 = 24 * 3600;

fn run(server: &S3Server, name: &str, args: &[&str]) -> String {
    let mut cmd = command(&server.endpoint);
    cmd.args(args);
    run_ok(name, cmd, T)
}

fn restore(server: &S3Server, from: &str, into: &std::path::Path, at: Option<u64>) -> String {
    let mut cmd = command(&server.endpoint);
    cmd.args(["restore", "--json", "--progress", "none", "--from", from]);
    if let Some(n) = at {
        cmd.args(["--at", &n.to_string()]);
    }
    cmd.arg("--to").arg(into);
    run_ok("restore", cmd, T);
    store_digest(into).to_string()
}

/// Every key in the bucket with its count of versions, and the keys with delete markers.
async fn versions(client: &Client, bucket: &str) -> (BTreeMap<String, usize>, Vec<String>) {
    let (by_key, markers) = support::s3::object_versions(client, bucket, "").await;
    (
        by_key.into_iter().map(|(k, v)| (k, v.len())).collect(),
        markers,
    )
}

/// The retain-until date of `key` (unix seconds) under a COMPLIANCE lock.
async fn locked_until(client: &Client, bucket: &str, key: &str) -> i64 {
    let h = client
        .head_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .unwrap_or_else(|e| panic!("HEAD {key}: {e:?}"));
    assert_eq!(
        h.object_lock_mode(),
        Some(&ObjectLockMode::Compliance),
        "{key}"
    );
    h.object_lock_retain_until_date()
        .unwrap_or_else(|| panic!("{key} has no retain-until date"))
        .secs()
}

/// The lease keys: the one key a write-once writer rewrites and deletes.
fn is_lease(key: &str) -> bool {
    key.ends_with(&format!("/{}", manifest::LEASE_KEY))
}

async fn a_branch_of_a_write_once_parent_is_write_once(server: &S3Server) {
    let client = server.client();
    let name = create_locked_bucket(&client, "branch-worm").await;
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let parent = format!("s3://{name}/parent");
    let locked = ["--object-lock", "compliance"];
    for commits in [400, 300] {
        support::binary::write_store(&store, commits);
        let s = store.to_str().unwrap();
        run(
            server,
            "backup --once",
            &[
                &["backup", "--once", "--store", s, "--to", &parent][..],
                &locked,
            ]
            .concat(),
        );
    }
    let fork = 555;
    let expected = restore(server, &parent, &t.path().join("expected"), Some(fork));

    // The branch, holding what it names for 30 days (the parent's objects are locked for 8).
    let branch = format!("s3://{name}/branch");
    let started = mushroom_backup::units::unix_now_ms() / 1000;
    let report = json(&run(
        server,
        "branch --object-lock",
        &[
            &["branch", "--json", "--from", &parent, "--to", &branch][..],
            &["--at", "555", "--lock-days", "30"],
            &locked,
        ]
        .concat(),
    ));
    assert_eq!(report["commit_seq"], fork, "{report}");
    assert_eq!(
        restore(server, &branch, &t.path().join("branch"), None),
        expected
    );

    let (by_key, _) = versions(&client, &name).await;
    assert!(
        !by_key.contains_key("branch/LATEST"),
        "a write-once branch has no LATEST: {by_key:?}"
    );
    assert!(
        by_key
            .keys()
            .any(|k| k.starts_with(&format!("branch/{}", manifest::POINTERS_PREFIX))),
        "a write-once branch has a pointer: {by_key:?}"
    );
    let lineage = report["lineage"].as_str().unwrap();
    let pin = format!("parent/pins/{lineage}.json");
    let fork_manifest = format!("branch/{}", report["manifest"].as_str().unwrap());
    // Created under the branch's lock, and every parent object it names held as long.
    let held_until = started + 29 * DAY;
    for key in [&pin, &fork_manifest] {
        assert!(
            locked_until(&client, &name, key).await >= held_until,
            "{key}"
        );
    }
    let got = client
        .get_object()
        .bucket(&name)
        .key(&fork_manifest)
        .send()
        .await
        .unwrap();
    let body = got.body.collect().await.unwrap().into_bytes();
    let m = Manifest::decode(report["manifest"].as_str().unwrap(), &body).unwrap();
    assert!(m.objects().count() >= 3, "{m:?}");
    for o in m.objects() {
        let key = format!("parent/{}", o.key);
        assert!(
            locked_until(&client, &name, &key).await >= held_until,
            "{key}"
        );
    }

    // The most aggressive retention of the parent: the branch still restores.
    let raw: DynBucket = Arc::new(
        S3Bucket::new(client.clone(), &name, "parent", S3Options::default())
            .endpoint_named(&server.endpoint),
    );
    let aggressive = RetentionPolicy {
        keep_for: Duration::ZERO,
        keep_generations: 1,
        orphan_grace: Duration::ZERO,
        ..RetentionPolicy::default()
    };
    pass(&raw, &aggressive).await.unwrap();
    assert_eq!(
        restore(server, &branch, &t.path().join("after-retention"), None),
        expected
    );
    let (_, markers) = versions(&client, &name).await;

    // Deleted: a release created, nothing deleted, nothing rewritten.
    let deleted = json(&run(
        server,
        "branch delete --object-lock",
        &[
            &["branch", "delete", "--json", "--at", &branch][..],
            &locked,
        ]
        .concat(),
    ));
    assert_eq!(deleted["manifest_deleted"], false, "{deleted}");
    let release = format!("parent/pins/{lineage}.released");
    assert!(locked_until(&client, &name, &release).await >= started + 7 * DAY);
    let (after, after_markers) = versions(&client, &name).await;
    for (key, n) in &after {
        assert!(is_lease(key) || *n == 1, "rewritten: {key} ({n} versions)");
    }
    let new_markers: Vec<_> = after_markers
        .iter()
        .filter(|k| !is_lease(k) && !markers.contains(k))
        .collect();
    assert!(
        new_markers.is_empty(),
        "deleted by the branch: {new_markers:?}"
    );
    assert!(
        after.contains_key(&fork_manifest),
        "the fork manifest stays"
    );

    // The next retention reclaims what only the branch named: the parent's newest restore
    // point no longer names everything the fork did.
    let report = pass(&raw, &aggressive).await.unwrap();
    assert!(report.deleted > 0, "{report:?}");
    let listed = client
        .list_objects_v2()
        .bucket(&name)
        .prefix("parent/pins/")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.key_count(), Some(0), "{listed:?}");
}

on_each_s3_server!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_branch_of_a_write_once_parent_is_write_once
);
