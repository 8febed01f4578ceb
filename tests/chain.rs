//! The chain of segments past a restore point, in every encoding (issue 40, findings 1, 2 and
//! 5b of the fourth security review): what the worker counted durable — what `durability =
//! sync` acknowledges to a node — is what a restore reaches and what the worker's own resume
//! takes on, encrypted or not, compressible or not; a second chain of segments (a dead end a
//! fenced former holder's delayed PUT leaves, or a planted one) never hides the chain that
//! reaches further; and a restore that leaves listed data out says so, in its report and
//! (the CLI) in its exit status.
//!
//! Each case is a real worker over a `file://` bucket: a first run writes a restore point,
//! more commits are written, and a second run ships their segments and dies before its
//! manifest PUT (a crash of the process, through the fault-injecting bucket). On `a097102`
//! the sealed cases restored the first restore point only (every sealed segment zstd did not
//! shrink by 51 bytes is longer than its key's range, which restore and resume refused), and
//! the dead end stopped the restore at its end.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use mushroom_backup::at_rest::Compression;
use mushroom_backup::at_rest::chain::{LeftOut, LeftOutKind};
use mushroom_backup::bucket::faults::{CrashKind, Fault, FaultPlan, FaultyBucket, Op};
use mushroom_backup::bucket::{Body, DynBucket, PutCondition};
use mushroom_backup::crypto::{Encryption, WriterEncryption};
use mushroom_backup::restore::{self, RestoreOptions, keys::RestoreKeys};
use mushroom_backup::store::engine::{ValueKind, WriteOptions};
use mushroom_backup::store::format::{WAL_HEADER_LEN, scan_frames};
use mushroom_backup::worker::WorkerConfig;
use support::store::{config, digest, fs_bucket, worker, write_with};

/// How a case's store is encoded.
#[derive(Debug, Clone, Copy)]
struct Mode {
    sealed: bool,
    zstd: bool,
    values: ValueKind,
}

/// Neither sealed nor compressed, values that do not compress.
const PLAIN: Mode = Mode {
    sealed: false,
    zstd: false,
    values: ValueKind::Random,
};

fn modes() -> Vec<Mode> {
    let mut out = Vec::new();
    for sealed in [false, true] {
        for zstd in [false, true] {
            for values in [ValueKind::Random, ValueKind::Text] {
                out.push(Mode {
                    sealed,
                    zstd,
                    values,
                });
            }
        }
    }
    out
}

struct Case {
    config: WorkerConfig,
    keys: RestoreKeys,
}

fn case(mode: Mode) -> Case {
    let mut c = config();
    c.compression = match mode.zstd {
        true => Compression::Zstd { level: 3 },
        false => Compression::None,
    };
    let mut keys = RestoreKeys::default();
    if mode.sealed {
        let (wrap, unwrap) = support::keks::key_file_kek();
        c.encryption = WriterEncryption {
            keys: Some(Encryption {
                wrap: vec![wrap],
                unwrap: vec![unwrap.clone()],
                warnings: Vec::new(),
            }),
            allow_mixed: false,
        };
        keys = RestoreKeys::new(vec![unwrap]);
    }
    Case { config: c, keys }
}

/// One case's temp dir: its store (`s`), its `file://` bucket (`b`, `raw`) and how the store
/// is encoded.
struct Bed {
    t: tempfile::TempDir,
    store: PathBuf,
    root: PathBuf,
    raw: DynBucket,
    mode: Mode,
    c: Case,
}

impl Bed {
    fn new(mode: Mode) -> Bed {
        let t = tempfile::tempdir().unwrap();
        let (store, root) = (t.path().join("s"), t.path().join("b"));
        let raw = fs_bucket(&root);
        Bed {
            t,
            store,
            root,
            raw,
            mode,
            c: case(mode),
        }
    }

    /// `name` in the case's temp dir.
    fn path(&self, name: &str) -> PathBuf {
        self.t.path().join(name)
    }

    /// Writes `n` commits more to the store (values of the case's kind).
    fn commits(&self, n: u64, seed: u64) {
        commits(&self.store, n, self.mode.values, seed);
    }

    /// Writes `n` commits and runs a worker to its restore point; returns the restore point.
    async fn with_restore_point(mode: Mode, n: u64) -> (Bed, Option<u64>) {
        let bed = Bed::new(mode);
        bed.commits(n, 1);
        let first = bed.worker(bed.raw.clone()).run_once().await.unwrap();
        (bed, first.restore_point)
    }

