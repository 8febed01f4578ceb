//! Restore and verify against a local-directory bucket filled by hand: WAL files encoded frame
//! by frame, snapshots, segments cut at frame boundaries, manifests and LATEST.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use mushroom_backup::bucket::faults::Op;
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::{Bucket, Part, PutCondition};
use mushroom_backup::manifest::{
    ArchiveEntry, FORMAT, LATEST_KEY, Latest, Manifest, ObjectEntry, SegmentEntry, SideFileEntry,
    SnapshotEntry, archive_key, manifest_key, now_rfc3339, segment_key, side_key, snapshot_key,
};
use mushroom_backup::restore::{RestoreError, RestoreOptions, read_back, restore};
use mushroom_backup::store::disk::{
    ARCHIVE_DIR, LINEAGE_FILE, META_FILE, SNAPSHOT_FILE, WAL_FILE, archive_name, read_lineage,
    read_parent,
};
use mushroom_backup::store::format::{WAL_HEADER_LEN, WalHeader, encode_frame, encode_snapshot};
use mushroom_backup::verify::{VerifyOptions, list_restore_points, restore_points_text, verify};
use support::hooked::Hooked;
use uuid::Uuid;

/// A WAL file: its bytes, and the end offset after each number of frames (`ends[0]` is the
/// header's end).
#[derive(Clone)]
struct Wal {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    id: Uuid,
    number: u64,
    floor: u64,
}

fn wal(number: u64, floor: u64, frames: u64, payload_len: usize) -> Wal {
    let id = Uuid::new_v4();
    let mut bytes = WalHeader {
        wal_id: id,
        number,
        floor,
    }
    .encode()
    .to_vec();
    let mut ends = vec![bytes.len()];
    for seq in floor + 1..=floor + frames {
        let mut payload = format!("commit {seq};").into_bytes();
        payload.resize(payload_len.max(payload.len()) + (seq as usize % 7), b'x');
        encode_frame(seq, &payload, &mut bytes);
        ends.push(bytes.len());
    }
    Wal {
        bytes,
        ends,
        id,
        number,
        floor,
    }
}

/// One generation being "shipped" by hand.
struct Gen {
    generation: u64,
    lineage: Uuid,
    snapshot: Option<(SnapshotEntry, Vec<u8>)>,
    archives: Vec<(ArchiveEntry, Vec<u8>)>,
    wal: Wal,
    /// Segments shipped so far, and how many frames of `wal` they cover.
    segments: Vec<SegmentEntry>,
    shipped_frames: u64,
    side_files: Vec<SideFileEntry>,
}

/// GETs per key.
type GetCounts = Arc<Mutex<HashMap<String, usize>>>;

struct Fx {
    _tmp: tempfile::TempDir,
    bucket: FsBucket,
    root: PathBuf,
    work: PathBuf,
    lineage: Uuid,
}

impl Fx {
    fn new() -> Fx {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("bucket");
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let bucket = FsBucket::open(&root).unwrap();
        Fx {
            _tmp: tmp,
            bucket,
            root,
            work,
            lineage: Uuid::new_v4(),
        }
    }

    /// Uploads `bytes` at `key`, unconditionally.
    async fn put_raw(&self, key: &str, bytes: Vec<u8>) {
        self.bucket
            .put(key, bytes.into(), PutCondition::None)
            .await
            .unwrap();
    }

    /// Writes LATEST naming the manifest at `manifest`, of commit `commit_seq`.
    async fn put_latest(&self, manifest: String, commit_seq: u64) {
        let latest = Latest {
            manifest,
            commit_seq,
            lineage: self.lineage,
            adopted_by: None,
            adopted_at: None,
        };
        self.put_raw(LATEST_KEY, latest.encode()).await;
    }

    async fn put(&self, key: &str, bytes: &[u8]) -> ObjectEntry {
        self.put_raw(key, bytes.to_vec()).await;
        ObjectEntry {
            key: key.to_string(),
            len: bytes.len() as u64,
            crc: crc32fast::hash(bytes),
            lineage: self.lineage,
            generation: mushroom_backup::manifest::parse_generation(key).unwrap(),
            ..Default::default()
        }
    }

    /// Starts a generation: uploads its snapshot (holding `snapshot_seq` commits, if any), its
    /// archives (`(frames, payload_len)` each, numbered from `first_number`), and side files;
    /// `wal_frames` frames are in its wal.bin.
    async fn generation(
        &self,
        generation: u64,
        snapshot_seq: Option<u64>,
        first_number: u64,
        archives: &[u64],
        wal_frames: u64,
        payload_len: usize,
    ) -> Gen {
        let mut snapshot = None;
        let floor0 = snapshot_seq.unwrap_or(0);
        if let Some(seq) = snapshot_seq {
            let id = Uuid::new_v4();
            let bytes = encode_snapshot(id, seq, None, format!("map at {seq}").as_bytes());
            let object = self.put(&snapshot_key(generation), &bytes).await;
            snapshot = Some((
                SnapshotEntry {
                    object,
                    snapshot_id: id,
                    commit_seq: seq,
                },
                bytes,
            ));
        }
        let mut floor = floor0;
        let mut number = first_number;
        let mut archive_entries = Vec::new();
        for &frames in archives {
            let w = wal(number, floor, frames, payload_len);
            let object = self.put(&archive_key(generation, number), &w.bytes).await;
            archive_entries.push((
                ArchiveEntry {
                    object,
                    number,
                    frames,
                },
                w.bytes,
            ));
            floor += frames;
            number += 1;
        }
        let meta = format!("meta of generation {generation}\n").into_bytes();
        let side_files = self.side_files(generation, meta).await;
        Gen {
            generation,
            lineage: self.lineage,
            snapshot,
            archives: archive_entries,
            wal: wal(number, floor, wal_frames, payload_len),
            segments: Vec::new(),
            shipped_frames: 0,
            side_files,
        }
    }

