//! The backup worker against a local-directory bucket: lineage refusals that leave the bucket
//! byte-for-byte unchanged, corrupt archives refused by name (before the claim, or at the upload
//! when they change after their check), a WAL source behind the disk, resume, segment reuse and
//! retention.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mushroom_backup::bucket::faults::Op;
use mushroom_backup::bucket::{self, Bucket};
use mushroom_backup::manifest::{self, Latest, Manifest};
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::store::disk;
use mushroom_backup::store::engine::WriteOptions;
use mushroom_backup::store::format::WalPosition;
use mushroom_backup::wal_source::{SourceError, WalSource};
use mushroom_backup::worker::{
    BackupWorker, DeferReason, RunReport, StepOutcome, WorkerConfig, WorkerError,
};
use support::hooked::Hooked;
use support::store::{config, copy_dir, fs_bucket, tree, worker, write, write_with};

async fn latest(b: &dyn Bucket) -> (Latest, Manifest) {
    let l = Latest::decode(&b.get(manifest::LATEST_KEY).await.unwrap().data).unwrap();
    let m = Manifest::decode(&l.manifest, &b.get(&l.manifest).await.unwrap().data).unwrap();
    (l, m)
}

/// One backup run of `store` into the directory bucket `root`, with [`config`].
async fn back_up(store: &Path, root: &Path) -> Result<RunReport, WorkerError> {
    worker(store, fs_bucket(root), config()).run_once().await
}

fn refusal(e: WorkerError) -> String {
    match e {
        WorkerError::Refused { reason } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A backup run of `store` into `root` that must be refused saying `says`, the bucket left
/// byte for byte as `before`.
async fn refused_leaving(
    store: &Path,
    root: &Path,
    says: &str,
    before: &BTreeMap<PathBuf, Vec<u8>>,
) {
    let reason = refusal(back_up(store, root).await.unwrap_err());
    assert!(reason.contains(says), "{reason}");
    assert_eq!(&tree(root), before);
}

#[tokio::test]
async fn an_older_copy_of_the_store_is_refused_and_the_bucket_is_unchanged() {
    let t = tempfile::tempdir().unwrap();
    let (store, old, root) = (t.path().join("s"), t.path().join("old"), t.path().join("b"));
    write(&store, 1000, 300, 16 << 10);
    back_up(&store, &root).await.unwrap();
    copy_dir(&store, &old);
    write(&store, 500, 300, 16 << 10);
    back_up(&store, &root).await.unwrap();

    let before = tree(&root);
    let old_before = tree(&old);
    let e = back_up(&old, &root).await.unwrap_err();
    let reason = refusal(e);
    assert!(
        reason.contains("fewer commits than the newest restore point"),
        "{reason}"
    );
    assert_eq!(tree(&root), before, "a refused backup changed the bucket");
    assert_eq!(tree(&old), old_before, "a refused backup changed the store");
}

#[tokio::test]
async fn a_store_without_lineage_is_refused_on_a_used_prefix() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, root) = (t.path().join("a"), t.path().join("b"), t.path().join("bk"));
    write(&a, 200, 0, 0);
    back_up(&a, &root).await.unwrap();
    write(&b, 300, 0, 0);
    let before = tree(&root);
    refused_leaving(&b, &root, "no backup.lineage", &before).await;
    assert!(
        !b.join(disk::LINEAGE_FILE).exists(),
        "a refused store was given a lineage"
    );

    // A store of another lineage (backed up elsewhere first) is refused too.
    worker(&b, fs_bucket(&t.path().join("elsewhere")), config())
        .run_once()
        .await
        .unwrap();
    refused_leaving(&b, &root, "belongs to lineage", &before).await;
}