    /// A worker of the case's store over `bucket`.
    fn worker(&self, bucket: DynBucket) -> mushroom_backup::worker::BackupWorker {
        worker(&self.store, bucket, self.c.config.clone())
    }

    /// [`ship_and_die`] on this case.
    async fn ship_and_die(&self) -> u64 {
        ship_and_die(&self.store, &self.raw, &self.c).await
    }
}

/// A case's bucket, every operation on it logged.
fn counting(raw: &DynBucket) -> Arc<FaultyBucket> {
    Arc::new(FaultyBucket::new(raw.clone(), FaultPlan::none()))
}

/// The keys of the segments (`/wal/`) that `f` saw one of `ops` on, in order.
fn wal_keys(f: &FaultyBucket, ops: &[Op]) -> Vec<String> {
    f.log()
        .into_iter()
        .filter(|e| ops.contains(&e.op) && e.key.contains("/wal/"))
        .map(|e| e.key)
        .collect()
}

fn commits(store: &Path, n: u64, values: ValueKind, seed: u64) {
    write_with(
        store,
        WriteOptions {
            commits: n,
            value_size: 200,
            seed,
            value_kind: values,
            ..WriteOptions::default()
        },
    );
}

/// A bucket whose process dies before any manifest PUT: the segments before it are shipped.
fn dies_before_a_manifest(raw: &DynBucket) -> DynBucket {
    Arc::new(FaultyBucket::new(
        raw.clone(),
        FaultPlan::custom(
            |r| match r.op == Op::Put && r.key.starts_with("manifests/") {
                true => Fault::Crash(CrashKind::Before),
                false => Fault::Pass,
            },
        ),
    ))
}

/// Runs a worker that ships what the store holds and dies before its restore point; returns
/// the durable position it published (what a sync node is told).
async fn ship_and_die(store: &Path, raw: &DynBucket, c: &Case) -> u64 {
    let mut w = worker(store, dies_before_a_manifest(raw), c.config.clone());
    let r = w.run_once().await;
    assert!(r.is_err(), "the run should die before its manifest: {r:?}");
    w.durable()
        .current()
        .position
        .map(|p| p.commit_seq)
        .unwrap_or(0)
}

fn restore_options(keys: &RestoreKeys, allow_partial: bool) -> RestoreOptions {
    RestoreOptions {
        keys: keys.clone(),
        allow_partial,
        ..RestoreOptions::default()
    }
}

async fn restore_to(raw: &DynBucket, out: &Path, keys: &RestoreKeys) -> restore::RestoreReport {
    let opts = restore_options(keys, false);
    restore::restore(raw.as_ref(), out, &opts).await.unwrap()
}

async fn restore_to_allowing(
    raw: &DynBucket,
    out: &Path,
    keys: &RestoreKeys,
) -> restore::RestoreReport {
    let opts = restore_options(keys, true);
    restore::restore(raw.as_ref(), out, &opts).await.unwrap()
}

/// A restore (partial ones not allowed) that must be refused for leaving data out: the
/// commit it would have reached and what it left out.
async fn refused_as_partial(
    raw: &DynBucket,
    target: &Path,
    keys: &RestoreKeys,
    label: &str,
) -> (u64, Vec<LeftOut>) {
    match restore::restore(raw.as_ref(), target, &restore_options(keys, false)).await {
        Err(restore::RestoreError::Partial {
            commit_seq,
            left_out,
        }) => (commit_seq, left_out),
        other => panic!("{label}: a restore leaving data out was not refused: {other:?}"),
    }
}

