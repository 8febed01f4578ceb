//! Unit tests of the reference engine: durability, recovery at every protocol step, the
//! read-only readers and the deterministic workload.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use super::codec::{apply_ops, encode_batch};
use super::*;
use crate::store::format::{self, WalPosition, decode_snapshot, encode_frame, scan_wal};

fn opts(group_commit: usize) -> EngineOptions {
    EngineOptions {
        group_commit,
        ..EngineOptions::default()
    }
}

/// The ops of test commit `i`: a put, and every fifth commit a delete.
fn ops(i: u64) -> Vec<Op> {
    let mut ops = vec![Op::put(format!("k{}", i % 37), format!("value {i}"))];
    if i.is_multiple_of(5) {
        ops.push(Op::delete(format!("k{}", (i * 7) % 37)));
    }
    ops
}

/// Commits `from..=to` with [`ops`] into `engine` and `model`.
fn commit_range(engine: &mut Engine, model: &mut KvMap, from: u64, to: u64) {
    for i in from..=to {
        let o = ops(i);
        assert_eq!(engine.commit(&o).unwrap(), i);
        apply_ops(model, &o);
    }
}

fn model_at(n: u64) -> KvMap {
    let mut m = KvMap::new();
    for i in 1..=n {
        apply_ops(&mut m, &ops(i));
    }
    m
}

/// Every file under `dir` with its bytes and mtime.
fn listing(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            let meta = fs::metadata(&p).unwrap();
            let name = p.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                out.insert(name, (Vec::new(), meta.modified().unwrap()));
                stack.push(p);
            } else {
                out.insert(name, (fs::read(&p).unwrap(), meta.modified().unwrap()));
            }
        }
    }
    out
}

fn archive_count(dir: &Path) -> usize {
    files::list_archives(dir).unwrap().len()
}

#[test]
fn commit_sync_reopen_round_trips_and_unsynced_commits_are_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut model = KvMap::new();
    let mut e = Engine::open(&dir, opts(0)).unwrap();
    assert_eq!(e.position().commit_seq, 0);
    assert_eq!(e.position().durable_len, format::WAL_HEADER_LEN as u64);
    commit_range(&mut e, &mut model, 1, 40);
    assert_eq!(e.position().commit_seq, 0, "nothing durable before sync");
    let pos = e.sync().unwrap();
    assert_eq!(pos.commit_seq, 40);
    assert_eq!(pos.wal_number, 1);
    assert_eq!(pos.snapshot_id, None);
    assert_eq!(
        pos.durable_len,
        fs::metadata(dir.join("wal.bin")).unwrap().len()
    );
    let on_disk = WalPosition::decode(&fs::read(dir.join("wal.position")).unwrap()).unwrap();
    assert_eq!(on_disk, pos);
    // Commits 41..=45 are never synced: a drop is a crash for them.
    let mut lost = model.clone();
    commit_range(&mut e, &mut lost, 41, 45);
    drop(e);

    let meta: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("store.meta")).unwrap()).unwrap();
    assert_eq!(meta["format"], 1);
    assert_eq!(meta["engine"], "mushroom-reference");
    assert_eq!(fs::read(dir.join("snapshot.intent")).unwrap(), b"");

    let mut e = Engine::open(&dir, opts(1)).unwrap();
    assert_eq!(e.map(), &model);
    assert_eq!(e.position(), pos);
    commit_range(&mut e, &mut model, 41, 50);
    assert_eq!(
        e.position().commit_seq,
        50,
        "group_commit 1 syncs every commit"
    );
    assert_eq!(
        e.get(b"k13"),
        model.get(b"k13".as_slice()).map(Vec::as_slice)
    );
    drop(e);
    assert_eq!(read_store(&dir).unwrap().map, model);
    assert_eq!(digest(&dir).unwrap().digest, digest_map(&model));
}