#[tokio::test]
async fn an_adopted_store_continues_beside_its_parent_and_the_parent_is_then_refused() {
    let t = tempfile::tempdir().unwrap();
    let (parent, child, root) = (t.path().join("p"), t.path().join("c"), t.path().join("b"));
    write(&parent, 800, 250, 8 << 10);
    back_up(&parent, &root).await.unwrap();
    let parent_objects = tree(&root);
    let b = fs_bucket(&root);
    let (l, pm) = latest(b.as_ref()).await;

    // A boot restore (`restore --adopt`): the parent's files, a new lineage, a parent record.
    let report = restore::restore(
        b.as_ref(),
        &child,
        &RestoreOptions {
            adopt: true,
            ..RestoreOptions::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        report.parent.as_ref().map(|p| p.manifest.clone()),
        Some(l.manifest.clone())
    );
    assert_eq!(
        disk::read_parent(&child).unwrap().map(|p| p.lineage),
        Some(pm.lineage)
    );
    assert_ne!(disk::read_lineage(&child).unwrap(), Some(pm.lineage));

    // Before its first commit the adopted store writes no restore point over the parent's key.
    back_up(&child, &root).await.unwrap();
    assert_eq!(
        latest(b.as_ref()).await.0,
        l,
        "LATEST moved without a new commit"
    );
    write(&child, 300, 250, 8 << 10);
    back_up(&child, &root).await.unwrap();

    let after = tree(&root);
    for (path, bytes) in &parent_objects {
        if path.as_os_str() == manifest::LATEST_KEY {
            continue;
        }
        assert_eq!(
            after.get(path),
            Some(bytes),
            "parent object {} was changed or deleted",
            path.display()
        );
    }
    let (l2, cm) = latest(b.as_ref()).await;
    assert_ne!(cm.lineage, pm.lineage);
    assert_eq!(cm.commit_seq, 1100);
    assert!(cm.generation > pm.generation);
    assert_eq!(
        cm.parent.as_ref().map(|p| p.manifest.clone()),
        Some(l.manifest.clone())
    );
    assert_eq!(l2.manifest, manifest::manifest_key(1100));

    write(&parent, 500, 250, 8 << 10);
    let before = tree(&root);
    refused_leaving(&parent, &root, "belongs to lineage", &before).await;
}

#[tokio::test]
async fn a_corrupt_archive_is_refused_by_name_and_nothing_is_written() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 600, 0, 4 << 10);
    let archives: Vec<_> = std::fs::read_dir(store.join(disk::ARCHIVE_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let victim = archives.iter().max().unwrap().clone();
    let mut bytes = std::fs::read(&victim).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&victim, bytes).unwrap();

    let e = back_up(&store, &root).await.unwrap_err();
    match &e {
        WorkerError::CorruptArchive { path, .. } => assert_eq!(path, &victim),
        other => panic!("expected a corrupt archive, got {other:?}"),
    }
    assert!(
        e.to_string()
            .contains(victim.file_name().unwrap().to_str().unwrap()),
        "{e}"
    );
    let written = tree(&root);
    assert!(
        !written
            .keys()
            .any(|k| k.starts_with("manifests") || k.as_os_str() == "LATEST"),
        "a restore point was written over a corrupt archive: {:?}",
        written.keys().collect::<Vec<_>>()
    );
}

/// A source stuck on an old position, counting catch-up requests.
struct Stale {
    pos: WalPosition,
    refreshes: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl WalSource for Stale {
    async fn durable_wal_position(&self) -> Result<WalPosition, SourceError> {
        Ok(self.pos)
    }
    fn request_refresh(&self) {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_source_behind_the_disk_gets_a_refresh_and_nothing_ships() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let old = write(&store, 100, 0, 0);
    let old_pos = mushroom_backup::store::engine::read_store(&store).unwrap();
    let stale = WalPosition {
        snapshot_id: None,
        wal_id: old_pos.wal.unwrap().wal_id,
        wal_number: 1,
        durable_len: old_pos.wal_valid_len,
        commit_seq: old.commit_seq,
    };
    // The engine snapshots (new snapshot and wal.bin on disk); the source has not seen it.
    write(&store, 50, 120, 0);
    let refreshes = Arc::new(AtomicU64::new(0));
    let source = Arc::new(Stale {
        pos: stale,
        refreshes: refreshes.clone(),
    });
    let mut w = BackupWorker::new(&store, fs_bucket(&root), source, config());
    for _ in 0..3 {
        assert_eq!(
            w.step().await.unwrap(),
            StepOutcome::Deferred(DeferReason::CatchUp)
        );
    }
    assert_eq!(refreshes.load(Ordering::SeqCst), 3);
    assert!(
        tree(&root).is_empty(),
        "a source behind the disk let something ship"
    );
}

/// The first backup of a store writes `backup.lineage` while it resumes, and its first
/// generation ships it: the restore point names the file the store now holds (a reading of the
/// store's files started beside the resume must not decide that).
#[tokio::test]
async fn a_first_backup_ships_the_lineage_it_wrote() {
    for _ in 0..5 {
        let t = tempfile::tempdir().unwrap();
        let (store, root) = (t.path().join("s"), t.path().join("b"));
        write(&store, 300, 0, 4 << 10);
        assert!(!store.join(disk::LINEAGE_FILE).exists());
        back_up(&store, &root).await.unwrap();
        let (_, m) = latest(fs_bucket(&root).as_ref()).await;
        let shipped = m
            .side_files
            .iter()
            .find(|f| f.name == disk::LINEAGE_FILE)
            .unwrap_or_else(|| panic!("generation 1 does not ship backup.lineage: {m:?}"));
        let local = std::fs::read(store.join(disk::LINEAGE_FILE)).unwrap();
        assert_eq!(shipped.object.crc, crc32fast::hash(&local));
    }
}

#[tokio::test]
async fn a_restarted_worker_resumes_its_generation_and_ships_only_new_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 400, 0, 0);
    back_up(&store, &root).await.unwrap();
    let before = tree(&root);