    /// Uploads the segment of `g`'s wal.bin from what is shipped up to `to_frames` frames.
    async fn ship(&self, g: &mut Gen, to_frames: u64) -> SegmentEntry {
        let start = if g.segments.is_empty() {
            0
        } else {
            g.wal.ends[g.shipped_frames as usize]
        };
        let end = g.wal.ends[to_frames as usize];
        let object = self
            .put(
                &segment_key(g.generation, start as u64, end as u64),
                &g.wal.bytes[start..end],
            )
            .await;
        let s = SegmentEntry {
            object,
            start: start as u64,
            end: end as u64,
            frames: to_frames - g.shipped_frames,
        };
        g.segments.push(s.clone());
        g.shipped_frames = to_frames;
        s
    }

    /// Writes a manifest of everything `g` shipped, and LATEST naming it.
    async fn manifest(&self, g: &Gen) -> Manifest {
        let m = manifest_of(g);
        self.publish(&m).await;
        m
    }

    /// Uploads `m`, and LATEST naming it.
    async fn publish(&self, m: &Manifest) {
        assert_eq!(m.lineage, self.lineage, "a manifest of another lineage");
        self.put_raw(&m.key(), m.encode()).await;
        self.put_latest(m.key(), m.commit_seq).await;
    }

    /// Uploads generation `generation`'s side files: `meta` as store.meta, and a lineage file
    /// naming the fixture's lineage.
    async fn side_files(&self, generation: u64, meta: Vec<u8>) -> Vec<SideFileEntry> {
        let lineage = format!("{}\n", self.lineage).into_bytes();
        let mut side_files = Vec::new();
        for (name, bytes) in [(META_FILE, meta), (LINEAGE_FILE, lineage)] {
            let object = self
                .put(&side_key(generation, name, crc32fast::hash(&bytes)), &bytes)
                .await;
            side_files.push(SideFileEntry {
                object,
                name: name.to_string(),
            });
        }
        side_files
    }

    /// The fixture's bucket, counting the GETs of each key `counted` picks.
    fn counting_gets(
        &self,
        counted: fn(&str) -> bool,
    ) -> (Hooked<impl Fn(Op, &str) + Send + Sync + 'static>, GetCounts) {
        let gets = GetCounts::default();
        let counting = Hooked {
            inner: Arc::new(self.bucket.clone()),
            hook: {
                let gets = gets.clone();
                move |op: Op, key: &str| {
                    if op == Op::Get && counted(key) {
                        *gets.lock().unwrap().entry(key.to_string()).or_default() += 1;
                    }
                }
            },
        };
        (counting, gets)
    }

    fn target(&self, name: &str) -> PathBuf {
        self.work.join(name)
    }

    fn object_path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// Entries of the work directory other than `keep` (leftover temp dirs, targets).
    fn work_entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.work)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

fn manifest_of(g: &Gen) -> Manifest {
    let wal_floor = g.archives.first().map_or(g.wal.floor, |a| {
        mushroom_backup::store::format::WalHeader::decode(&a.1)
            .unwrap()
            .floor
    });
    let frames: u64 = g.archives.iter().map(|a| a.0.frames).sum::<u64>() + g.shipped_frames;
    Manifest {
        format: FORMAT,
        lineage: g.lineage,
        generation: g.generation,
        commit_seq: wal_floor + frames,
        created_at: now_rfc3339(),
        wal_floor,
        wal_id: g.wal.id,
        wal_number: g.wal.number,
        snapshot: g.snapshot.as_ref().map(|s| s.0.clone()),
        archives: g.archives.iter().map(|a| a.0.clone()).collect(),
        segments: g.segments.clone(),
        side_files: g.side_files.clone(),
        parent: None,
        branch: None,
        branched_from: None,
    }
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The standard history: generation 1 with a snapshot at 10, archives 5 (11..=20) and
/// 6 (21..=30), wal.bin 7 (31..=50); the manifest covers 15 frames of wal.bin (commit 45);
/// segments for frames 16..=18 and 19..=20 were shipped after it.
async fn standard(fx: &Fx) -> (Gen, Manifest) {
    let mut g = fx.generation(1, Some(10), 5, &[10, 10], 20, 40).await;
    fx.ship(&mut g, 8).await;
    fx.ship(&mut g, 15).await;
    let m = fx.manifest(&g).await;
    fx.ship(&mut g, 18).await;
    fx.ship(&mut g, 20).await;
    (g, m)
}

fn opts() -> RestoreOptions {
    RestoreOptions {
        parallelism: 4,
        ..RestoreOptions::default()
    }
}

/// [`opts`], restoring the restore point only (no later segments).
fn point_only() -> RestoreOptions {
    RestoreOptions {
        restore_point_only: true,
        ..opts()
    }
}

/// The restored directory holds exactly `g`'s files, with `wal_frames` frames of wal.bin.
fn assert_identical(dir: &Path, g: &Gen, wal_frames: usize) {
    assert_eq!(
        read(&dir.join(SNAPSHOT_FILE)),
        g.snapshot.as_ref().unwrap().1
    );
    for (a, bytes) in &g.archives {
        let p = dir.join(ARCHIVE_DIR).join(archive_name(a.number));
        assert_eq!(&read(&p), bytes, "{}", p.display());
    }
    assert_eq!(
        read(&dir.join(WAL_FILE)),
        g.wal.bytes[..g.wal.ends[wal_frames]],
        "wal.bin"
    );
    assert_eq!(
        read(&dir.join(META_FILE)),
        format!("meta of generation {}\n", g.generation).into_bytes()
    );
    assert_eq!(read_lineage(dir).unwrap(), Some(g.lineage));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ARCHIVE_DIR,
            LINEAGE_FILE,
            SNAPSHOT_FILE,
            META_FILE,
            WAL_FILE
        ],
        "no stray files"
    );
}

