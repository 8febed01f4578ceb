//! Crash consistency (DESIGN.md section 9): a full backup sequence — several generations,
//! rotations, snapshots and retention — is crashed at request N for every N, both before the
//! request takes effect and after. After each crash every manifest verifies, LATEST names one
//! of them, a restore holds a prefix of what was written and never less than the last restore
//! point acknowledged nor the highest durable position the worker published (what a node in
//! `durability = sync` is told), and a rerun completes the sequence. Faults where the request took
//! effect but its answer was lost are survived through the retry layer without an error.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mushroom_backup::bucket::faults::{CrashKind, FaultPlan, FaultyBucket, SeededFaults};
use mushroom_backup::bucket::retry::{RetryPolicy, Retrying};
use mushroom_backup::bucket::{BucketError, DynBucket};
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::store::engine::{digest_map, expected_map};
use mushroom_backup::verify::{self, VerifyOptions};
use mushroom_backup::worker::{WorkerConfig, WorkerError};
use support::store::{config, digest, fs_bucket, worker, write};

/// One phase: commits appended to the store, then a backup run.
struct Phase {
    commits: u64,
    snapshot_every: u64,
    rotate_bytes: u64,
}

const PHASES: &[Phase] = &[
    Phase {
        commits: 150,
        snapshot_every: 0,
        rotate_bytes: 3 << 10,
    },
    Phase {
        commits: 120,
        snapshot_every: 200,
        rotate_bytes: 3 << 10,
    },
    Phase {
        commits: 90,
        snapshot_every: 0,
        rotate_bytes: 0,
    },
    Phase {
        commits: 140,
        snapshot_every: 100,
        rotate_bytes: 4 << 10,
    },
];

/// Aggressive retention, so that every run deletes something.
fn crash_config() -> WorkerConfig {
    let mut c = config();
    c.retention.keep_for = Duration::ZERO;
    c.retention.keep_generations = 1;
    c.retention.orphan_grace = Duration::ZERO;
    c
}

/// Runs the phases from `from`, backing up through `bucket` after each. Returns the phase
/// that failed (and why) or `None`, updating `acked` with every restore point acknowledged and
/// with every durable position the worker published (what `durability = sync` acknowledges to
/// a node, `worker/ack/mod.rs`), crash or not: a restore must reach both.
async fn run_phases(
    store: &Path,
    bucket: &DynBucket,
    from: usize,
    acked: &mut u64,
) -> Option<(usize, WorkerError)> {
    for (i, p) in PHASES.iter().enumerate().skip(from) {
        write(store, p.commits, p.snapshot_every, p.rotate_bytes);
        let mut w = worker(store, bucket.clone(), crash_config());
        let result = w.run_once().await;
        // The position only rises within a chain, and nothing here breaks it: the newest is
        // the highest this worker told anyone.
        if let Some(pos) = w.durable().current().position {
            *acked = pos.commit_seq.max(*acked);
        }
        match result {
            Ok(r) => *acked = r.restore_point.unwrap_or(*acked).max(*acked),
            Err(e) => return Some((i, e)),
        }
    }
    None
}