    // Nothing new: a second run writes nothing at all.
    let r = back_up(&store, &root).await.unwrap();
    assert_eq!((r.generations, r.segments, r.restore_point), (0, 0, None));
    assert_eq!(tree(&root), before);

    write(&store, 100, 0, 0);
    let mut w = worker(&store, fs_bucket(&root), config());
    let r = w.run_once().await.unwrap();
    assert_eq!(
        (r.generations, r.segments, r.restore_point),
        (0, 1, Some(500))
    );
    let (_, m) = latest(fs_bucket(&root).as_ref()).await;
    assert_eq!(m.generation, 1);
    assert_eq!(m.segments.len(), 2, "{:?}", m.segments);
}

/// [`config`] with no restore point due for an hour.
fn no_restore_point_due() -> WorkerConfig {
    let mut cfg = config();
    cfg.restore_point_interval = std::time::Duration::from_secs(3600);
    cfg
}

/// A worker of `store` into `root` resumes and ships one segment, no restore point, and
/// "dies" (is dropped).
async fn ship_a_segment_and_die(store: &Path, root: &Path) {
    let mut w = worker(store, fs_bucket(root), no_restore_point_due());
    assert!(matches!(
        w.step().await.unwrap(),
        StepOutcome::Resumed { .. }
    ));
    assert!(matches!(
        w.step().await.unwrap(),
        StepOutcome::Shipped { .. }
    ));
}

#[tokio::test]
async fn segments_shipped_after_the_last_restore_point_are_taken_on_after_a_restart() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 300, 0, 0);
    let mut w = worker(&store, fs_bucket(&root), config());
    w.run_once().await.unwrap();
    write(&store, 50, 0, 0);
    // Ship one segment without a restore point (the process then "dies").
    ship_a_segment_and_die(&store, &root).await;
    let mut w = worker(&store, fs_bucket(&root), no_restore_point_due());
    assert!(matches!(
        w.step().await.unwrap(),
        StepOutcome::Resumed {
            generation: Some(1),
            ..
        }
    ));
    w.request_restore_point();
    match w.step().await.unwrap() {
        StepOutcome::RestorePoint { commit_seq, .. } => assert_eq!(commit_seq, 350),
        other => panic!("expected a restore point, got {other:?}"),
    }
    let (_, m) = latest(fs_bucket(&root).as_ref()).await;
    assert_eq!(m.segments.len(), 2);
}