#[test]
fn position_handle_follows_syncs_and_outlives_the_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = Engine::open(tmp.path(), opts(0)).unwrap();
    let mut h = e.position_handle();
    let other_thread = h.clone();
    let before = h.get();
    e.commit(&ops(1)).unwrap();
    assert_eq!(h.get(), before, "an unsynced commit is not published");
    let pos = e.sync().unwrap();
    assert_eq!(
        std::thread::spawn(move || other_thread.get())
            .join()
            .unwrap(),
        pos
    );
    assert_eq!(futures::executor::block_on(h.changed()), Some(pos));
    drop(e);
    assert_eq!(h.get(), pos);
    assert_eq!(futures::executor::block_on(h.changed()), None);
}

#[test]
fn engine_and_handle_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Engine>();
    send_sync::<PositionHandle>();
}

#[test]
fn tiny_rotate_bytes_never_rotates_an_empty_wal() {
    let tmp = tempfile::tempdir().unwrap();
    let o = EngineOptions {
        rotate_bytes: 1,
        ..opts(1)
    };
    let mut e = Engine::open(tmp.path(), o).unwrap();
    e.commit(&ops(1)).unwrap();
    assert_eq!(archive_count(tmp.path()), 1);
    e.sync().unwrap();
    e.sync().unwrap();
    assert_eq!(archive_count(tmp.path()), 1);
    assert_eq!(e.position().wal_number, 2);
}

#[test]
fn store_lock_refuses_a_second_open() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Engine::open(tmp.path(), opts(1)).unwrap();
    let err = Engine::open(tmp.path(), opts(1)).unwrap_err();
    assert!(matches!(err, EngineError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains(&tmp.path().display().to_string()),
        "{err}"
    );
    // write_commits takes the same lock.
    let err = write_commits(tmp.path(), &WriteOptions::default()).unwrap_err();
    assert!(matches!(err, EngineError::Locked { .. }), "{err}");
    drop(e);
    Engine::open(tmp.path(), opts(1)).unwrap();
}

#[test]
fn rotation_keeps_the_map_and_a_valid_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut model = KvMap::new();
    let o = EngineOptions {
        rotate_bytes: 600,
        group_commit: 4,
        ..EngineOptions::default()
    };
    let mut e = Engine::open(dir, o).unwrap();
    commit_range(&mut e, &mut model, 1, 200);
    e.rotate().unwrap();
    let pos = e.sync().unwrap();
    drop(e);
    let image = read_store(dir).unwrap();
    assert!(
        image.archives.len() > 5,
        "{} archives",
        image.archives.len()
    );
    assert!(image.recovery.is_empty(), "{:?}", image.recovery);
    for pair in image.archives.windows(2) {
        assert_eq!(pair[1].number, pair[0].number + 1);
        assert_eq!(pair[1].header.floor, pair[0].last_seq);
    }
    let wal = image.wal.unwrap();
    assert_eq!(wal.number, image.archives.last().unwrap().number + 1);
    assert_eq!(wal.floor, 200, "the explicit rotate left an empty wal.bin");
    assert_eq!(pos.wal_number, wal.number);
    assert_eq!(image.map, model);
    let e = Engine::open(dir, o).unwrap();
    assert_eq!(e.map(), &model);
    assert_eq!(e.position(), pos);
}