/// Finding 1, in every encoding: a restore, and the worker's resume, reach every commit the
/// worker counted durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_worker_counts_durable_is_restored_in_every_encoding() {
    for mode in modes() {
        let label = format!("{mode:?}");
        let (bed, first) = Bed::with_restore_point(mode, 40).await;
        assert_eq!(first, Some(40), "{label}");
        // Several small segments past the restore point, as a sync store ships them.
        let mut durable = 0;
        for round in 0..3 {
            bed.commits(7, 10 + round);
            durable = bed.ship_and_die().await;
        }
        assert_eq!(durable, 61, "{label}: the worker's durable position");

        let r = restore_to(&bed.raw, &bed.path("r"), &bed.c.keys).await;
        assert_eq!(
            r.commit_seq, durable,
            "{label}: restore reached {} of {durable} counted durable; warnings {:?}",
            r.commit_seq, r.warnings
        );
        assert!(r.left_out.is_empty(), "{label}: {:?}", r.left_out);
        assert_eq!(digest(&bed.path("r")), digest(&bed.store), "{label}");

        // The resume takes the shipped segments on (no segment shipped again) and its restore
        // point holds them.
        let counted = counting(&bed.raw);
        let again = bed
            .worker(counted.clone())
            .run_once()
            .await
            .unwrap_or_else(|e| panic!("{label}: the resumed run: {e}"));
        assert_eq!(again.restore_point, Some(durable), "{label}");
        let reshipped = wal_keys(&counted, &[Op::Put]);
        assert!(
            reshipped.is_empty(),
            "{label}: the resume shipped again {reshipped:?}"
        );
    }
}

/// `(offset in wal.bin, commits up to it)` of every frame end of `store`'s wal.bin.
fn frame_ends(store: &Path) -> (Vec<u8>, Vec<(u64, u64)>) {
    let wal = std::fs::read(store.join("wal.bin")).unwrap();
    let scan = scan_frames(&wal[WAL_HEADER_LEN..], 1);
    let ends = scan
        .frames
        .iter()
        .map(|f| ((WAL_HEADER_LEN + f.end) as u64, f.seq))
        .collect();
    (wal, ends)
}

/// The segments of generation 1 in the bucket, `(start, end)`, sorted.
async fn segments(raw: &DynBucket) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> =
        mushroom_backup::bucket::list_all(raw.as_ref(), "gen/0000000001/wal/")
            .await
            .unwrap()
            .into_iter()
            .filter_map(|o| mushroom_backup::manifest::parse_segment_key(1, &o.key))
            .collect();
    out.sort();
    out
}

fn segment_key(start: u64, end: u64) -> String {
    mushroom_backup::manifest::segment_key(1, start, end)
}

async fn plant(raw: &DynBucket, key: &str, bytes: Vec<u8>) {
    raw.put(key, Body::from(bytes), PutCondition::None)
        .await
        .unwrap();
}

/// Finding 2: a longer segment that ends where no other starts (valid frames of the store's
/// own WAL) no longer stops the restore, the resume, or a standby's promotion short of what
/// the worker shipped; the restore reports nothing left out (the dead end holds nothing the
/// chain taken does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_end_never_hides_the_chain_that_reaches_further() {
    let (bed, _) = Bed::with_restore_point(PLAIN, 10).await;
    bed.commits(10, 2);
    bed.ship_and_die().await;
    bed.commits(10, 3);
    let durable = bed.ship_and_die().await;
    assert_eq!(durable, 30);
    let segs = segments(&bed.raw).await;
    let (first, second) = (segs[segs.len() - 2], segs[segs.len() - 1]);
    assert_eq!(first.1, second.0, "{segs:?}");
    // A frame boundary inside the second segment: the dead end runs from the first's start
    // to it, longer than the first, and nothing starts where it ends.
    let (wal, ends) = frame_ends(&bed.store);
    let (cut, _) = *ends
        .iter()
        .find(|(end, _)| *end > second.0 + 10 && *end < second.1)
        .expect("a frame ending inside the second segment");
    plant(
        &bed.raw,
        &segment_key(first.0, cut),
        wal[first.0 as usize..cut as usize].to_vec(),
    )
    .await;

    let r = restore_to(&bed.raw, &bed.path("r"), &bed.c.keys).await;
    assert_eq!(r.commit_seq, durable, "warnings: {:?}", r.warnings);
    assert!(r.left_out.is_empty(), "{:?}", r.left_out);

    // The resume takes the same chain: its restore point holds every shipped commit.
    let again = bed.worker(bed.raw.clone()).run_once().await.unwrap();
    assert_eq!(again.restore_point, Some(durable));
}