/// Resume takes on the segments shipped after the newest restore point (fetched several at
/// once) in order, up to a gap, and never past it: a segment missing from the bucket, or whose
/// bytes are not the local WAL's, or that is longer than its key's range (never fetched: a
/// hostile object could be gigabytes), ends the extension there, and the segments after it
/// (valid on their own) are not spliced on; the bytes from the gap on are shipped again.
#[tokio::test]
async fn resume_takes_on_shipped_segments_up_to_a_gap_and_never_past_it() {
    for gap in ["missing", "corrupt", "oversized"] {
        let t = tempfile::tempdir().unwrap();
        let (store, root) = (t.path().join("s"), t.path().join("b"));
        write(&store, 300, 0, 0);
        back_up(&store, &root).await.unwrap();
        // Three segments shipped after it by runs that "die" before a restore point.
        for _ in 0..3 {
            write(&store, 50, 0, 0);
            ship_a_segment_and_die(&store, &root).await;
        }
        let b = fs_bucket(&root);
        let mut segments: Vec<(u64, u64, String)> =
            bucket::list_all(b.as_ref(), &manifest::segments_prefix(1))
                .await
                .unwrap()
                .into_iter()
                .filter_map(|o| manifest::parse_segment_key(1, &o.key).map(|(s, e)| (s, e, o.key)))
                .collect();
        segments.sort();
        assert_eq!(segments.len(), 4, "{gap}: {segments:?}");
        let (taken, hole, after) = (&segments[1], &segments[2], &segments[3]);
        match gap {
            "missing" => b.delete(&hole.2, None).await.unwrap(),
            _ => {
                let mut len = usize::try_from(hole.1 - hole.0).unwrap();
                if gap == "oversized" {
                    len += 1 << 20;
                }
                b.put(
                    &hole.2,
                    bucket::Body::from(vec![0xab; len]),
                    bucket::PutCondition::None,
                )
                .await
                .unwrap();
            }
        }

        let mut w = worker(&store, fs_bucket(&root), no_restore_point_due());
        match w.step().await.unwrap() {
            StepOutcome::Resumed {
                shipped_commit_seq, ..
            } => assert_eq!(shipped_commit_seq, Some(350), "{gap}: up to the gap"),
            other => panic!("{gap}: expected a resume, got {other:?}"),
        }
        w.request_restore_point();
        w.run_once().await.unwrap();
        let (_, m) = latest(b.as_ref()).await;
        assert_eq!(m.commit_seq, 450, "{gap}");
        let keys: Vec<&str> = m.segments.iter().map(|s| s.object.key.as_str()).collect();
        assert!(keys.contains(&taken.2.as_str()), "{gap}: {keys:?}");
        assert!(
            !keys.contains(&hole.2.as_str()) && !keys.contains(&after.2.as_str()),
            "{gap}: a segment at or past the gap is named: {keys:?}"
        );
        let report = mushroom_backup::verify::verify(b.as_ref(), &Default::default())
            .await
            .unwrap();
        assert!(report.manifests.last().unwrap().ok, "{gap}: {report}");
    }
}

#[tokio::test]
async fn a_snapshot_that_keeps_its_wal_reuses_the_shipped_segments() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let opts = |commits, snapshot_every| WriteOptions {
        commits,
        snapshot_every,
        keep_wal_on_snapshot: true,
        seed: 3,
        ..WriteOptions::default()
    };
    write_with(&store, opts(300, 0));
    back_up(&store, &root).await.unwrap();
    let (_, first) = latest(fs_bucket(&root).as_ref()).await;
    write_with(&store, opts(100, 350));
    back_up(&store, &root).await.unwrap();
    let (_, second) = latest(fs_bucket(&root).as_ref()).await;
    assert!(second.snapshot.is_some());
    assert!(second.generation > first.generation);
    assert_eq!(
        second.segments[0], first.segments[0],
        "the first segment was not reused"
    );
    assert_eq!(second.commit_seq, 400);
}

#[tokio::test]
async fn retention_keeps_the_newest_generations_and_deletes_only_unnamed_objects() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let mut cfg = config();
    cfg.retention.keep_for = std::time::Duration::ZERO;
    cfg.retention.keep_generations = 1;
    cfg.retention.orphan_grace = std::time::Duration::ZERO;
    for _ in 0..4 {
        write(&store, 200, 150, 0);
        back_up(&store, &root).await.unwrap();
    }
    let b = fs_bucket(&root);
    let all = bucket::list_all(b.as_ref(), manifest::MANIFESTS_PREFIX)
        .await
        .unwrap();
    assert!(all.len() >= 4, "{all:?}");
    let r = worker(&store, fs_bucket(&root), cfg)
        .run_once()
        .await
        .unwrap();
    assert!(r.deleted > 0);
    let left = bucket::list_all(b.as_ref(), manifest::MANIFESTS_PREFIX)
        .await
        .unwrap();
    let (l, newest) = latest(b.as_ref()).await;
    assert!(left.iter().any(|o| o.key == l.manifest));
    for o in &left {
        let m = Manifest::decode(&o.key, &b.get(&o.key).await.unwrap().data).unwrap();
        assert_eq!(
            m.generation, newest.generation,
            "{} of an old generation was kept",
            o.key
        );
        for obj in m.objects() {
            let meta = b.head(&obj.key).await.unwrap();
            assert_eq!(
                meta.map(|m| m.len),
                Some(obj.len),
                "{} named by {} is gone",
                obj.key,
                o.key
            );
        }
    }
    let gens: std::collections::BTreeSet<u64> = bucket::list_all(b.as_ref(), manifest::GEN_PREFIX)
        .await
        .unwrap()
        .iter()
        .filter_map(|o| manifest::parse_generation(&o.key))
        .collect();
    assert!(gens.len() < 4, "old generations were not deleted: {gens:?}");
}

