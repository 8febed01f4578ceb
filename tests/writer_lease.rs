//! Every writer of a prefix takes its bucket lease (issue 25 part 3), through the real binary
//! on moto and on SeaweedFS: `backup --once` beside a running `serve` that holds the store (paused, so that the
//! service itself uploads nothing meanwhile, then running) is refused naming the service's
//! instance, writes nothing to the prefix, and leaves the service's store healthy; alone, it
//! takes the lease, releases it at its end, and a second run right after succeeds.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{self, Bucket, BucketError};
use mushroom_backup::manifest::LEASE_KEY;
use support::binary::{self, Running};
use support::s3_servers::S3Server;
use support::served::{self, DEADLINE, client, wait_health};

const PREFIX: &str = "store";

/// On `server`, a fresh bucket: the endpoint, the URL of [`PREFIX`] in it, and that prefix as
/// a bucket to look at.
async fn fresh_prefix(server: &S3Server, hint: &str) -> Option<(String, String, S3Bucket)> {
    let name = server.create_bucket(hint).await;
    let url = format!("s3://{name}/{PREFIX}");
    let prefix = S3Bucket::new(server.client(), &name, PREFIX, S3Options::default());
    Some((server.endpoint.clone(), url, prefix))
}

/// Every object of the prefix, with its ETag.
async fn listing(b: &S3Bucket) -> BTreeMap<String, String> {
    bucket::list_all(b, "")
        .await
        .expect("list the prefix")
        .into_iter()
        .map(|o| (o.key, o.etag))
        .collect()
}

/// `backup --store DIR --to URL --once` against moto: whether it exited 0, its stdout and its
/// stderr.
fn backup_once(endpoint: &str, dir: &Path, url: &str) -> (bool, String, String) {
    let mut cmd = binary::command(endpoint);
    cmd.arg("backup")
        .arg("--store")
        .arg(dir)
        .args(["--to", url, "--once"]);
    let mut child = Running::spawn("backup --once", cmd);
    let status = child.wait_exit(DEADLINE);
    (status.success(), child.stdout(), served::stderr(&child))
}

on_each_s3_server!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn backup_once_beside_a_serve_holding_the_store_is_refused_naming_it_and_writes_nothing
);
async fn backup_once_beside_a_serve_holding_the_store_is_refused_naming_it_and_writes_nothing(
    server: &S3Server,
) {
    let Some((endpoint, url, prefix)) = fresh_prefix(server, "once-beside-serve").await else {
        return;
    };
    let d = served::dirs();
    let dir = d.root.join("store");
    support::store::write(&dir, 10, 0, 0);
    let mut serve = served::fast_serve(&d, &["--instance-id", "svc-a"]);
    serve.env("AWS_ENDPOINT_URL", &endpoint);
    let (server, addr) = served::start("serve", serve);
    let c = client(addr).await;
    let id = c
        .clone()
        .register(support::register_req(&dir, &url))
        .await
        .unwrap_or_else(|e| server.fail(&format!("Register: {e}")))
        .into_inner()
        .store_id;
    let held = wait_health(
        &c,
        &id,
        "10 commits in a restore point, holding the lease",
        |h| h.healthy && h.lease_held && h.restore_point_commit_seq == 10,
    )
    .await;

    // Paused, the service uploads nothing; the store gets commits only a backup would ship.
    served::pause(&c, &id, "a hand backup is tried").await;
    support::store::write(&dir, 20, 0, 0);
    let before = listing(&prefix).await;
    assert!(before.contains_key(LEASE_KEY), "{before:?}");
    let (ok, out, err) = backup_once(&endpoint, &dir, &url);
    assert!(
        !ok,
        "backup --once beside a paused serve exited 0: {out}\n{err}"
    );
    assert!(
        err.contains("refused")
            && err.contains("bucket lease is held by svc-a/")
            && err.contains(&format!("(store {id})")),
        "the refusal does not name the service's instance and store: {err}"
    );
    assert_eq!(
        listing(&prefix).await,
        before,
        "a refused backup --once changed the prefix"
    );

    // Running, the service ships the commits; a backup --once meanwhile is refused too.
    served::resume(&c, &id).await;
    wait_health(&c, &id, "30 commits in a restore point", |h| {
        h.healthy && !h.paused && h.restore_point_commit_seq == 30
    })
    .await;
    let (ok, out, err) = backup_once(&endpoint, &dir, &url);
    assert!(
        !ok,
        "backup --once beside a running serve exited 0: {out}\n{err}"
    );
    assert!(err.contains("bucket lease is held by svc-a/"), "{err}");
    support::store::write(&dir, 5, 0, 0);
    let h = wait_health(&c, &id, "35 commits in a restore point", |h| {
        h.restore_point_commit_seq == 35
    })
    .await;
    assert!(h.healthy && h.lease_held, "{h:?}");
    assert_eq!(
        h.lease_holder, held.lease_holder,
        "the service lost its lease"
    );
    let digest = binary::restore_digest(&endpoint, &url, &d.base.join("restored"));
    assert_eq!(digest, binary::store_digest(&dir));
}