#[tokio::test]
async fn restore_point_only_rebuilds_byte_identical_files() {
    let fx = Fx::new();
    let (g, m) = standard(&fx).await;
    let to = fx.target("store");
    let report = restore(&fx.bucket, &to, &point_only()).await.unwrap();
    assert_eq!(report.commit_seq, 45);
    assert_eq!(report.manifest_key, m.key());
    assert_eq!(report.extended_segments, 0);
    assert_eq!(report.objects, 1 + 2 + 2 + 2);
    assert_identical(&to, &g, 15);
    assert_eq!(read_back(&to).unwrap().commit_seq, 45);
    assert_eq!(fx.work_entries(), ["store"], "no temp dir left");
}

#[tokio::test]
async fn restore_extends_by_later_segments() {
    let fx = Fx::new();
    let (g, _) = standard(&fx).await;
    let to = fx.target("store");
    let report = restore(&fx.bucket, &to, &opts()).await.unwrap();
    assert_eq!(report.commit_seq, 50);
    assert_eq!(report.extended_segments, 2);
    assert_eq!(report.objects, 1 + 2 + 4 + 2);
    assert_identical(&to, &g, 20);
}

#[tokio::test]
async fn extension_prefers_longest_valid_and_stops_at_gaps() {
    let fx = Fx::new();
    let mut g = fx.generation(1, Some(10), 5, &[10], 30, 40).await;
    fx.ship(&mut g, 5).await;
    fx.manifest(&g).await; // commit 25
    // At offset ends[5]: a valid 5..8 and a corrupt, longer 5..12.
    let short = fx.ship(&mut g, 8).await;
    let (s5, e12) = (g.wal.ends[5], g.wal.ends[12]);
    let mut bad = g.wal.bytes[s5..e12].to_vec();
    bad[40] ^= 0x20;
    let bad_key = segment_key(1, s5 as u64, e12 as u64);
    fx.put(&bad_key, &bad).await;
    fx.ship(&mut g, 10).await; // 8..10 continues the short one
    // A gap: 12..15 does not continue 10.
    g.shipped_frames = 12;
    let gapped = fx.ship(&mut g, 15).await;
    // Both may hold commits past 30: the restore is refused, naming them, before anything
    // is downloaded.
    let to = fx.target("store");
    match restore(&fx.bucket, &to, &opts()).await {
        Err(RestoreError::Partial {
            commit_seq,
            left_out,
        }) => {
            assert_eq!(commit_seq, 30);
            let keys: Vec<&str> = left_out.iter().map(|l| l.key.as_str()).collect();
            assert_eq!(
                keys,
                [bad_key.as_str(), gapped.object.key.as_str()],
                "{left_out:?}"
            );
            assert!(left_out[0].why.contains("CRC"), "{left_out:?}");
            assert!(
                left_out[1].why.contains("no segment continues"),
                "{left_out:?}"
            );
        }
        other => panic!("not refused as partial: {other:?}"),
    }
    assert!(!to.exists());
    let report = restore(
        &fx.bucket,
        &to,
        &RestoreOptions {
            allow_partial: true,
            ..opts()
        },
    )
    .await
    .unwrap();
    assert_eq!(report.commit_seq, 30, "{report}");
    assert_eq!(report.extended_segments, 2);
    assert_eq!(report.left_out.len(), 2);
    assert!(
        report.warnings.iter().any(|w| w.contains("CRC")),
        "{:?}",
        report.warnings
    );
    assert_eq!(read(&to.join(WAL_FILE)), g.wal.bytes[..g.wal.ends[10]]);
    assert!(short.end < e12 as u64);
}

/// Generation 1: no snapshot, archive 1 (1..=10), wal.bin 2 (11..=30), manifests at 20 and
/// 30. Generation 2: snapshot at 30, wal.bin 3 (31..=60), a manifest at 40, segments to 60.
async fn two_generations(fx: &Fx) -> (Gen, Gen, Vec<Manifest>) {
    let mut g1 = fx.generation(1, None, 1, &[10], 20, 20).await;
    fx.ship(&mut g1, 10).await;
    let a = fx.manifest(&g1).await;
    fx.ship(&mut g1, 20).await;
    let b = fx.manifest(&g1).await;
    let mut g2 = fx.generation(2, Some(30), 3, &[], 30, 20).await;
    fx.ship(&mut g2, 10).await;
    let c = fx.manifest(&g2).await;
    fx.ship(&mut g2, 20).await;
    fx.ship(&mut g2, 30).await;
    (g1, g2, vec![a, b, c])
}

async fn restore_at(fx: &Fx, name: &str, at: u64, only: bool) -> Result<PathBuf, RestoreError> {
    let to = fx.target(name);
    let r = restore(
        &fx.bucket,
        &to,
        &RestoreOptions {
            at: Some(at),
            restore_point_only: only,
            ..opts()
        },
    )
    .await?;
    assert_eq!(r.commit_seq, at);
    assert_eq!(read_back(&to).unwrap().commit_seq, at);
    Ok(to)
}

#[tokio::test]
async fn at_picks_the_nearest_snapshot_and_cuts_exactly() {
    let fx = Fx::new();
    let (g1, g2, ms) = two_generations(&fx).await;

    // 5 is inside archive 1: it becomes wal.bin, cut after frame 5.
    let to = restore_at(&fx, "at5", 5, false).await.unwrap();
    assert_eq!(
        read(&to.join(WAL_FILE)),
        g1.archives[0].1[..wal_end(&g1.archives[0].1, 5)]
    );
    assert!(!to.join(ARCHIVE_DIR).exists());
    assert!(!to.join(SNAPSHOT_FILE).exists());

    // 25: generation 1's manifest at 30 (the one at 20 does not reach it).
    let to = restore_at(&fx, "at25", 25, false).await.unwrap();
    assert_eq!(read(&to.join(WAL_FILE)), g1.wal.bytes[..g1.wal.ends[15]]);
    assert_eq!(
        read(&to.join(ARCHIVE_DIR).join(archive_name(1))),
        g1.archives[0].1
    );

    // 30: generation 2's snapshot holds exactly 30: wal.bin is just its header.
    let to = restore_at(&fx, "at30", 30, false).await.unwrap();
    assert_eq!(read(&to.join(WAL_FILE)), g2.wal.bytes[..WAL_HEADER_LEN]);
    assert_eq!(
        read(&to.join(SNAPSHOT_FILE)),
        g2.snapshot.as_ref().unwrap().1
    );

    // 55: past generation 2's manifest, reached by its segments.
    let to = restore_at(&fx, "at55", 55, false).await.unwrap();
    assert_eq!(read(&to.join(WAL_FILE)), g2.wal.bytes[..g2.wal.ends[25]]);

    // 61 is past everything; with --restore-point-only 55 is too.
    let e = restore_at(&fx, "at61", 61, false).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "no restore point reaches commit 61 (reachable: 0..=60)"
    );
    let e = restore_at(&fx, "at55only", 55, true).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "no restore point reaches commit 55 (reachable: 0..=40)"
    );
    assert!(!fx.target("at61").exists());
    assert_eq!(ms.len(), 3);
}