/// Finding 5b and "restore never hides what it left out": an object past the chain's end
/// that no chain takes — a key claiming more than a writer ships (even empty), a segment
/// that does not decode — is left out with a reason rather than failing the plan; the
/// restore is refused before downloading (the CLI exits 3), naming each and why, unless
/// partial restores are allowed, when the report's `left_out` names each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_restore_leaves_out_is_named_and_fails_the_cli_unless_allowed() {
    let (bed, _) = Bed::with_restore_point(
        Mode {
            sealed: false,
            zstd: true,
            values: ValueKind::Text,
        },
        10,
    )
    .await;
    let (t, root, raw, c) = (&bed.t, &bed.root, &bed.raw, &bed.c);
    bed.commits(10, 2);
    let durable = bed.ship_and_die().await;
    let end = segments(raw).await.last().unwrap().1;
    let bomb = segment_key(end, end + (1 << 40));
    let garbage = segment_key(end, end + 100);
    plant(raw, &bomb, Vec::new()).await;
    plant(raw, &garbage, vec![7u8; 100]).await;

    // Refused before anything is downloaded, naming each object and why.
    let target = t.path().join("r");
    let (commit_seq, left_out) =
        refused_as_partial(raw, &target, &c.keys, &format!("{:?}", bed.mode)).await;
    assert_eq!(commit_seq, durable);
    let left: Vec<&str> = left_out.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(left, [garbage.as_str(), bomb.as_str()], "{left_out:?}");
    assert_eq!(left_out[0].kind, LeftOutKind::Rejected, "{left_out:?}");
    assert!(left_out[1].why.contains("a writer ships"), "{left_out:?}");
    assert!(!target.exists(), "a refused restore left its target");
    let r = restore_to_allowing(raw, &target, &c.keys).await;
    assert_eq!(r.commit_seq, durable);
    assert_eq!(r.left_out.len(), 2, "{:?}", r.left_out);

    let bin = env!("CARGO_BIN_EXE_mushroom-backup");
    let from = format!("file://{}", root.display());
    let run = |to: &str, extra: &[&str]| {
        Command::new(bin)
            .args(["restore", "--from", &from, "--to"])
            .arg(t.path().join(to))
            .args(["--json"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run("cli1", &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&bomb) && stderr.contains("--allow-partial"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["refused"], "partial", "{report}");
    assert_eq!(report["commit_seq"], durable);
    assert_eq!(report["left_out"].as_array().unwrap().len(), 2, "{report}");
    assert_eq!(report["left_out"][0]["key"], garbage.as_str());
    assert_eq!(report["left_out"][1]["kind"], "not_a_writers");
    assert!(!t.path().join("cli1").exists());
    let out = run("cli2", &["--allow-partial"]);
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["left_out"].as_array().unwrap().len(), 2, "{report}");
    // Nothing left out: exit 0 without the flag.
    std::fs::remove_file(root.join(&bomb)).unwrap();
    std::fs::remove_file(root.join(&garbage)).unwrap();
    let out = run("cli3", &[]);
    assert!(out.status.success(), "{out:?}");
}

/// In an encrypted generation a segment past the restore point must be sealed with the
/// generation's key: raw bytes of valid frames continuing the chain (what anyone able to write
/// to the bucket, without the key, can make) are left out as rejected, the restore refused
/// unless partial restores are allowed, and the resume and a standby never take them. On
/// `a70f3b3` the restore took the planted commits (it reached 25 of 20 shipped) and the
/// replaced sealed segment was taken raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_generation_takes_no_segment_that_is_not_sealed() {
    for zstd in [false, true] {
        let label = if zstd { "zstd" } else { "raw" };
        let mode = Mode {
            sealed: true,
            zstd,
            values: ValueKind::Random,
        };
        let (bed, _) = Bed::with_restore_point(mode, 10).await;
        let (raw, c) = (&bed.raw, &bed.c);
        bed.commits(10, 2);
        let durable = bed.ship_and_die().await;
        assert_eq!(durable, 20, "{label}");
        let end = segments(raw).await.last().unwrap().1;
        // Five commits more, never shipped: their frames, raw, planted past the chain's end.
        bed.commits(5, 3);
        let (wal, ends) = frame_ends(&bed.store);
        let (planted_end, seq) = *ends.last().unwrap();
        assert_eq!(seq, 25, "{label}");
        let planted = segment_key(end, planted_end);
        plant(
            raw,
            &planted,
            wal[end as usize..planted_end as usize].to_vec(),
        )
        .await;

        let target = bed.path("r");
        let (commit_seq, left_out) = refused_as_partial(raw, &target, &c.keys, label).await;
        assert_eq!(commit_seq, durable, "{label}");
        assert_eq!(left_out.len(), 1, "{label}: {left_out:?}");
        assert_eq!(left_out[0].key, planted, "{label}");
        assert_eq!(left_out[0].kind, LeftOutKind::Rejected, "{label}");
        assert!(
            left_out[0].why.contains("not sealed"),
            "{label}: {left_out:?}"
        );
        let r = restore_to_allowing(raw, &target, &c.keys).await;
        assert_eq!(r.commit_seq, durable, "{label}: {:?}", r.left_out);

        // A shipped segment replaced by its own plain bytes is no longer taken either.
        let (s0, e0) = *segments(raw).await.iter().find(|(_, e)| *e == end).unwrap();
        raw.delete(&planted, None).await.unwrap();
        plant(
            raw,
            &segment_key(s0, e0),
            wal[s0 as usize..e0 as usize].to_vec(),
        )
        .await;
        let r = restore_to_allowing(raw, &bed.path("r2"), &c.keys).await;
        assert!(r.commit_seq < durable, "{label}: {}", r.commit_seq);
        assert_eq!(r.left_out.len(), 1, "{label}: {:?}", r.left_out);
        assert_eq!(r.left_out[0].key, segment_key(s0, e0), "{label}");
    }
}