fn snapshots_keep_the_map(keep: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut model = KvMap::new();
    let o = EngineOptions {
        rotate_bytes: 500,
        snapshot_every: 45,
        keep_wal_on_snapshot: keep,
        group_commit: 2,
    };
    let mut e = Engine::open(dir, o).unwrap();
    commit_range(&mut e, &mut model, 1, 101);
    let pos = e.sync().unwrap();
    let snap = fs::read(dir.join("snapshot.bin")).unwrap();
    let (header, _) = decode_snapshot(&snap).unwrap();
    assert_eq!(
        header.commit_seq, 92,
        "snapshots after the syncs at 46 and 92"
    );
    assert_eq!(pos.snapshot_id, Some(header.snapshot_id));
    assert_eq!(header.kept_wal_id.is_some(), keep);
    assert_eq!(fs::read(dir.join("snapshot.intent")).unwrap(), b"");
    drop(e);

    let image = read_store(dir).unwrap();
    assert!(image.recovery.is_empty(), "{:?}", image.recovery);
    assert!(
        image.archives.iter().all(|a| a.last_seq > 92),
        "covered archives deleted"
    );
    assert_eq!(image.map, model);
    assert_eq!(image.commit_seq, 101);
    let mut e = Engine::open(dir, o).unwrap();
    assert_eq!(e.map(), &model);
    assert_eq!(e.position(), pos);
    commit_range(&mut e, &mut model, 102, 140);
    e.snapshot().unwrap();
    assert_eq!(archive_count(dir), 0, "a snapshot covers every archive");
    let wal = scan_wal(&fs::read(dir.join("wal.bin")).unwrap()).unwrap();
    if keep {
        assert!(wal.header.floor < 140);
        assert_eq!(wal.last_seq, 140);
    } else {
        assert_eq!(wal.header.floor, 140);
        assert!(wal.frames.is_empty());
    }
    drop(e);
    assert_eq!(Engine::open(dir, o).unwrap().map(), &model);
}

#[test]
fn snapshots_keep_the_map_with_a_new_wal() {
    snapshots_keep_the_map(false);
}

#[test]
fn snapshots_keep_the_map_with_a_kept_wal() {
    snapshots_keep_the_map(true);
}

#[test]
fn torn_tail_is_ignored_by_readers_and_cut_by_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut model = KvMap::new();
    let mut e = Engine::open(dir, opts(1)).unwrap();
    commit_range(&mut e, &mut model, 1, 20);
    let pos = e.position();
    drop(e);
    let wal = dir.join("wal.bin");
    let clean = fs::read(&wal).unwrap();
    let good = digest(dir).unwrap();

    // Garbage after the last frame.
    let mut torn = clean.clone();
    torn.extend_from_slice(b"\x05\0\0\0garbage that is no frame");
    fs::write(&wal, &torn).unwrap();
    let image = read_store(dir).unwrap();
    assert_eq!(image.digest(), good);
    assert_eq!(image.wal_valid_len, clean.len() as u64);
    assert_eq!(image.wal_file_len, torn.len() as u64);
    assert_eq!(
        image.recovery,
        vec![Recovery::TruncateWal {
            valid_len: clean.len() as u64
        }]
    );
    let e = Engine::open(dir, opts(1)).unwrap();
    assert_eq!(fs::read(&wal).unwrap(), clean, "open cut the tail");
    assert_eq!(e.position(), pos);
    drop(e);

    // A frame cut in the middle: commit 20 is gone, 1..=19 remain.
    fs::write(&wal, &clean[..clean.len() - 3]).unwrap();
    let d = digest(dir).unwrap();
    assert_eq!(d.commit_seq, 19);
    assert_eq!(d.digest, digest_map(&model_at(19)));
    let mut e = Engine::open(dir, opts(1)).unwrap();
    assert_eq!(e.map(), &model_at(19));
    assert_eq!(
        e.commit(&ops(20)).unwrap(),
        20,
        "the next commit reuses the cut seq"
    );
    drop(e);
    assert_eq!(digest(dir).unwrap(), good);
}

const SNAPSHOT_STEPS: [CrashPoint; 5] = [
    CrashPoint::IntentWritten,
    CrashPoint::SnapshotTmpWritten,
    CrashPoint::SnapshotRenamed,
    CrashPoint::NewWalStarted,
    CrashPoint::ArchivesDeleted,
];