/// End offset of frame `seq` in a WAL file.
fn wal_end(bytes: &[u8], seq: u64) -> usize {
    let scan = mushroom_backup::store::format::scan_wal(bytes).unwrap();
    scan.frames.iter().find(|f| f.seq == seq).unwrap().end
}

#[tokio::test]
async fn target_must_be_missing_or_empty() {
    let fx = Fx::new();
    standard(&fx).await;
    // Not empty: refused, untouched.
    let full = fx.target("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("precious"), b"keep me").unwrap();
    let e = restore(&fx.bucket, &full, &opts()).await.unwrap_err();
    assert!(matches!(e, RestoreError::TargetNotEmpty { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("target {} is not empty", full.display())
    );
    assert_eq!(read(&full.join("precious")), b"keep me");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);
    // Empty: replaced, keeping its permissions.
    let empty = fx.target("empty");
    std::fs::create_dir(&empty).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o750)).unwrap();
    restore(&fx.bucket, &empty, &opts()).await.unwrap();
    assert_eq!(read_back(&empty).unwrap().commit_seq, 50);
    let mode = std::fs::metadata(&empty).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o750);
    // Missing, with a missing parent: created.
    let deep = fx.work.join("a/b/store");
    restore(&fx.bucket, &deep, &opts()).await.unwrap();
    assert_eq!(read_back(&deep).unwrap().commit_seq, 50);
    assert_eq!(fx.work_entries(), ["a", "empty", "full"]);
}

#[tokio::test]
async fn a_flipped_byte_in_any_object_fails_naming_it_and_leaves_nothing() {
    let fx = Fx::new();
    let (_, m) = standard(&fx).await;
    let keys: Vec<String> = m.objects().map(|o| o.key.clone()).collect();
    assert_eq!(keys.len(), 7);
    // An existing empty target stays empty; a missing one stays missing.
    let empty = fx.target("empty");
    std::fs::create_dir(&empty).unwrap();
    for key in &keys {
        let path = fx.object_path(key);
        let good = read(&path);
        let mut bad = good.clone();
        let i = bad.len() / 2;
        bad[i] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        for to in [fx.target("missing"), empty.clone()] {
            let e = restore(&fx.bucket, &to, &opts()).await.unwrap_err();
            assert!(
                matches!(&e, RestoreError::CrcMismatch { key: k, .. } if k == key),
                "{key}: {e}"
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("{key}: CRC mismatch (expected ")),
                "{e}"
            );
            assert_eq!(fx.work_entries(), ["empty"], "{key}: nothing left behind");
            assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
        }
        // Shorter than stated.
        std::fs::write(&path, &good[..good.len() - 1]).unwrap();
        let e = restore(&fx.bucket, &fx.target("missing"), &opts())
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with(&format!("{key}: ")), "{e}");
        assert_eq!(fx.work_entries(), ["empty"]);
        std::fs::write(&path, &good).unwrap();
    }
    restore(&fx.bucket, &fx.target("missing"), &opts())
        .await
        .unwrap();
}

#[tokio::test]
async fn large_objects_come_by_ranges_and_are_checked() {
    let fx = Fx::new();
    use mushroom_backup::restore::stage::{RANGE_CHUNK, WHOLE_OBJECT_MAX, ranges};
    // Whole objects up to the limit; beyond it chunks, a tail under half a chunk folded in.
    const MIB: u64 = 1 << 20;
    let whole = |len: u64| ranges(len).len() == 1 && ranges(len)[0] == (0..len);
    assert!(whole(0));
    assert!(whole(16 * MIB + 4096));
    assert!(whole(WHOLE_OBJECT_MAX));
    assert_eq!(RANGE_CHUNK, 16 * MIB);
    let n = WHOLE_OBJECT_MAX + 1;
    assert_eq!(
        ranges(n),
        [
            0..16 * MIB,
            16 * MIB..32 * MIB,
            32 * MIB..48 * MIB,
            48 * MIB..n
        ]
    );
    assert_eq!(
        ranges(72 * MIB),
        [
            0..16 * MIB,
            16 * MIB..32 * MIB,
            32 * MIB..48 * MIB,
            48 * MIB..64 * MIB,
            64 * MIB..72 * MIB
        ]
    );
    // Archive 1 holds 1,100 frames of ~64 KiB: over the whole-object limit.
    let mut g = fx.generation(1, Some(0), 1, &[1100], 3, 64 << 10).await;
    fx.ship(&mut g, 3).await;
    let m = fx.manifest(&g).await;
    let archive = &m.archives[0].object;
    assert!(archive.len > WHOLE_OBJECT_MAX);
    let to = fx.target("store");
    restore(&fx.bucket, &to, &opts()).await.unwrap();
    assert_eq!(
        read(&to.join(ARCHIVE_DIR).join(archive_name(1))),
        g.archives[0].1
    );
    assert_eq!(read_back(&to).unwrap().commit_seq, 1103);
    // A flipped byte in the second chunk, and one byte too many.
    let path = fx.object_path(&archive.key);
    let good = read(&path);
    let mut bad = good.clone();
    bad[17 << 20] ^= 0x80;
    std::fs::write(&path, &bad).unwrap();
    let e = restore(&fx.bucket, &fx.target("bad"), &opts())
        .await
        .unwrap_err();
    assert!(matches!(e, RestoreError::CrcMismatch { .. }), "{e}");
    let mut long = good.clone();
    long.push(0);
    std::fs::write(&path, &long).unwrap();
    let e = restore(&fx.bucket, &fx.target("bad"), &opts())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("longer than"), "{e}");
    assert_eq!(fx.work_entries(), ["store"]);
}

