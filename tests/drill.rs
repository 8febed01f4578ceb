//! Restore drills through the real `serve` binary over gRPC (and `ctl`): a drill of a healthy
//! store restores its newest restore point with the real restore path, reports its duration
//! and bytes, and leaves no scratch; one archive object corrupted in the `file://` bucket (one
//! byte flipped) fails the drill naming the object and turns the store unhealthy, over a
//! SIGKILL and a restart too, until a drill succeeds again (the object's bytes put back);
//! the last drill survives a clean restart; a store with `drill_interval_ms` is drilled by
//! itself; the byte budget, counted in the plain bytes a drill writes (not the compressed
//! bytes in the bucket), skips a store with a note; bad inputs are refused naming what was
//! wrong. No timed assertion: every wait is for a health condition, with a generous deadline.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary;
use support::served::{self, client, fast_serve as serve, terminate, wait_health};
use tonic::Code;
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

async fn shipped(c: &Client, id: &str, commits: u64) -> proto::StoreHealth {
    wait_health(
        c,
        id,
        &format!("healthy, {commits} commits in a restore point"),
        |h| h.healthy && h.restore_point_commit_seq == commits,
    )
    .await
}

async fn drill(c: &Client, id: &str, at: u64) -> Result<proto::DrillResponse, tonic::Status> {
    c.clone()
        .drill(proto::DrillRequest {
            store_id: id.into(),
            at_commit_seq: at,
        })
        .await
        .map(|r| r.into_inner())
}

/// `ctl --server … ARGS`: its exit status and stdout.
fn ctl(addr: SocketAddr, args: &[&str]) -> (bool, String) {
    let (ok, child) = served::ctl(addr, args);
    (ok, child.stdout())
}

/// Registers `req` with scheduled drills every minute (the shortest interval): its store id.
async fn register_drilled(c: &Client, req: proto::RegisterRequest) -> String {
    let options = proto::StoreOptions {
        drill_interval_ms: 60_000,
        ..Default::default()
    };
    served::register_with(c, req, options).await
}

/// Whatever drills left under the data directory's scratch (nothing, after a drill).
fn scratch_left(data: &Path) -> Vec<PathBuf> {
    support::store::tree(&data.join("drills"))
        .into_keys()
        .collect()
}

