//! `branch` and `branch delete` crashed at every request, before it reaches the bucket and
//! after it lands (as `tests/crash.rs` does for backups): each crash leaves either no branch or
//! a complete one (it restores to the parent's state at its fork), never a pin that holds
//! forever without a branch behind it (the parent's next retention past the grace reclaims it),
//! and running the command again finishes.

mod support;

use std::path::Path;
use std::sync::Arc;

use mushroom_backup::branch::{self, BranchError, ForkAt};
use mushroom_backup::bucket::faults::{CrashKind, FaultPlan, FaultyBucket};
use mushroom_backup::bucket::{self, BucketError, DynBucket};
use mushroom_backup::manifest;
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::worker::retention_pass::pass;
use support::store::{copy_dir, digest, fs_bucket};

use support::store::{file_url as url, newest_generation_only as aggressive};

async fn pins(b: &DynBucket) -> Vec<String> {
    support::store::keys_under(b, manifest::PINS_PREFIX)
        .await
        .into_iter()
        .collect()
}

/// The digest a restore of `from` gives, or `None` when it holds no restore point.
async fn restored(from: &Path, into: &Path) -> Option<String> {
    let b = fs_bucket(from);
    let has_manifest = !bucket::list_all(b.as_ref(), manifest::MANIFESTS_PREFIX)
        .await
        .unwrap()
        .is_empty();
    if !has_manifest {
        return None;
    }
    restore::restore(b.as_ref(), into, &RestoreOptions::default())
        .await
        .unwrap_or_else(|e| panic!("restore of {}: {e}", from.display()));
    Some(digest(into).digest.to_string())
}

fn crashed<T: std::fmt::Debug>(r: Result<T, BranchError>) -> bool {
    match r {
        Ok(_) => false,
        Err(BranchError::Bucket(BucketError::Crashed { .. })) => true,
        Err(BranchError::Restore(restore::RestoreError::Bucket(BucketError::Crashed {
            ..
        }))) => true,
        Err(e) => panic!("failed otherwise than by the crash: {e}"),
    }
}

#[tokio::test]
async fn a_branch_crashed_at_every_request_is_none_or_whole_and_its_pin_never_holds_forever() {
    let t = tempfile::tempdir().unwrap();
    let (store, pristine) = (t.path().join("s"), t.path().join("pristine"));
    support::store::generations(&store, &pristine, 2).await;
    let fork = 390;
    let expected = {
        let into = t.path().join("expected");
        let opts = RestoreOptions {
            at: Some(fork),
            ..RestoreOptions::default()
        };
        restore::restore(fs_bucket(&pristine).as_ref(), &into, &opts)
            .await
            .unwrap();
        digest(&into).digest.to_string()
    };
    let mut points = 0;
    for n in 1.. {
        let mut finished = 0;
        for kind in [CrashKind::Before, CrashKind::After] {
            let run = t.path().join(format!("run-{n}-{kind:?}"));
            let (p, b) = (run.join("parent"), run.join("branch"));
            copy_dir(&pristine, &p);
            let faulty: DynBucket = Arc::new(FaultyBucket::new(
                fs_bucket(&p),
                FaultPlan::crash_at(n, kind),
            ));
            let result = branch::create(
                faulty,
                &url(&p),
                &url(&b),
                ForkAt::Commit(fork),
                &RestoreOptions::default(),
                None,
            )
            .await;
            if !crashed(result) {
                finished += 1;
                continue;
            }
            points += 1;
            let context = format!("crashed {kind:?} request {n}");
            // None or whole.
            let got = restored(&b, &run.join("restored")).await;
            if let Some(d) = &got {
                assert_eq!(d, &expected, "{context}: a branch that restores otherwise");
            }
            // The parent's retention past the grace: a pin without its branch goes, a pin with
            // one stays and the branch still restores.
            let parent = fs_bucket(&p);
            pass(&parent, &aggressive()).await.unwrap();
            let left = pins(&parent).await;
            match got {
                None => assert!(
                    left.is_empty(),
                    "{context}: a pin without a branch held: {left:?}"
                ),
                Some(_) => {
                    assert_eq!(left.len(), 1, "{context}: {left:?}");
                    let again = restored(&b, &run.join("after-retention")).await;
                    assert_eq!(
                        again.as_ref(),
                        Some(&expected),
                        "{context}: after retention"
                    );
                    // A store adopted from it backs up into it (LATEST may never have been
                    // written).
                    let adopted = run.join("adopted");
                    let opts = RestoreOptions {
                        adopt: true,
                        ..RestoreOptions::default()
                    };
                    restore::restore(fs_bucket(&b).as_ref(), &adopted, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("{context}: adopt: {e}"));
                    support::store::write(&adopted, 10, 0, 0);
                    support::store::worker(&adopted, fs_bucket(&b), support::store::config())
                        .run_once()
                        .await
                        .unwrap_or_else(|e| panic!("{context}: a backup into the branch: {e}"));
                }
            }
            // And a branch can be cut again, into a fresh prefix.
            let report = branch::create(
                fs_bucket(&p),
                &url(&p),
                &url(&run.join("again")),
                ForkAt::Commit(fork),
                &RestoreOptions::default(),
                None,
            )
            .await
            .unwrap_or_else(|e| panic!("{context}: the branch again: {e}"));
            assert_eq!(report.commit_seq, fork);
        }
        if finished == 2 {
            break;
        }
    }
    assert!(points >= 10, "only {points} crash points");
}

#[tokio::test]
async fn a_branch_delete_crashed_at_every_request_finishes_when_run_again() {
    let t = tempfile::tempdir().unwrap();
    let (store, pristine) = (t.path().join("s"), t.path().join("b/pristine"));
    support::store::generations(&store, &pristine, 2).await;
    let mut points = 0;
    for n in 1.. {
        let mut finished = 0;
        for kind in [CrashKind::Before, CrashKind::After] {
            let run = t.path().join(format!("run-{n}-{kind:?}"));
            let (p, b) = (run.join("parent"), run.join("branch"));
            copy_dir(&pristine, &p);
            branch::create(
                fs_bucket(&p),
                &url(&p),
                &url(&b),
                ForkAt::Commit(390),
                &RestoreOptions::default(),
                None,
            )
            .await
            .unwrap();
            let faulty: DynBucket = Arc::new(FaultyBucket::new(
                fs_bucket(&b),
                FaultPlan::crash_at(n, kind),
            ));
            if !crashed(branch::delete::delete(faulty, &url(&b), None).await) {
                finished += 1;
                continue;
            }
            points += 1;
            let context = format!("delete crashed {kind:?} request {n}");
            match branch::delete::delete(fs_bucket(&b), &url(&b), None).await {
                Ok(_) | Err(BranchError::NotABranch { .. }) => {}
                Err(e) => panic!("{context}: run again: {e}"),
            }
            let parent = fs_bucket(&p);
            pass(&parent, &aggressive()).await.unwrap();
            assert!(pins(&parent).await.is_empty(), "{context}: a pin stayed");
            let manifests = bucket::list_all(fs_bucket(&b).as_ref(), manifest::MANIFESTS_PREFIX)
                .await
                .unwrap();
            assert!(manifests.is_empty(), "{context}: the fork manifest stayed");
        }
        if finished == 2 {
            break;
        }
    }
    assert!(points >= 4, "only {points} crash points");
}