#[tokio::test]
async fn a_manifest_that_does_not_read_back_leaves_nothing() {
    let fx = Fx::new();
    let (g, mut m) = standard(&fx).await;
    // A segment whose entry is honest about its bytes (length, CRC), but whose bytes are not
    // the frames the manifest counts: every download check passes, the read-back does not.
    let mut forged = read(&fx.object_path(&m.segments[1].object.key));
    let i = forged.len() / 2;
    forged[i] ^= 0x04;
    m.segments[1].object = fx.put("gen/0000000001/wal/forged.seg", &forged).await;
    fx.put_raw(&m.key(), m.encode()).await;
    let to = fx.target("store");
    let e = restore(&fx.bucket, &to, &point_only()).await.unwrap_err();
    assert!(matches!(e, RestoreError::ReadBack { .. }), "{e}");
    assert_eq!(fx.work_entries(), Vec::<String>::new());
    drop(g);
}

#[tokio::test]
async fn adopt_writes_a_new_lineage_and_the_parent_record() {
    let fx = Fx::new();
    let (_, m) = standard(&fx).await;
    let to = fx.target("store");
    let r = restore(
        &fx.bucket,
        &to,
        &RestoreOptions {
            adopt: true,
            ..opts()
        },
    )
    .await
    .unwrap();
    let lineage = read_lineage(&to).unwrap().unwrap();
    assert_ne!(lineage, fx.lineage);
    assert_eq!(r.new_lineage, Some(lineage));
    let parent = read_parent(&to).unwrap().unwrap();
    assert_eq!(parent.lineage, fx.lineage);
    assert_eq!(parent.manifest, m.key());
    assert_eq!(parent.commit_seq, m.commit_seq);
    assert_eq!(r.commit_seq, 50);
    assert_eq!(r.parent, Some(parent));
    // Without adopt, neither changes.
    let plain = fx.target("plain");
    restore(&fx.bucket, &plain, &opts()).await.unwrap();
    assert_eq!(read_lineage(&plain).unwrap(), Some(fx.lineage));
    assert_eq!(read_parent(&plain).unwrap(), None);
}

#[tokio::test]
async fn a_bad_latest_falls_back_to_the_newest_valid_manifest() {
    let fx = Fx::new();
    let (_, _, ms) = two_generations(&fx).await;
    // LATEST names a manifest that is gone; the newest one is junk.
    fx.put_latest(manifest_key(99), 99).await;
    fx.put_raw(&manifest_key(77), b"{not json".to_vec()).await;
    let r = restore(&fx.bucket, &fx.target("store"), &point_only())
        .await
        .unwrap();
    assert_eq!(r.manifest_key, ms[2].key());
    assert_eq!(r.commit_seq, 40);
    assert!(r.warnings[0].contains("no such object"), "{:?}", r.warnings);
    assert!(
        r.warnings[0].contains(&manifest_key(77)),
        "{:?}",
        r.warnings
    );
    // No manifest at all.
    let empty = Fx::new();
    let e = restore(&empty.bucket, &empty.target("s"), &opts())
        .await
        .unwrap_err();
    assert!(matches!(e, RestoreError::NoRestorePoint { .. }), "{e}");
}

#[tokio::test]
async fn hostile_side_file_names_are_refused() {
    // Each name, as a manifest in the bucket may give it, and what the refusal says.
    let hostile = [
        ("../escaped", "not a plain file name"),
        ("../../etc/passwd", "not a plain file name"),
        ("/etc/passwd", "not a plain file name"),
        ("sub/dir", "not a plain file name"),
        ("..", "not a plain file name"),
        (".", "not a plain file name"),
        ("", "not a plain file name"),
        (".hidden", "not a plain file name"),
        ("nul\0byte", "not a plain file name"),
        ("wal.bin", "reserved"),
        ("archive", "reserved"),
        ("wal.position", "reserved"),
        ("backup.parent", "reserved"),
    ];
    for (name, why) in hostile {
        let name = name.to_string();
        let fx = Fx::new();
        let (g, _) = standard(&fx).await;
        let mut m = manifest_of(&g);
        m.segments.truncate(2);
        m.commit_seq = 45;
        m.side_files[0].name = name.clone();
        fx.put_raw(&m.key(), m.encode()).await;
        let e = restore(&fx.bucket, &fx.target("store"), &opts())
            .await
            .unwrap_err();
        assert!(e.to_string().contains(why), "{name:?}: {e}");
        assert!(!fx.work.join("escaped").exists());
        assert_eq!(fx.work_entries(), Vec::<String>::new(), "{name:?}");
    }
}

#[tokio::test]
async fn verify_passes_on_good_data_and_fetches_shared_objects_once() {
    let fx = Fx::new();
    let (_, _, ms) = two_generations(&fx).await;
    // GETs per key.
    let (counting, gets) = fx.counting_gets(|_| true);
    let report = verify(&counting, &VerifyOptions::default()).await.unwrap();
    assert!(report.ok, "{report}");
    assert_eq!(report.manifests.len(), 3);
    assert!(
        report
            .manifests
            .iter()
            .all(|m| m.ok && m.problems.is_empty())
    );
    let latest = report.latest.as_ref().unwrap();
    assert!(latest.ok);
    assert_eq!(latest.manifest.as_deref(), Some(ms[2].key().as_str()));
    // Archive 1 and segment 0 of generation 1 are named by two manifests: fetched once.
    let gets = gets.lock().unwrap();
    assert!(gets.values().all(|n| *n == 1), "{gets:?}");
    assert_eq!(gets[&ms[0].archives[0].object.key], 1);
    let text = report.to_string();
    assert!(text.ends_with("all 3 restore points verify"), "{text}");
    assert_eq!(text.lines().count(), 5);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["manifests"][2]["commit_seq"], 40);
}