/// A promotion never claims LATEST short of a segment a writer could have shipped (a damaged
/// one continuing the chain: it may hold acknowledged commits), naming it; an object no
/// writer makes (a key claiming more than a writer ships) does not stop a failover. In an
/// encrypted, incompressible store the catch-up reaches every commit the worker counted
/// durable (finding 1 through the standby).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_reaches_what_was_durable_and_refuses_to_cut_a_writers_segment() {
    use mushroom_backup::standby::{StandbyError, StandbyOptions, promote};
    let (bed, _) = Bed::with_restore_point(
        Mode {
            sealed: true,
            zstd: true,
            values: ValueKind::Random,
        },
        20,
    )
    .await;
    let (t, root, raw, c) = (&bed.t, &bed.root, &bed.raw, &bed.c);
    bed.commits(9, 2);
    let durable = bed.ship_and_die().await;
    assert_eq!(durable, 29);
    let end = segments(raw).await.last().unwrap().1;
    let damaged = segment_key(end, end + 300);
    plant(raw, &damaged, vec![1u8; 300]).await;
    plant(raw, &segment_key(end, end + (1 << 40)), Vec::new()).await;
    let opts = StandbyOptions {
        keys: c.keys.clone(),
        ..StandbyOptions::default()
    };
    let dir = t.path().join("standby");
    match promote::promote(raw.as_ref(), &dir, &opts).await {
        Err(StandbyError::LeftOut {
            commit_seq,
            left_out,
            ..
        }) => {
            assert_eq!(commit_seq, durable);
            let keys: Vec<&str> = left_out.iter().map(|l| l.key.as_str()).collect();
            assert_eq!(keys, [damaged.as_str()], "{left_out:?}");
        }
        other => panic!("the promotion was not refused: {other:?}"),
    }
    let latest = std::fs::read_to_string(root.join("LATEST")).unwrap();
    assert!(
        !latest.contains("adopted_by"),
        "LATEST was claimed: {latest}"
    );
    // Without the damaged segment, the bomb alone does not stop it.
    std::fs::remove_file(root.join(&damaged)).unwrap();
    let adopted = promote::promote(raw.as_ref(), &dir, &opts).await.unwrap();
    assert_eq!(adopted.applied.commit_seq, durable);
}