fn crash_mid_snapshot(keep: bool, point: CrashPoint) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut model = KvMap::new();
    let o = EngineOptions {
        rotate_bytes: 400,
        keep_wal_on_snapshot: keep,
        group_commit: 3,
        ..EngineOptions::default()
    };
    let mut e = Engine::open(dir, o).unwrap();
    commit_range(&mut e, &mut model, 1, 30);
    e.snapshot().unwrap();
    let first_snapshot = e.position().snapshot_id;
    commit_range(&mut e, &mut model, 31, 80);
    assert!(archive_count(dir) >= 2);
    e.crash_at(point);
    let err = e.snapshot().unwrap_err();
    assert!(matches!(err, EngineError::InjectedCrash(_)), "{err}");
    assert!(matches!(
        e.commit(&ops(81)),
        Err(EngineError::Failed { .. })
    ));
    drop(e);

    let completed = !matches!(
        point,
        CrashPoint::IntentWritten | CrashPoint::SnapshotTmpWritten
    );
    let before = listing(dir);
    let image = read_store(dir).unwrap();
    assert_eq!(listing(dir), before, "read_store wrote nothing");
    assert_eq!(image.map, model, "{point:?}");
    assert_eq!(image.commit_seq, 80);
    assert_eq!(
        matches!(image.intent, IntentState::Completed(_)),
        completed,
        "{point:?}: {:?}",
        image.intent
    );
    assert!(
        image.recovery.contains(&Recovery::EmptyIntent),
        "{:?}",
        image.recovery
    );

    let mut e = Engine::open(dir, o).unwrap();
    assert_eq!(e.map(), &model, "{point:?}");
    let pos = e.position();
    assert_eq!(pos.commit_seq, 80);
    let snap = fs::read(dir.join("snapshot.bin")).unwrap();
    let (header, _) = decode_snapshot(&snap).unwrap();
    assert_eq!(pos.snapshot_id, Some(header.snapshot_id));
    assert_eq!(
        completed,
        Some(header.snapshot_id) != first_snapshot,
        "{point:?}"
    );
    assert_eq!(fs::read(dir.join("snapshot.intent")).unwrap(), b"");
    assert!(!dir.join("snapshot.bin.tmp").exists());
    assert!(!dir.join("wal.bin.tmp").exists());
    if completed {
        assert_eq!(archive_count(dir), 0, "{point:?}: covered archives deleted");
        let wal = scan_wal(&fs::read(dir.join("wal.bin")).unwrap()).unwrap();
        assert_eq!(wal.header.floor == 80, !keep, "{point:?}");
    }
    let clean = read_store(dir).unwrap();
    assert!(clean.recovery.is_empty(), "{point:?}: {:?}", clean.recovery);
    commit_range(&mut e, &mut model, 81, 90);
    e.close().unwrap();
    assert_eq!(Engine::open(dir, o).unwrap().map(), &model, "{point:?}");
}

#[test]
fn crash_at_each_snapshot_step_recovers_with_a_new_wal() {
    for point in SNAPSHOT_STEPS {
        crash_mid_snapshot(false, point);
    }
}

#[test]
fn crash_at_each_snapshot_step_recovers_with_a_kept_wal() {
    for point in SNAPSHOT_STEPS {
        crash_mid_snapshot(true, point);
    }
}

#[test]
fn crash_at_each_rotation_step_recovers() {
    for point in [CrashPoint::RotateTmpWritten, CrashPoint::RotateArchived] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut model = KvMap::new();
        let mut e = Engine::open(dir, opts(1)).unwrap();
        commit_range(&mut e, &mut model, 1, 10);
        e.rotate().unwrap();
        commit_range(&mut e, &mut model, 11, 20);
        e.crash_at(point);
        assert!(matches!(e.rotate(), Err(EngineError::InjectedCrash(_))));
        drop(e);
        let image = read_store(dir).unwrap();
        assert_eq!(image.map, model, "{point:?}");
        assert_eq!(image.wal.is_none(), point == CrashPoint::RotateArchived);
        let e = Engine::open(dir, opts(1)).unwrap();
        assert_eq!(e.map(), &model);
        let pos = e.position();
        assert_eq!(pos.commit_seq, 20);
        let want_number = if point == CrashPoint::RotateArchived {
            3
        } else {
            2
        };
        assert_eq!(pos.wal_number, want_number, "{point:?}");
        assert!(!dir.join("wal.bin.tmp").exists());
        assert!(read_store(dir).unwrap().recovery.is_empty());
    }
}