#[tokio::test]
async fn verify_names_a_flipped_or_missing_object() {
    let fx = Fx::new();
    let (_, _, ms) = two_generations(&fx).await;
    let keys: std::collections::BTreeSet<String> = ms
        .iter()
        .flat_map(|m| m.objects().map(|o| o.key.clone()))
        .collect();
    for key in &keys {
        let path = fx.object_path(key);
        let good = read(&path);
        let mut bad = good.clone();
        let i = bad.len() / 2;
        bad[i] ^= 0x10;
        for (how, content) in [("CRC mismatch", Some(bad)), ("missing", None)] {
            match &content {
                Some(b) => std::fs::write(&path, b).unwrap(),
                None => std::fs::remove_file(&path).unwrap(),
            }
            let report = verify(&fx.bucket, &VerifyOptions::default()).await.unwrap();
            assert!(!report.ok, "{key}");
            for (m, check) in ms.iter().zip(&report.manifests) {
                let names = m.objects().any(|o| &o.key == key);
                assert_eq!(check.ok, !names, "{key}: {check}");
                if names {
                    assert_eq!(check.problems.len(), 1, "{check}");
                    assert!(
                        check.problems[0].starts_with(&format!("{key}: {how}")),
                        "{check}"
                    );
                }
            }
            // LATEST names generation 2's manifest: it fails exactly when that one does.
            assert_eq!(report.latest.as_ref().unwrap().ok, report.manifests[2].ok);
            assert!(
                report
                    .to_string()
                    .contains(&format!("FAIL  {}", ms[0].key()))
                    || !ms[0].objects().any(|o| &o.key == key)
            );
        }
        std::fs::write(&path, &good).unwrap();
    }
    assert!(
        verify(&fx.bucket, &VerifyOptions::default())
            .await
            .unwrap()
            .ok
    );
}

#[tokio::test]
async fn verify_reports_junk_and_content_the_manifest_does_not_describe() {
    let fx = Fx::new();
    let (g, mut m) = standard(&fx).await;
    // Junk under manifests/, and LATEST naming it.
    fx.put_raw(&manifest_key(7), b"\x00junk".to_vec()).await;
    fx.put_raw("manifests/notes.txt", b"hi".to_vec()).await;
    // A manifest whose objects are intact but whose counts lie (sums still agree).
    m.archives[0].frames -= 1;
    m.segments[0].frames += 1;
    m.commit_seq = 45;
    let lie = manifest_key(45);
    fx.put_raw(&lie, m.encode()).await;
    fx.put_latest(manifest_key(7), 7).await;
    let report = verify(&fx.bucket, &VerifyOptions::default()).await.unwrap();
    assert!(!report.ok);
    let by_key = |k: &str| report.manifests.iter().find(|c| c.key == k).unwrap();
    let junk = by_key(&manifest_key(7));
    assert!(!junk.ok);
    assert_eq!(junk.commit_seq, Some(7));
    assert!(junk.problems[0].contains("not a manifest"), "{junk}");
    assert!(!by_key("manifests/notes.txt").ok);
    let lying = by_key(&lie);
    let text = lying.to_string();
    assert!(
        text.contains(&format!(
            "{}: 10 valid frames, the manifest says 9",
            m.archives[0].object.key
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{}: floor 20, expected 19",
            m.archives[1].object.key
        )),
        "{text}"
    );
    let l = report.latest.as_ref().unwrap();
    assert!(!l.ok && l.problems[0].contains("does not verify"), "{l}");

    // ls lists all of them, junk with its error, and which one LATEST names.
    let points = list_restore_points(&fx.bucket).await.unwrap();
    assert_eq!(points.len(), 3);
    assert_eq!(points[0].key, manifest_key(7));
    assert!(points[0].is_latest && points[0].error.is_some());
    assert_eq!(points[1].key, lie);
    assert!(points[1].error.is_none() && !points[1].is_latest);
    assert_eq!(points[1].bytes, Some(m.objects().map(|o| o.len).sum()));
    assert!(points[2].error.as_deref() == Some("not a manifest key"));
    let text = restore_points_text(&points);
    assert_eq!(text.lines().count(), 3);
    assert!(text.contains("INVALID"), "{text}");
    drop(g);
}

#[tokio::test]
async fn verify_checks_wal_identity_and_segment_chain() {
    let fx = Fx::new();
    let (g, m) = standard(&fx).await;
    // The first segment of another WAL file (other id) swapped in, honestly described.
    let mut other = m.clone();
    let foreign = wal(g.wal.number, g.wal.floor, 8, 40);
    other.segments[0].object = fx
        .put(
            "gen/0000000001/wal/foreign.seg",
            &foreign.bytes[..foreign.ends[8]],
        )
        .await;
    other.segments[0].end = foreign.ends[8] as u64;
    other.segments[1].start = foreign.ends[8] as u64;
    // The second segment of a later offset: its frames start at the wrong commit.
    let late = &g.wal.bytes[g.wal.ends[9]..g.wal.ends[16]];
    other.segments[1].object = fx.put("gen/0000000001/wal/late.seg", late).await;
    other.segments[1].end = other.segments[1].start + late.len() as u64;
    let report = {
        fx.put_raw(&m.key(), other.encode()).await;
        verify(&fx.bucket, &VerifyOptions::default()).await.unwrap()
    };
    let c = &report.manifests[0];
    assert!(!c.ok);
    let text = c.problems.join("\n");
    assert!(text.contains("foreign.seg: WAL id"), "{text}");
    assert!(
        text.contains("late.seg: starts at commit 40, expected 39"),
        "{text}"
    );
}