/// A `keep_for` or `orphan_grace` of 2^63 ms or more once wrapped negative (`as i64`), and
/// retention then deleted every old generation it was told to keep.
#[tokio::test]
async fn retention_keeps_everything_when_told_to_keep_for_longer_than_an_i64_of_ms() {
    for huge in [1u64 << 63, u64::MAX] {
        let t = tempfile::tempdir().unwrap();
        let (store, root) = (t.path().join("s"), t.path().join("b"));
        for _ in 0..3 {
            write(&store, 200, 150, 0);
            back_up(&store, &root).await.unwrap();
        }
        let b = fs_bucket(&root);
        let before = bucket::list_all(b.as_ref(), "").await.unwrap();
        let mut cfg = config();
        cfg.retention.keep_for = std::time::Duration::from_millis(huge);
        cfg.retention.keep_generations = 1;
        cfg.retention.orphan_grace = std::time::Duration::from_millis(huge);
        let r = worker(&store, fs_bucket(&root), cfg)
            .run_once()
            .await
            .unwrap();
        assert_eq!(r.deleted, 0, "keep_for = {huge} ms deleted objects");
        let after = bucket::list_all(b.as_ref(), "").await.unwrap();
        for o in before.iter().filter(|o| o.key.starts_with("manifests/")) {
            assert!(
                after.iter().any(|a| a.key == o.key),
                "keep_for = {huge} ms: {} was deleted",
                o.key
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn retention_lists_nothing_in_a_prefix_it_found_empty_until_something_there_could_be_old_enough()
 {
    use mushroom_backup::bucket::counting::CountingBucket;
    use std::time::Duration;
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 300, 0, 4 << 10);
    let counting = Arc::new(CountingBucket::new(fs_bucket(&root)));
    let mut c = config();
    c.retention.keep_for = Duration::from_secs(7200);
    c.retention.orphan_grace = Duration::from_secs(600);
    let mut w = worker(&store, counting.clone(), c);
    let lists = || counting.counts().snapshot().list;

    let report = w.run_once().await.unwrap();
    assert!(report.restore_point.is_some());
    assert_eq!(
        lists(),
        2,
        "resume lists manifests and generations; retention nothing"
    );
    write(&store, 400, 0, 4 << 10);
    w.run_once().await.unwrap();
    assert_eq!(
        lists(),
        2,
        "everything is younger than the orphan grace: nothing to list"
    );

    // The shorter of the two ages has passed: what the prefix holds may now be old enough.
    tokio::time::advance(Duration::from_secs(600)).await;
    write(&store, 500, 0, 4 << 10);
    w.run_once().await.unwrap();
    assert_eq!(
        lists(),
        5,
        "retention lists manifests, pins and generations again"
    );

    // A prefix that was not empty is listed by retention at once.
    let mut fresh = worker(&store, counting.clone(), config());
    fresh.run_once().await.unwrap();
    assert_eq!(
        lists(),
        5 + 1 + 3,
        "resume lists the generations (LATEST names the newest manifest), retention all three"
    );
}

/// Retention remembers, while its view lives, which generations hold nothing it may delete: a
/// run with nothing to delete lists `manifests/` alone, a run after a new generation lists
/// only the generations that may have lost their last manifest, and what the narrowed runs
/// left is exactly what a fresh worker's full listing leaves (it finds nothing more to delete).
#[tokio::test]
async fn retention_lists_only_generations_that_can_have_lost_their_last_manifest() {
    use mushroom_backup::bucket::counting::CountingBucket;
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let mut cfg = config();
    cfg.retention.keep_for = std::time::Duration::ZERO;
    cfg.retention.keep_generations = 2;
    cfg.retention.orphan_grace = std::time::Duration::ZERO;
    let counting = Arc::new(CountingBucket::new(fs_bucket(&root)));
    let lists = || counting.counts().snapshot().list;
    let mut w = worker(&store, counting.clone(), cfg.clone());
    let mut deleted = 0;
    for _ in 0..5 {
        write(&store, 200, 150, 4 << 10);
        deleted += w.run_once().await.unwrap().deleted;
    }
    assert!(deleted > 0, "the old generations were deleted");

    // Nothing new, nothing to delete: two LISTs, of manifests/ and pins/ (it was 2 + a page per
    // 1,000 objects of gen/ before).
    let before = lists();
    w.request_retention();
    let r = w.run_once().await.unwrap();
    assert_eq!(r.deleted, 0);
    assert_eq!(
        lists() - before,
        2,
        "a second run lists manifests/ and pins/ alone"
    );

    // A new generation: the run lists manifests/ and the generations its deletions touch.
    write(&store, 200, 150, 4 << 10);
    let before = lists();
    let r = w.run_once().await.unwrap();
    assert!(r.deleted > 0, "{r:?}");
    let narrowed = lists() - before;
    eprintln!("retention after a new generation: {narrowed} LISTs");
    assert!((3..=5).contains(&narrowed), "{narrowed} LISTs");

    // A fresh worker lists everything and finds nothing the narrowed runs missed.
    let mut fresh = worker(&store, fs_bucket(&root), cfg);
    let r = fresh.run_once().await.unwrap();
    assert_eq!(r.deleted, 0, "the narrowed runs left something deletable");
    let b = fs_bucket(&root);
    let report = mushroom_backup::verify::verify(b.as_ref(), &Default::default())
        .await
        .unwrap();
    assert!(report.ok, "{report}");
}

#[tokio::test]
async fn an_archive_changed_after_its_check_is_refused_at_upload_and_no_restore_point_names_it() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    write(&store, 600, 0, 4 << 10);
    let archives = store.join(disk::ARCHIVE_DIR);
    assert!(std::fs::read_dir(&archives).unwrap().count() > 1);
    // Flips a byte of the first archive the bucket is asked to store, just before it is, as a
    // store rewriting an archive after the worker checked it would.
    let flipped = Arc::new(std::sync::Mutex::new(None));
    let changing = Arc::new(Hooked {
        inner: fs_bucket(&root),
        hook: {
            let flipped = flipped.clone();
            move |op: Op, key: &str| {
                let mut flipped = flipped.lock().unwrap();
                if op != Op::Put || !key.contains("/archive/") || flipped.is_some() {
                    return;
                }
                let path = archives.join(key.rsplit('/').next().unwrap());
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .unwrap();
                let mut byte = [0u8; 1];
                file.read_exact_at(&mut byte, 100).unwrap();
                file.write_all_at(&[byte[0] ^ 0x10], 100).unwrap();
                *flipped = Some(path);
            }
        },
    });

    // Stored raw (as an archive that does not compress is), the upload streams from the file,
    // so a change just before the PUT is what the backend's CRC condition must catch. (A
    // compressed archive is read, and its CRC checked, while it is encoded, before any PUT:
    // tests/at_rest.rs covers that refusal.)
    let raw = mushroom_backup::worker::WorkerConfig {
        compression: mushroom_backup::at_rest::Compression::None,
        ..config()
    };
    let e = worker(&store, changing, raw).run_once().await.unwrap_err();
    let changed = flipped
        .lock()
        .unwrap()
        .clone()
        .expect("an archive was changed");
    let message = e.to_string();
    assert!(message.contains("changed after its check"), "{message}");
    let name = changed.file_name().unwrap().to_str().unwrap();
    assert!(
        message.contains(name),
        "the error does not name {name}: {message}"
    );
    let written = tree(&root);
    assert!(
        !written.keys().any(|k| k.to_str().unwrap().ends_with(name)
            || k.starts_with("manifests")
            || k.as_os_str() == "LATEST"),
        "the changed archive or a restore point was written: {:?}",
        written.keys().collect::<Vec<_>>()
    );

    // The next run checks the file as it now is, and refuses it by name.
    let e = back_up(&store, &root).await.unwrap_err();
    match &e {
        WorkerError::CorruptArchive { path, .. } => assert_eq!(path, &changed),
        other => panic!("expected a corrupt archive, got {other:?}"),
    }
}