#[test]
fn read_store_writes_nothing_and_takes_no_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let mut model = KvMap::new();
    let mut e = Engine::open(&src, opts(2)).unwrap();
    commit_range(&mut e, &mut model, 1, 30);
    e.rotate().unwrap();
    commit_range(&mut e, &mut model, 31, 40);
    e.crash_at(CrashPoint::SnapshotRenamed);
    e.snapshot().unwrap_err();
    // While the engine still holds the lock, readers work.
    assert_eq!(read_store(&src).unwrap().map, model);
    drop(e);

    // A copy without store.lock or wal.position, with a torn tail and a stray tmp.
    let dir = tmp.path().join("copy");
    fs::create_dir_all(dir.join("archive")).unwrap();
    for (name, (bytes, _)) in listing(&src) {
        if !bytes.is_empty() && !name.ends_with("store.lock") && !name.ends_with("wal.position") {
            fs::write(dir.join(&name), bytes).unwrap();
        }
    }
    let mut wal = fs::read(dir.join("wal.bin")).unwrap();
    wal.extend_from_slice(&[1, 2, 3]);
    fs::write(dir.join("wal.bin"), wal).unwrap();
    fs::write(dir.join("wal.bin.tmp"), b"half a header").unwrap();
    let before = listing(&dir);
    let image = read_store(&dir).unwrap();
    let d = digest(&dir).unwrap();
    assert_eq!(listing(&dir), before);
    assert_eq!(image.map, model);
    assert_eq!(d.digest, digest_map(&model));
    assert!(image.recovery.len() >= 3, "{:?}", image.recovery);
}

#[test]
fn broken_chains_and_bad_files_are_named_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(matches!(
        read_store(dir),
        Err(EngineError::NotAStore { .. })
    ));
    let mut e = Engine::open(dir, opts(1)).unwrap();
    let mut model = KvMap::new();
    for i in 1..=3 {
        commit_range(&mut e, &mut model, i * 10 - 9, i * 10);
        e.rotate().unwrap();
    }
    drop(e);
    let middle = dir.join("archive").join(files::archive_name(2));
    let saved = fs::read(&middle).unwrap();
    fs::remove_file(&middle).unwrap();
    let err = read_store(dir).unwrap_err();
    assert!(matches!(err, EngineError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("00000000000000000003.wal"),
        "{err}"
    );
    assert!(matches!(
        Engine::open(dir, opts(1)),
        Err(EngineError::Corrupt { .. })
    ));
    fs::write(&middle, &saved).unwrap();

    // The first archive missing: commits 1..=10 are gone.
    let first = dir.join("archive").join(files::archive_name(1));
    let saved = fs::read(&first).unwrap();
    fs::remove_file(&first).unwrap();
    let err = read_store(dir).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    fs::write(&first, &saved).unwrap();

    // A frame whose CRC is right but whose payload is not a batch.
    let wal = dir.join("wal.bin");
    let clean = fs::read(&wal).unwrap();
    let mut bad = clean.clone();
    encode_frame(31, b"\x07not a batch", &mut bad);
    fs::write(&wal, &bad).unwrap();
    let err = read_store(dir).unwrap_err();
    assert!(
        err.to_string().contains("wal.bin") && err.to_string().contains("seq 31"),
        "{err}"
    );
    let mut good = clean.clone();
    encode_frame(31, &encode_batch(&ops(31)), &mut good);
    fs::write(&wal, &good).unwrap();
    apply_ops(&mut model, &ops(31));
    assert_eq!(read_store(dir).unwrap().map, model);

    // A snapshot with a flipped byte.
    let mut e = Engine::open(dir, opts(1)).unwrap();
    e.snapshot().unwrap();
    drop(e);
    let snap = dir.join("snapshot.bin");
    let mut bytes = fs::read(&snap).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    fs::write(&snap, bytes).unwrap();
    let err = read_store(dir).unwrap_err();
    assert!(matches!(err, EngineError::Format { .. }), "{err}");
    assert!(err.to_string().contains("snapshot.bin"), "{err}");
}