/// Ships a store the reference engine wrote as generation `generation`: its snapshot, every
/// archive, store.meta and a lineage, and wal.bin as three segments at frame boundaries of
/// which the manifest names the first two. Returns the manifest.
async fn ship_store(fx: &Fx, dir: &Path, generation: u64) -> Manifest {
    use mushroom_backup::manifest::GEN_PREFIX;
    use mushroom_backup::store::format::{decode_snapshot, scan_wal};
    assert!(GEN_PREFIX.starts_with("gen"));
    let snapshot = match std::fs::read(dir.join(SNAPSHOT_FILE)) {
        Ok(bytes) => {
            let (h, _) = decode_snapshot(&bytes).unwrap();
            Some(SnapshotEntry {
                object: fx.put(&snapshot_key(generation), &bytes).await,
                snapshot_id: h.snapshot_id,
                commit_seq: h.commit_seq,
            })
        }
        Err(_) => None,
    };
    let mut names: Vec<_> = std::fs::read_dir(dir.join(ARCHIVE_DIR))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut archives = Vec::new();
    let mut wal_floor = None;
    for path in names {
        let bytes = read(&path);
        let scan = scan_wal(&bytes).unwrap();
        wal_floor.get_or_insert(scan.header.floor);
        archives.push(ArchiveEntry {
            object: fx
                .put(&archive_key(generation, scan.header.number), &bytes)
                .await,
            number: scan.header.number,
            frames: scan.frames.len() as u64,
        });
    }
    let wal_bytes = read(&dir.join(WAL_FILE));
    let scan = scan_wal(&wal_bytes).unwrap();
    let wal_floor = wal_floor.unwrap_or(scan.header.floor);
    let n = scan.frames.len();
    assert!(
        n >= 3,
        "wal.bin needs frames to cut: {n} frames, floor {}, {:?}",
        scan.header.floor,
        std::fs::read_dir(dir.join(ARCHIVE_DIR)).map(|d| d.count())
    );
    let cuts = [
        0,
        scan.frames[n / 3].end,
        scan.frames[2 * n / 3].end,
        wal_bytes.len(),
    ];
    let mut segments = Vec::new();
    for w in cuts.windows(2) {
        let frames = scan
            .frames
            .iter()
            .filter(|f| f.end > w[0] && f.end <= w[1])
            .count() as u64;
        segments.push(SegmentEntry {
            object: fx
                .put(
                    &segment_key(generation, w[0] as u64, w[1] as u64),
                    &wal_bytes[w[0]..w[1]],
                )
                .await,
            start: w[0] as u64,
            end: w[1] as u64,
            frames,
        });
    }
    segments.pop(); // shipped after the manifest
    let side_files = fx.side_files(generation, read(&dir.join(META_FILE))).await;
    let frames: u64 = archives.iter().map(|a| a.frames).sum::<u64>()
        + segments.iter().map(|s| s.frames).sum::<u64>();
    let m = Manifest {
        format: FORMAT,
        lineage: fx.lineage,
        generation,
        commit_seq: wal_floor + frames,
        created_at: now_rfc3339(),
        wal_floor,
        wal_id: scan.header.wal_id,
        wal_number: scan.header.number,
        snapshot,
        archives,
        segments,
        side_files,
        parent: None,
        branch: None,
        branched_from: None,
    };
    Manifest::decode(&m.key(), &m.encode()).unwrap();
    fx.publish(&m).await;
    m
}

#[tokio::test]
async fn a_store_the_engine_wrote_restores_to_the_same_digest_at_any_commit() {
    use mushroom_backup::store::engine::{
        WriteOptions, digest, digest_map, expected_map, write_commits,
    };
    let fx = Fx::new();
    let src = fx._tmp.path().join("source");
    let w = WriteOptions {
        commits: 700,
        value_size: 24,
        snapshot_every: 250,
        rotate_bytes: 2 << 10,
        seed: 11,
        ..WriteOptions::default()
    };
    write_commits(&src, &w).unwrap();
    // Then 40 commits into a wal.bin that does not rotate.
    let tail = WriteOptions {
        commits: 40,
        rotate_bytes: 0,
        snapshot_every: 0,
        ..w.clone()
    };
    let written = write_commits(&src, &tail).unwrap();
    assert_eq!(written.last_seq, 740);
    let m = ship_store(&fx, &src, 1).await;
    let snap = m.snapshot.as_ref().unwrap().commit_seq;
    assert!(!m.archives.is_empty(), "the workload rotated");
    assert!(m.commit_seq < 740, "the last segment extends the manifest");

    // With and without the reference engine's own reading before the rename.
    for engine_check in [false, true] {
        let to = fx.target(&format!("latest-{engine_check}"));
        let r = restore(
            &fx.bucket,
            &to,
            &RestoreOptions {
                engine_check,
                ..opts()
            },
        )
        .await
        .unwrap();
        assert_eq!(r.commit_seq, 740);
        assert_eq!(r.extended_segments, 1);
        assert_eq!(digest(&to).unwrap(), written.digest);
    }
    assert!(
        verify(&fx.bucket, &VerifyOptions::default())
            .await
            .unwrap()
            .ok
    );

    // Every reachable commit from the snapshot on: the first archive, the last one, wal.bin
    // inside the manifest and past it.
    let first_archive_end = snap.max(m.wal_floor) + m.archives[0].frames;
    for at in [
        snap,
        snap + 1,
        first_archive_end,
        m.commit_seq - 1,
        m.commit_seq,
        650,
        700,
    ] {
        let to = fx.target(&format!("at{at}"));
        let r = restore(
            &fx.bucket,
            &to,
            &RestoreOptions {
                at: Some(at),
                engine_check: at % 2 == 0,
                ..opts()
            },
        )
        .await
        .unwrap();
        assert_eq!(r.commit_seq, at);
        let d = digest(&to).unwrap();
        assert_eq!(d.commit_seq, at);
        assert_eq!(d.digest, digest_map(&expected_map(11, 24, at)), "at {at}");
    }
    let e = restore(
        &fx.bucket,
        &fx.target("early"),
        &RestoreOptions {
            at: Some(snap - 1),
            ..opts()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "no restore point reaches commit {} (reachable: {snap}..=740)",
            snap - 1
        )
    );
}