on_each_s3_server!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn backup_once_alone_takes_the_lease_and_releases_it_at_its_end
);
async fn backup_once_alone_takes_the_lease_and_releases_it_at_its_end(server: &S3Server) {
    let Some((endpoint, url, prefix)) = fresh_prefix(server, "once-alone").await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    support::store::write(&dir, 10, 0, 0);
    for (round, commits) in [(1, 10), (2, 15)] {
        if round == 2 {
            support::store::write(&dir, 5, 0, 0);
        }
        let (ok, out, err) = backup_once(&endpoint, &dir, &url);
        assert!(ok, "backup --once, run {round}: {out}\n{err}");
        let summary = binary::json(&out);
        assert_eq!(summary["lease_acquisitions"], 1, "run {round}: {summary}");
        assert_eq!(
            summary["restore_point_commit_seq"], commits,
            "run {round}: {summary}"
        );
        assert!(
            matches!(
                prefix.get(LEASE_KEY).await,
                Err(BucketError::NotFound { .. })
            ),
            "run {round} left its lease object behind"
        );
    }
    let digest = binary::restore_digest(&endpoint, &url, &tmp.path().join("restored"));
    assert_eq!(digest, binary::store_digest(&dir));
}

/// Issue 40, finding 3: one bucket named by two spellings of one query (keys in another order,
/// an endpoint with a trailing `/`) is one lease root, so one instance lease renewed once. Two
/// roots used to renew one `instances/<id>.lease` under one holder id, each renewal's
/// `If-Match` refused by the other's write and taken as a takeover: the stores lost and
/// re-acquired their leases at every renewal while health stayed green.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_spellings_of_one_bucket_share_one_lease_root_and_lose_nothing() {
    let Some(server) = S3Server::moto() else {
        return;
    };
    let name = server.create_bucket("two-spellings").await;
    let e = &server.endpoint;
    let d = served::dirs();
    let mut serve = served::fast_serve(&d, &["--instance-id", "svc", "--lease-ttl-ms", "900"]);
    serve.env("AWS_ENDPOINT_URL", e);
    let (mut child, addr) = served::start("serve", serve);
    let c = client(addr).await;
    let mut ids = Vec::new();
    for (store, url) in [
        ("a", format!("s3://{name}/a?endpoint={e}&region=us-east-1")),
        ("b", format!("s3://{name}/b?region=us-east-1&endpoint={e}/")),
    ] {
        let dir = d.root.join(store);
        support::store::write(&dir, 5, 0, 0);
        let req = support::register_req(&dir, &url);
        ids.push(served::register(&c, req).await);
    }
    for id in &ids {
        wait_health(&c, id, "holding its lease, 5 commits shipped", |h| {
            h.healthy && h.lease_held && h.restore_point_commit_seq == 5
        })
        .await;
    }
    // About 15 renewals of the instance lease (a third of 900 ms each).
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    for id in &ids {
        let h = served::health(&c, id, false).await.unwrap();
        assert!(h.healthy && h.lease_held, "{h:?}");
    }
    let log = served::stderr(&child);
    for flap in ["lost the bucket lease", "held by another process"] {
        assert!(!log.contains(flap), "{flap:?} in the log:\n{log}");
    }
    served::terminate(&mut child);
}