/// Finding 7: a restart takes back the segments its worker shipped since the newest restore
/// point from one listing and the shipped-segment journal (`backup.shipped`), reading none of
/// them again, in every encoding; a segment the journal does not vouch for (planted, or
/// replaced since: another ETag) is still read and checked, and one that does not match is
/// routed around; a journal that is garbage costs GETs, never correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_none_of_its_own_segments_again_and_still_checks_the_rest() {
    for mode in modes() {
        let label = format!("{mode:?}");
        let (bed, _) = Bed::with_restore_point(mode, 10).await;
        for round in 0..6 {
            bed.commits(3, 10 + round);
            bed.ship_and_die().await;
        }
        let durable = 28;
        // A resume: every segment past the restore point from the journal, no GET.
        let counted = counting(&bed.raw);
        let r = bed.worker(counted.clone()).run_once().await.unwrap();
        assert_eq!(r.restore_point, Some(durable), "{label}");
        assert_eq!(
            wal_keys(&counted, &[Op::Get, Op::GetRange]).len(),
            0,
            "{label}: {:?}",
            counted.log()
        );
        let journal = std::fs::read(bed.store.join("backup.shipped")).unwrap();
        assert!(
            journal.is_empty(),
            "{label}: the journal is emptied at a restore point"
        );
    }

    // A replaced segment (same key and length, other bytes: another ETag) is read and
    // checked, not trusted from its journal line: it no longer matches the store, and the
    // resume stops before it, as a restore does.
    let (bed, _) = Bed::with_restore_point(PLAIN, 10).await;
    let (store, root, raw, c) = (&bed.store, &bed.root, &bed.raw, &bed.c);
    for round in 0..3 {
        bed.commits(5, 10 + round);
        bed.ship_and_die().await;
    }
    let segs = segments(raw).await;
    let n = segs.len();
    let (a, b, last) = (segs[n - 3], segs[n - 2], segs[n - 1]);
    let (wal, _) = frame_ends(store);
    let mut other = wal[last.0 as usize..last.1 as usize].to_vec();
    other[20] ^= 0xff;
    std::fs::remove_file(root.join(segment_key(last.0, last.1))).unwrap();
    plant(raw, &segment_key(last.0, last.1), other).await;
    let counted = counting(raw);
    // It then ships that range again under the same key: refused (the object there has other
    // bytes), as another writer's would be.
    let r = bed.worker(counted.clone()).run_once().await;
    assert!(r.is_err(), "{r:?}");
    let gets = wal_keys(&counted, &[Op::Get]);
    assert!(
        gets.first() == Some(&segment_key(last.0, last.1)),
        "the replaced segment was trusted, or the others read: {gets:?}"
    );
    let restored = restore_to_allowing(raw, &bed.path("r"), &c.keys).await;
    assert_eq!(restored.commit_seq, 20, "{:?}", restored.warnings);

    // A garbage journal: every segment read and checked.
    std::fs::write(store.join("backup.shipped"), b"{\"not\": 1}\tzz\n\xff\xfe").unwrap();
    let counted = counting(raw);
    let _ = bed.worker(counted.clone()).run_once().await;
    let gets = wal_keys(&counted, &[Op::Get]);
    for k in [segment_key(a.0, a.1), segment_key(b.0, b.1)] {
        assert!(
            gets.contains(&k),
            "{k} not read with a garbage journal: {gets:?}"
        );
    }
}

/// Finding 7, the other half: a restart lists every segment past the newest restore point (a
/// LIST page per thousand) before it ships anything, so the backlog is bounded by a count,
/// not only by the restore-point interval. With an interval of an hour, the step after the
/// thousandth segment past the restore point writes one; before, none came for the hour (a
/// first acknowledgement 2.45 s after a restart past 60 s of load on moto).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_point_falls_due_after_a_thousand_segments_whatever_the_interval() {
    use mushroom_backup::worker::MAX_BACKLOG_SEGMENTS;
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let raw = fs_bucket(&root);
    let mut c = config();
    c.restore_point_interval = std::time::Duration::from_secs(3600);
    c.wal_interval = std::time::Duration::from_millis(1);
    commits(&store, 1, ValueKind::Random, 1);
    let mut w = worker(&store, raw.clone(), c);
    let manifests =
        |root: &Path| std::fs::read_dir(root.join("manifests")).map_or(0, |d| d.count());
    // The generation's first restore point: due at once.
    for _ in 0..10 {
        w.step().await.unwrap();
        if manifests(&root) == 1 {
            break;
        }
    }
    assert_eq!(manifests(&root), 1);
    let mut shipped = 0;
    for round in 0..(MAX_BACKLOG_SEGMENTS as u64 + 5) {
        commits(&store, 1, ValueKind::Random, 100 + round);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        w.step().await.unwrap();
        // Nothing more to ship: a restore point, if one is due (the runner's tick after a
        // segment does the same).
        w.step().await.unwrap();
        shipped = w.durable().current().position.map_or(0, |p| p.commit_seq);
        if manifests(&root) > 1 {
            break;
        }
    }
    assert_eq!(
        manifests(&root),
        2,
        "no restore point after {shipped} commits shipped in segments of one"
    );
    assert!(
        shipped >= MAX_BACKLOG_SEGMENTS as u64,
        "a restore point came early, at {shipped}"
    );
}
