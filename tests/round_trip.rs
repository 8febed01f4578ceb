//! Round trips through both real backends: a store with snapshots, rotations and a torn tail,
//! backed up in two passes, restores to the same digest; `--at` any commit gives exactly that
//! commit; `verify` passes; a flipped byte in a shipped object fails `verify` naming the
//! object and fails `restore` leaving no target.

mod support;

use std::path::Path;
use std::sync::Arc;

use mushroom_backup::bucket::DynBucket;
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::store::disk;
use mushroom_backup::store::engine::{
    self, Engine, EngineOptions, digest_map, expected_map, workload_ops,
};
use mushroom_backup::verify::{self, VerifyOptions};
use mushroom_backup::wal_source::InProcessSource;
use mushroom_backup::worker::BackupWorker;
use support::s3_servers::S3Server;
use support::store::{config, digest, fs_bucket, worker, write};

/// Appends half a frame to wal.bin, as a crash in the middle of an append leaves it.
fn tear_tail(store: &Path) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(store.join(disk::WAL_FILE))
        .unwrap();
    // A frame header promising 200 bytes, then 7 of them.
    let mut torn = Vec::new();
    torn.extend_from_slice(&200u32.to_le_bytes());
    torn.extend_from_slice(&0xdead_beefu32.to_le_bytes());
    torn.extend_from_slice(&u64::MAX.to_le_bytes());
    torn.extend_from_slice(b"partial");
    f.write_all(&torn).unwrap();
}

async fn two_passes_restore_to_the_same_digest(bucket: DynBucket) {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 1700, 600, 12 << 10);
    let r = worker(&store, bucket.clone(), config())
        .run_once()
        .await
        .unwrap();
    assert_eq!(r.restore_point, Some(1700));
    write(&store, 1500, 600, 12 << 10);
    tear_tail(&store);
    let want = digest(&store);
    assert_eq!(want.commit_seq, 3200, "the torn tail counts for nothing");
    let r = worker(&store, bucket.clone(), config())
        .run_once()
        .await
        .unwrap();
    assert_eq!(r.restore_point, Some(3200));

    let out = t.path().join("restored");
    let report = restore::restore(bucket.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap();
    assert_eq!(report.commit_seq, 3200);
    assert_eq!(digest(&out), want);
    let v = verify::verify(bucket.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok, "{v}");
    assert!(v.manifests.len() >= 2, "{v}");
}

#[tokio::test]
async fn two_passes_round_trip_on_a_local_directory() {
    let t = tempfile::tempdir().unwrap();
    two_passes_restore_to_the_same_digest(fs_bucket(&t.path().join("b"))).await;
}

on_each_s3_server!(#[tokio::test] async fn two_passes_round_trip_on_s3);
async fn two_passes_round_trip_on_s3(server: &S3Server) {
    let bucket = server.bucket("roundtrip").await;
    two_passes_restore_to_the_same_digest(bucket).await;
}

/// Drives the engine in-process and backs up after every chunk, snapshotting right after a
/// backup, so every commit stays reachable by some restore point. Returns the total commits.
async fn backed_up_history(store: &Path, bucket: &DynBucket, chunks: u64, per_chunk: u64) -> u64 {
    let mut engine = Engine::open(
        store,
        EngineOptions {
            rotate_bytes: 6 << 10,
            snapshot_every: 0,
            keep_wal_on_snapshot: false,
            group_commit: 16,
        },
    )
    .unwrap();
    let handle = engine.position_handle();
    let source = Arc::new(InProcessSource::new(move || handle.get()));
    let mut w = BackupWorker::new(store, bucket.clone(), source, config());
    for chunk in 0..chunks {
        for _ in 0..per_chunk {
            let seq = engine.commit_seq() + 1;
            engine.commit(&workload_ops(1, seq, 64)).unwrap();
        }
        engine.sync().unwrap();
        w.run_once().await.unwrap();
        if chunk % 3 == 2 {
            engine.snapshot().unwrap();
            w.run_once().await.unwrap();
        }
    }
    let n = engine.commit_seq();
    engine.close().unwrap();
    n
}

async fn restore_at_gives_exactly_that_commit(bucket: DynBucket, chunks: u64, stride: u64) {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let total = backed_up_history(&store, &bucket, chunks, 250).await;
    let mut targets: Vec<u64> = (1..=total).step_by(stride as usize).collect();
    targets.extend([0, 1, 2, total - 1, total]);
    // Snapshot and chunk boundaries, and one each side of them.
    for b in (250..total).step_by(250) {
        targets.extend([b - 1, b, b + 1]);
    }
    targets.sort_unstable();
    targets.dedup();
    for n in targets {
        let out = t.path().join(format!("at-{n}"));
        let opts = RestoreOptions {
            at: Some(n),
            ..RestoreOptions::default()
        };
        let report = restore::restore(bucket.as_ref(), &out, &opts)
            .await
            .unwrap_or_else(|e| panic!("restore --at {n}: {e}"));
        assert_eq!(report.commit_seq, n);
        let got = engine::digest(&out).unwrap();
        assert_eq!(got.commit_seq, n);
        assert_eq!(
            got.digest,
            digest_map(&expected_map(1, 64, n)),
            "restore --at {n} holds other data"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
    let e = restore::restore(
        bucket.as_ref(),
        &t.path().join("beyond"),
        &RestoreOptions {
            at: Some(total + 1),
            ..RestoreOptions::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("reachable"), "{e}");
    assert!(!t.path().join("beyond").exists());
    let v = verify::verify(bucket.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok, "{v}");
}

#[tokio::test]
async fn restore_at_any_commit_on_a_local_directory() {
    let t = tempfile::tempdir().unwrap();
    restore_at_gives_exactly_that_commit(fs_bucket(&t.path().join("b")), 13, 29).await;
}

on_each_s3_server!(#[tokio::test] async fn restore_at_commits_on_s3);
async fn restore_at_commits_on_s3(server: &S3Server) {
    let bucket = server.bucket("restore-at").await;
    restore_at_gives_exactly_that_commit(bucket, 7, 211).await;
}

#[tokio::test]
async fn a_flipped_byte_fails_verify_by_name_and_restore_leaves_no_target() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 900, 400, 8 << 10);
    worker(&store, fs_bucket(&root), config())
        .run_once()
        .await
        .unwrap();
    let bucket = fs_bucket(&root);
    let seg = walk(&root)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 1;
    std::fs::write(&seg, &bytes).unwrap();
    let key = seg
        .strip_prefix(&root)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();

    let v = verify::verify(bucket.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(!v.ok);
    assert!(
        v.to_string().contains(&key),
        "verify does not name {key}: {v}"
    );
    let out = t.path().join("r");
    let e = restore::restore(bucket.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(&key),
        "restore does not name {key}: {e}"
    );
    assert!(!out.exists(), "a failed restore left a target");
    let leftovers: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("restore"))
        .collect();
    assert!(leftovers.is_empty(), "a failed restore left {leftovers:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