#[test]
fn oversized_commit_is_refused_without_harm() {
    let tmp = tempfile::tempdir().unwrap();
    let mut e = Engine::open(tmp.path(), opts(1)).unwrap();
    let big = vec![0u8; format::MAX_FRAME_PAYLOAD as usize];
    let err = e.commit(&[Op::put("k", big)]).unwrap_err();
    assert!(matches!(err, EngineError::TooLarge { .. }), "{err}");
    assert_eq!(e.commit(&ops(1)).unwrap(), 1);
}

fn write(dir: &Path, commits: u64, seed: u64) -> WriteReport {
    let o = WriteOptions {
        commits,
        value_size: 24,
        snapshot_every: 700,
        rotate_bytes: 16 << 10,
        seed,
        ..WriteOptions::default()
    };
    write_commits(dir, &o).unwrap()
}

#[test]
fn write_commits_is_a_pure_function_of_seed_and_seq() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    let whole = write(&a, 3000, 7);
    assert_eq!(
        (whole.first_seq, whole.last_seq, whole.written),
        (1, 3000, 3000)
    );
    let first = write(&b, 1000, 7);
    let second = write(&b, 2000, 7);
    assert_eq!((second.first_seq, second.last_seq), (1001, 3000));
    assert_eq!(second.digest, whole.digest);
    assert_eq!(digest(&a).unwrap(), whole.digest);
    assert_eq!(digest(&b).unwrap(), whole.digest);
    assert_eq!(whole.digest.digest, digest_map(&expected_map(7, 24, 3000)));
    assert_eq!(first.digest.digest, digest_map(&expected_map(7, 24, 1000)));
    let k = write(&c, 1234, 7);
    assert_eq!(k.digest.digest, digest_map(&expected_map(7, 24, 1234)));
    assert!(fs::metadata(a.join("snapshot.bin")).is_ok());
    assert_ne!(whole.digest, write(&tmp.path().join("d"), 3000, 8).digest);
    let map = expected_map(7, 24, 3000);
    assert!(map.len() > 100 && map.len() as u64 <= workload::KEY_SPACE);
    assert!(map.values().all(|v| v.len() == 24));
    assert_eq!(workload_ops(7, 5, 24), workload_ops(7, 5, 24));
    assert_ne!(workload_ops(7, 5, 24), workload_ops(7, 6, 24));
}

#[test]
fn write_commits_stops_cleanly_on_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let o = WriteOptions {
        commits: 100_000,
        value_size: 16,
        rate_per_sec: Some(200.0),
        seed: 3,
        stop: Some(stop.clone()),
        ..WriteOptions::default()
    };
    let setter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(150));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let r = write_commits(tmp.path(), &o).unwrap();
    setter.join().unwrap();
    assert!(r.stopped);
    assert!(r.written > 0 && r.written < 1000, "{} written", r.written);
    assert_eq!(r.position.commit_seq, r.last_seq);
    assert_eq!(
        digest(tmp.path()).unwrap().digest,
        digest_map(&expected_map(3, 16, r.last_seq))
    );
    let bad = WriteOptions {
        rate_per_sec: Some(0.0),
        ..WriteOptions::default()
    };
    assert!(matches!(
        write_commits(tmp.path(), &bad),
        Err(EngineError::InvalidOptions(_))
    ));
}

#[test]
fn a_torn_intent_rolls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut model = KvMap::new();
    let mut e = Engine::open(dir, opts(1)).unwrap();
    commit_range(&mut e, &mut model, 1, 12);
    drop(e);
    fs::write(dir.join("snapshot.intent"), b"{\"snapshot_id\":\"0f").unwrap();
    fs::write(dir.join("snapshot.bin.tmp"), b"MDBSNP01 half").unwrap();
    let image = read_store(dir).unwrap();
    assert_eq!(image.intent, IntentState::Incomplete(None));
    assert_eq!(image.map, model);
    let e = Engine::open(dir, opts(1)).unwrap();
    assert_eq!(e.map(), &model);
    assert_eq!(e.position().snapshot_id, None);
    assert_eq!(fs::read(dir.join("snapshot.intent")).unwrap(), b"");
    assert!(!dir.join("snapshot.bin.tmp").exists());
    assert!(!dir.join("snapshot.bin").exists());
}
