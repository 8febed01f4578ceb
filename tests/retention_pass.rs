//! The retention pass from outside a worker (`worker::retention_pass`, what `retention --from
//! URL` runs under the bucket lease), crashed at every write: before and after the write
//! lands. After each crash every remaining restore point verifies (it names nothing deleted)
//! and LATEST's is among them; a re-run finishes the work, leaving exactly the objects a pass
//! without faults leaves. And the pass deletes something real: old generations' manifests,
//! objects, claims.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;

use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::faults::{CrashKind, FaultPlan, FaultyBucket};
use mushroom_backup::verify::{self, VerifyOptions};
use mushroom_backup::worker::RetentionPolicy;
use mushroom_backup::worker::retention_pass::pass;
use support::store::{config, copy_dir, fs_bucket, worker, write};

async fn keys(b: &DynBucket) -> BTreeSet<String> {
    support::store::keys_under(b, "").await
}

async fn verifies(b: &DynBucket, context: &str) {
    let report = verify::verify(b.as_ref(), &VerifyOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{context}: verify: {e}"));
    assert!(report.ok, "{context}: {report:?}");
    assert!(
        !report.manifests.is_empty(),
        "{context}: no restore point left"
    );
}

fn policy() -> RetentionPolicy {
    support::store::newest_generation_only()
}

#[tokio::test]
async fn a_pass_crashed_at_every_write_leaves_every_restore_point_whole_and_a_rerun_finishes() {
    let t = tempfile::tempdir().unwrap();
    let (store, pristine) = (t.path().join("s"), t.path().join("pristine"));
    // Four generations (a snapshot every 150 commits), a restore point each.
    for _ in 0..4 {
        write(&store, 200, 150, 0);
        worker(&store, fs_bucket(&pristine), config())
            .run_once()
            .await
            .unwrap();
    }
    let before = keys(&fs_bucket(&pristine)).await;

    let copy = |name: &str| -> DynBucket {
        let dir = t.path().join(name);
        copy_dir(&pristine, &dir);
        fs_bucket(&dir)
    };
    let expected = {
        let b = copy("expected");
        let report = pass(&b, &policy()).await.unwrap();
        assert_eq!(report.lineages, 1);
        assert!(report.deleted > 0, "the pass deleted nothing");
        verifies(&b, "a pass without faults").await;
        let again = pass(&b, &policy()).await.unwrap();
        assert_eq!(again.deleted, 0, "a second pass found more to delete");
        keys(&b).await
    };
    assert!(expected.len() < before.len());
    assert!(
        before.iter().any(|k| k.starts_with("manifests/")) && expected.is_subset(&before),
        "a pass wrote something"
    );

    for kind in [CrashKind::Before, CrashKind::After] {
        let mut k = 1;
        loop {
            let name = format!("crash-{kind:?}-{k}");
            let inner = copy(&name);
            let faulty = Arc::new(FaultyBucket::new(
                inner.clone(),
                FaultPlan::crash_at(k, kind).writes_only(),
            ));
            let as_dyn: DynBucket = faulty.clone();
            let result = pass(&as_dyn, &policy()).await;
            let context = format!("crash {kind:?} at write {k}");
            if !faulty.has_crashed() {
                result.unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!(keys(&inner).await, expected, "{context}");
                assert!(k > 5, "the pass made only {} writes", k - 1);
                break;
            }
            assert!(
                result.is_err(),
                "{context}: a crashed pass reported success"
            );
            verifies(&inner, &context).await;
            pass(&inner, &policy())
                .await
                .unwrap_or_else(|e| panic!("{context}: the re-run: {e}"));
            assert_eq!(keys(&inner).await, expected, "{context}: after the re-run");
            std::fs::remove_dir_all(t.path().join(&name)).unwrap();
            k += 1;
        }
    }
}