#[tokio::test]
async fn the_next_restore_removes_what_a_crashed_one_left() {
    let fx = Fx::new();
    standard(&fx).await;
    // A crashed restore into "store" (its lock file released), and one into another target.
    let crashed = fx
        .work
        .join(".store.restore-0b0e8a55-0000-4000-8000-000000000000");
    std::fs::create_dir_all(crashed.join(ARCHIVE_DIR)).unwrap();
    std::fs::write(crashed.join(".restore.lock"), b"").unwrap();
    std::fs::write(crashed.join(WAL_FILE), b"half").unwrap();
    let other = fx.work.join(".other.restore-1");
    std::fs::create_dir(&other).unwrap();
    restore(&fx.bucket, &fx.target("store"), &opts())
        .await
        .unwrap();
    assert_eq!(fx.work_entries(), [".other.restore-1", "store"]);
}

/// A bucket whose `get_buffers` hands out each response in buffers of uneven sizes (1 byte to
/// 300 KiB), as a transport may: the restore must write and check them as one object.
struct Split(FsBucket);

#[async_trait::async_trait]
impl Bucket for Split {
    fn url(&self) -> String {
        self.0.url()
    }
    async fn get_at_most(
        &self,
        key: &str,
        at_most: u64,
    ) -> Result<mushroom_backup::bucket::Object, mushroom_backup::bucket::BucketError> {
        self.0.get_at_most(key, at_most).await
    }
    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes, mushroom_backup::bucket::BucketError> {
        self.0.get_range(key, range).await
    }
    async fn get_buffers(
        &self,
        key: &str,
        part: Part,
    ) -> Result<Vec<bytes::Bytes>, mushroom_backup::bucket::BucketError> {
        let mut whole = match part {
            Part::Whole { at_most } => self.0.get_at_most(key, at_most).await?.data,
            Part::Range(r) => self.0.get_range(key, r).await?,
        };
        let sizes = [1usize, 7, 4096, 300 << 10, 13, 65536];
        let mut out = Vec::new();
        for n in sizes.iter().cycle() {
            if whole.is_empty() {
                break;
            }
            out.push(whole.split_to((*n).min(whole.len())));
        }
        Ok(out)
    }
    async fn head(
        &self,
        key: &str,
    ) -> Result<Option<mushroom_backup::bucket::ObjectMeta>, mushroom_backup::bucket::BucketError>
    {
        self.0.head(key).await
    }
    async fn put_with(
        &self,
        key: &str,
        body: mushroom_backup::bucket::Body,
        opts: mushroom_backup::bucket::PutOpts,
    ) -> Result<String, mushroom_backup::bucket::BucketError> {
        self.0.put_with(key, body, opts).await
    }
    async fn delete(
        &self,
        key: &str,
        if_match: Option<&str>,
    ) -> Result<(), mushroom_backup::bucket::BucketError> {
        self.0.delete(key, if_match).await
    }
    async fn list(
        &self,
        query: mushroom_backup::bucket::ListQuery<'_>,
    ) -> Result<mushroom_backup::bucket::ListPage, mushroom_backup::bucket::BucketError> {
        self.0.list(query).await
    }
}

/// Responses in many buffers (written behind the format's reader, `restore::fetch`) restore
/// the same files, and a flipped byte in any object, in whichever buffer it falls, still fails
/// naming the object and leaves nothing.
#[tokio::test]
async fn responses_in_many_buffers_restore_the_same_files_and_are_checked() {
    let fx = Fx::new();
    let (g, m) = standard(&fx).await;
    let split = Split(fx.bucket.clone());
    let only = point_only();
    let to = fx.target("store");
    let report = restore(&split, &to, &only).await.unwrap();
    assert_eq!(report.commit_seq, 45);
    assert_identical(&to, &g, 15);
    std::fs::remove_dir_all(&to).unwrap();
    for key in m.objects().map(|o| o.key.clone()).collect::<Vec<_>>() {
        let path = fx.object_path(&key);
        let good = read(&path);
        for i in [0, 1, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            let e = restore(&split, &fx.target("missing"), &only)
                .await
                .unwrap_err();
            assert!(
                matches!(&e, RestoreError::CrcMismatch { key: k, .. } if *k == key),
                "{key} byte {i}: {e}"
            );
            assert!(fx.work_entries().is_empty(), "{key}: nothing left behind");
        }
        std::fs::write(&path, &good).unwrap();
    }
}

/// `ListRestorePoints`' span GETs the oldest and the newest valid manifest once each: with one
/// manifest, that is one GET, not the same one twice.
#[tokio::test]
async fn the_restorable_span_gets_each_manifest_it_needs_once() {
    let fx = Fx::new();
    let mut g = fx.generation(1, Some(10), 5, &[10], 10, 40).await;
    fx.ship(&mut g, 4).await;
    let first = fx.manifest(&g).await;
    let (counting, gets) = fx.counting_gets(|key| key.starts_with("manifests/"));
    let span = mushroom_backup::restore::at_time::restorable_span(&counting)
        .await
        .unwrap();
    assert!(span.is_some());
    assert_eq!(
        *gets.lock().unwrap(),
        HashMap::from([(first.key(), 1)]),
        "one manifest, one GET"
    );

    // Two manifests: each once.
    fx.ship(&mut g, 8).await;
    let second = fx.manifest(&g).await;
    gets.lock().unwrap().clear();
    let (earliest, latest) = mushroom_backup::restore::at_time::restorable_span(&counting)
        .await
        .unwrap()
        .unwrap();
    assert!(earliest <= latest);
    assert_eq!(
        *gets.lock().unwrap(),
        HashMap::from([(first.key(), 1), (second.key(), 1)])
    );
}