/// One archive object of the bucket (the first by key), as its key and path.
fn an_archive(bucket: &Path) -> (String, PathBuf) {
    let key = support::store::tree(bucket)
        .into_keys()
        .map(|p| p.to_string_lossy().into_owned())
        .find(|k| k.contains("/archive/") && k.ends_with(".wal"))
        .expect("the bucket holds an archive");
    let path = bucket.join(&key);
    (key, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drill_proves_a_restore_and_a_corrupted_archive_fails_it_until_one_succeeds() {
    let d = served::dirs();
    let dir = d.root.join("drilled");
    let bucket = d.base.join("bucket");
    // Small WAL files: the store has archives.
    support::store::write(&dir, 300, 0, 4096);
    // Under umask 022, as a service often runs: the scratch stays private all the same.
    let mut cmd = serve(&d, &[]);
    binary::with_umask(&mut cmd, 0o022);
    let (server, addr) = served::start("serve", cmd);
    let c = client(addr).await;
    let id = served::register(&c, support::register_req(&dir, &support::file_url(&bucket))).await;
    shipped(&c, &id, 300).await;

    let ok = drill(&c, &id, 0).await.expect("Drill");
    assert!(ok.ok, "{ok:?}");
    assert_eq!(ok.commit_seq, 300, "{ok:?}");
    assert!(ok.bytes > 0, "{ok:?}");
    assert!(ok.manifest_key.starts_with("manifests/"), "{ok:?}");
    assert!(ok.error.is_empty(), "{ok:?}");
    assert_eq!(scratch_left(&d.data), Vec::<PathBuf>::new(), "scratch left");
    // The scratch root a drill writes plain stores under is the service's alone (issue 25,
    // part 4); the store restored in it is `0700`/`0600` as every restore is
    // (`encrypted_backup.rs`, `an_encrypted_store_restores_private_under_umask_022`).
    assert_eq!(
        support::modes_under(&d.data.join("drills")),
        vec![(String::new(), true, 0o700)],
        "the drill scratch root"
    );
    let h = wait_health(&c, &id, "healthy with the drill", |h| {
        h.healthy && h.last_drill.is_some()
    })
    .await;
    let last = h.last_drill.expect("last drill");
    assert!(
        last.ok && last.last_ok_at_unix_ms == last.finished_at_unix_ms,
        "{last:?}"
    );
    assert_eq!(
        (last.duration_ms, last.bytes, last.commit_seq),
        (ok.duration_ms, ok.bytes, 300)
    );
    let (success, out) = ctl(addr, &["drill", &id]);
    assert!(success && out.contains("succeeded: commit 300"), "{out}");
    let (_, out) = ctl(addr, &["health", &id]);
    assert!(out.contains("last drill: ok at"), "{out}");

    // One byte of one archive flipped: the drill fails, naming the object.
    let (key, path) = an_archive(&bucket);
    let original = std::fs::read(&path).unwrap();
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x5a;
    std::fs::write(&path, &bad).unwrap();
    let failed = drill(&c, &id, 0)
        .await
        .expect("Drill of a corrupted prefix");
    assert!(!failed.ok, "{failed:?}");
    assert!(failed.error.contains(&key), "names {key}: {failed:?}");
    assert_eq!(scratch_left(&d.data), Vec::<PathBuf>::new(), "scratch left");
    let h = wait_health(&c, &id, "unhealthy: the drill failed", |h| !h.healthy).await;
    assert!(
        h.reason.starts_with("the last restore drill failed") && h.reason.contains(&key),
        "{h:?}"
    );
    let d_last = h.last_drill.expect("last drill");
    assert!(!d_last.ok, "{d_last:?}");
    assert_eq!(
        d_last.commit_seq, 300,
        "the restore point that failed: {d_last:?}"
    );
    assert_eq!(d_last.manifest_key, ok.manifest_key, "{d_last:?}");
    // When a drill last succeeded: the ctl drill above, kept by the failure.
    assert!(
        d_last.last_ok_at_unix_ms >= last.last_ok_at_unix_ms
            && d_last.last_ok_at_unix_ms < d_last.finished_at_unix_ms,
        "{d_last:?}"
    );
    let (success, out) = ctl(addr, &["drill", &id]);
    assert!(
        !success,
        "ctl drill exits non-zero on a failed drill: {out}"
    );
    assert!(out.contains("FAILED") && out.contains(&key), "{out}");

    // The failed drill survives a SIGKILL and a restart: still unhealthy, naming the object.
    let mut server = server;
    server.kill();
    let (server, addr) = served::start("serve (after SIGKILL)", serve(&d, &[]));
    let c = client(addr).await;
    let h = wait_health(&c, &id, "unhealthy after the restart", |h| {
        h.lease_held && h.last_drill.is_some()
    })
    .await;
    assert!(!h.healthy && h.reason.contains(&key), "{h:?}");

    // The object's bytes put back: the next drill succeeds, and the store is healthy again.
    std::fs::write(&path, &original).unwrap();
    let ok = drill(&c, &id, 0).await.expect("Drill");
    assert!(ok.ok, "{ok:?}");
    let h = wait_health(&c, &id, "healthy after a good drill", |h| h.healthy).await;
    let last = h.last_drill.expect("last drill");
    assert!(last.ok, "{last:?}");

    // A drill at a commit: exactly that commit restores.
    let at = drill(&c, &id, 150).await.expect("Drill --at 150");
    assert!(at.ok && at.commit_seq == 150, "{at:?}");

    // The last drill survives a clean restart.
    let mut server = server;
    terminate(&mut server);
    let (_server, addr) = served::start("serve (restarted)", serve(&d, &[]));
    let c = client(addr).await;
    let h = wait_health(&c, &id, "the last drill after a restart", |h| {
        h.last_drill.is_some()
    })
    .await;
    let after = h.last_drill.expect("last drill");
    assert!(after.ok && after.commit_seq == 150, "{after:?}");
    assert_eq!(after.finished_at_unix_ms, at.finished_at_unix_ms);
    assert_eq!(scratch_left(&d.data), Vec::<PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_drills_run_by_themselves_and_bad_inputs_are_refused() {
    let d = served::dirs();
    // What a crashed drill left: removed when the service starts.
    let stale = d
        .data
        .join("drills/a-store-6f1e0c8e-5b7a-4d0e-9a43-2f1c7d9e8b10/store");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("snapshot.bin"), b"half a restore").unwrap();
    let (_server, addr) = served::start("serve", serve(&d, &[]));
    assert_eq!(
        scratch_left(&d.data),
        Vec::<PathBuf>::new(),
        "stale scratch"
    );
    let c = client(addr).await;

    let dir = d.root.join("scheduled");
    support::store::write(&dir, 40, 0, 0);
    let mut req = support::register_req(&dir, &support::file_url(&d.base.join("bucket")));
    for (bad, what) in [(1_000, "below"), (31 * 24 * 3_600_000, "above")] {
        req.options = Some(proto::StoreOptions {
            drill_interval_ms: bad,
            ..Default::default()
        });
        let e = c.clone().register(req.clone()).await.expect_err(what);
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .contains("options.drill_interval_ms must be 60000"),
            "{what}: {e:?}"
        );
    }
    let id = register_drilled(&c, req).await;
    // Never drilled, with a restore point: the scheduler drills it, nobody asking.
    let h = wait_health(&c, &id, "drilled by the scheduler", |h| {
        h.last_drill.as_ref().is_some_and(|d| d.ok)
    })
    .await;
    let last = h.last_drill.unwrap();
    assert!(last.commit_seq > 0 && last.bytes > 0, "{last:?}");
    let stores = c
        .clone()
        .list_stores(proto::ListStoresRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        stores.stores[0].options.as_ref().unwrap().drill_interval_ms,
        60_000
    );

    // Bad inputs.
    let unknown = "00000000-0000-0000-0000-000000000000";
    let e = drill(&c, unknown, 0).await.expect_err("unknown store");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = drill(&c, "not-an-id", 0).await.expect_err("bad id");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = drill(&c, &id, 1_000_000)
        .await
        .expect_err("no restore point there");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("no restore point reaches commit 1000000"),
        "{e:?}"
    );
    let (success, _) = ctl(addr, &["drill", unknown]);
    assert!(!success, "ctl drill of an unknown store");
    // A refused drill records nothing: the last drill is the scheduler's.
    let h = wait_health(&c, &id, "healthy", |h| h.healthy).await;
    assert_eq!(h.last_drill.unwrap(), last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_byte_budget_skips_scheduled_drills_with_a_note_but_not_a_drill_asked_for() {
    let d = served::dirs();
    let (_server, addr) = served::start("serve", serve(&d, &["--drill-max-bytes", "1"]));
    let c = client(addr).await;
    let dir = d.root.join("big");
    support::store::write(&dir, 20, 0, 0);
    let req = support::register_req(&dir, &support::file_url(&d.base.join("bucket")));
    let id = register_drilled(&c, req).await;
    let h = wait_health(&c, &id, "a note: over the drill budget", |h| {
        h.notes.iter().any(|n| n.contains("over the drill budget"))
    })
    .await;
    assert!(h.healthy && h.last_drill.is_none(), "{h:?}");
    let ok = drill(&c, &id, 0).await.expect("Drill");
    assert!(ok.ok && ok.commit_seq == 20, "{ok:?}");
}

/// The budget counts the plain bytes a drill writes into scratch, not the fewer bytes a
/// compressed store takes in the bucket: a store of text rows (zstd, at least 3:1) with a
/// budget between the two is skipped, and its bucket bytes are under the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_byte_budget_counts_the_plain_bytes_a_drill_writes() {
    use mushroom_backup::store::engine::{ValueKind, WriteOptions};
    let d = served::dirs();
    let dir = d.root.join("text");
    support::store::write_with(
        &dir,
        WriteOptions {
            commits: 300,
            value_size: 2048,
            value_kind: ValueKind::Text,
            seed: 1,
            ..WriteOptions::default()
        },
    );
    let plain: u64 = support::store::tree(&dir)
        .values()
        .map(|b| b.len() as u64)
        .sum();
    let budget = plain / 2;
    let (_server, addr) = served::start(
        "serve",
        serve(&d, &["--drill-max-bytes", &budget.to_string()]),
    );
    let c = client(addr).await;
    let bucket = d.base.join("bucket");
    let req = support::register_req(&dir, &support::file_url(&bucket));
    let id = register_drilled(&c, req).await;
    // Whichever comes first: the scheduler's drill, or its note that the store is skipped.
    let h = wait_health(&c, &id, "a drill or a note about the budget", |h| {
        h.last_drill.is_some() || h.notes.iter().any(|n| n.contains("drill budget"))
    })
    .await;
    assert!(
        h.last_drill.is_none()
            && h.notes.iter().any(|n| n.contains("restores")
                && n.contains(&format!("over the drill budget of {budget} bytes"))),
        "plain {plain} bytes, budget {budget}: {h:?}"
    );
    let stored: u64 = support::store::tree(&bucket.join("gen"))
        .values()
        .map(|b| b.len() as u64)
        .sum();
    assert!(
        stored < budget,
        "the bucket holds {stored} bytes, not under the budget of {budget}: the test shows nothing"
    );
}