/// The checks after a crash, on the bucket as the crash left it.
async fn check_bucket_after_crash(raw: &DynBucket, scratch: &Path, acked: u64, label: &str) {
    let v = verify::verify(raw.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(
        v.ok,
        "{label}: the bucket does not verify after the crash:\n{v}"
    );
    if v.manifests.is_empty() {
        assert_eq!(acked, 0, "{label}: an acknowledged restore point vanished");
        return;
    }
    let out = scratch.join("restored");
    let r = restore::restore(raw.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{label}: restore after the crash: {e}"));
    assert!(
        r.commit_seq >= acked,
        "{label}: restored {} < acknowledged {acked}",
        r.commit_seq
    );
    let d = digest(&out);
    assert_eq!(d.commit_seq, r.commit_seq);
    assert_eq!(
        d.digest,
        digest_map(&expected_map(1, 64, d.commit_seq)),
        "{label}: the restore is not a prefix of what was written"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

async fn crash_once(n: u64, kind: CrashKind) -> bool {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let raw = fs_bucket(&root);
    let faulty = Arc::new(FaultyBucket::new(raw.clone(), FaultPlan::crash_at(n, kind)));
    let bucket: DynBucket = faulty.clone();
    let mut acked = 0;
    let label = format!("crash {kind:?} request {n}");
    let Some((phase, e)) = run_phases(&store, &bucket, 0, &mut acked).await else {
        assert!(
            !faulty.has_crashed(),
            "{label}: crashed but the run succeeded"
        );
        return false;
    };
    assert!(
        matches!(e, WorkerError::Bucket(BucketError::Crashed { .. })),
        "{label}: the run failed with {e:?}, not the crash; log: {:?}",
        faulty.log().last()
    );
    check_bucket_after_crash(&raw, t.path(), acked, &label).await;
    // A rerun (a new process, no faults) completes this phase and the rest.
    let r = worker(&store, raw.clone(), crash_config())
        .run_once()
        .await
        .unwrap_or_else(|e| panic!("{label}: the rerun failed: {e}"));
    acked = r.restore_point.unwrap_or(acked).max(acked);
    assert!(
        run_phases(&store, &raw, phase + 1, &mut acked)
            .await
            .is_none(),
        "{label}: a later phase failed"
    );
    let out = t.path().join("final");
    let r = restore::restore(raw.as_ref(), &out, &RestoreOptions::default())
        .await
        .unwrap();
    assert_eq!(
        digest(&out),
        digest(&store),
        "{label}: the final restore differs from the store"
    );
    assert_eq!(r.commit_seq, PHASES.iter().map(|p| p.commits).sum::<u64>());
    let v = verify::verify(raw.as_ref(), &VerifyOptions::default())
        .await
        .unwrap();
    assert!(v.ok, "{label}: final verify:\n{v}");
    true
}

async fn requests_of_a_clean_sequence() -> u64 {
    let t = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyBucket::new(
        fs_bucket(&t.path().join("b")),
        FaultPlan::none(),
    ));
    let bucket: DynBucket = faulty.clone();
    let mut acked = 0;
    assert!(
        run_phases(&t.path().join("s"), &bucket, 0, &mut acked)
            .await
            .is_none()
    );
    assert_eq!(acked, PHASES.iter().map(|p| p.commits).sum::<u64>());
    faulty.requests()
}

async fn crash_at_every_request(kind: CrashKind) {
    let total = requests_of_a_clean_sequence().await;
    assert!(
        total > 40,
        "the sequence is too short to mean anything: {total} requests"
    );
    eprintln!("crashing {kind:?} each of {total} requests");
    let mut crashed = 0;
    // Four crash runs at a time; each has its own directories.
    let mut n = 1;
    while n <= total + 1 {
        let batch: Vec<_> = (n..(n + 4).min(total + 2))
            .map(|i| tokio::spawn(crash_once(i, kind)))
            .collect();
        for h in batch {
            if h.await.expect("a crash run panicked") {
                crashed += 1;
            }
        }
        n += 4;
    }
    assert_eq!(
        crashed, total,
        "every request of the sequence should have been crashed at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_before_every_request() {
    crash_at_every_request(CrashKind::Before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_every_request() {
    crash_at_every_request(CrashKind::After).await;
}

#[tokio::test]
async fn lost_answers_are_survived_without_error() {
    for seed in [1u64, 2, 3, 4, 5] {
        let t = tempfile::tempdir().unwrap();
        let (store, root) = (t.path().join("s"), t.path().join("b"));
        let raw = fs_bucket(&root);
        let faults = SeededFaults {
            fail: 0.1,
            lose_answer: 0.2,
            conflict: 0.05,
            ..SeededFaults::default()
        };
        let faulty: DynBucket = Arc::new(FaultyBucket::new(
            raw.clone(),
            FaultPlan::seeded(seed, faults),
        ));
        let policy = RetryPolicy {
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_attempts: 30,
        };
        let bucket: DynBucket = Arc::new(Retrying::new(faulty, policy, Default::default()));
        let mut acked = 0;
        if let Some((phase, e)) = run_phases(&store, &bucket, 0, &mut acked).await {
            panic!("seed {seed}: phase {phase} failed under lost answers: {e}");
        }
        let out = t.path().join("r");
        restore::restore(raw.as_ref(), &out, &RestoreOptions::default())
            .await
            .unwrap();
        assert_eq!(digest(&out), digest(&store), "seed {seed}");
        let v = verify::verify(raw.as_ref(), &VerifyOptions::default())
            .await
            .unwrap();
        assert!(v.ok, "seed {seed}: {v}");
    }
}
