//! An idle store costs no look at its directory, yet a write is seen by the very next step:
//! the worker's quiet shortcut (`DirWatch` stamps, `src/worker/mod.rs`) never hides one.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use mushroom_backup::store::watch;
use mushroom_backup::worker::{BackupWorker, StepOutcome};

mod support;
use support::store;

/// A store of `commits` commits and its worker, with everything shipped and a restore point.
async fn backed_up(commits: u64) -> (tempfile::TempDir, PathBuf, BackupWorker) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    store::write(&dir, commits, 0, 0);
    let mut w = store::worker(
        &dir,
        store::fs_bucket(&tmp.path().join("b")),
        store::config(),
    );
    w.run_once().await.unwrap();
    (tmp, dir, w)
}

#[tokio::test]
async fn an_idle_store_is_not_looked_at_and_every_write_is_shipped_by_the_next_step() {
    let (_tmp, dir, mut w) = backed_up(200).await;
    let counters = w.counters();

    let looks = counters.looks.load(Relaxed);
    for _ in 0..200 {
        assert_eq!(w.step().await.unwrap(), StepOutcome::Idle);
    }
    assert_eq!(
        counters.looks.load(Relaxed),
        looks,
        "idle steps looked at the directory"
    );

    // Appends, snapshots and rotations, each followed at once (no sleep) by a step.
    let mut written = 200;
    for round in 0..40u64 {
        let (commits, snapshot_every, rotate) = match round % 4 {
            0 => (7, 0, 0),
            1 => (25, 20, 0),
            2 => (30, 0, 2048),
            _ => (1, 0, 0),
        };
        store::write(&dir, commits, snapshot_every, rotate);
        written += commits;
        let first = w.step().await.unwrap();
        assert!(
            matches!(
                first,
                StepOutcome::Shipped { .. } | StepOutcome::NewGeneration { .. }
            ),
            "round {round}: the step after a write did {first:?}"
        );
        loop {
            match w.step().await.unwrap() {
                StepOutcome::Idle => break,
                StepOutcome::Deferred(why) => panic!("round {round}: deferred ({why})"),
                _ => {}
            }
        }
        assert_eq!(counters.shipped_commit_seq.load(Relaxed), written);
        assert_eq!(counters.restore_point_commit_seq.load(Relaxed), written);
    }
    assert_eq!(store::digest(&dir).commit_seq, written);
}

#[tokio::test(start_paused = true)]
async fn an_idle_store_is_looked_at_again_after_the_watch_trust_runs_out() {
    let (_tmp, dir, mut w) = backed_up(50).await;
    let counters = w.counters();
    let looks = counters.looks.load(Relaxed);
    assert_eq!(w.step().await.unwrap(), StepOutcome::Idle);
    assert_eq!(counters.looks.load(Relaxed), looks);
    // The store is on this machine's disk: the local bound (checked in tests/dir_watch.rs).
    tokio::time::advance(watch::trust_for(&dir)).await;
    assert_eq!(w.step().await.unwrap(), StepOutcome::Idle);
    assert_eq!(
        counters.looks.load(Relaxed),
        looks + 1,
        "trust ran out: a look"
    );
    assert_eq!(w.step().await.unwrap(), StepOutcome::Idle);
    assert_eq!(counters.looks.load(Relaxed), looks + 1, "and quiet again");
}
