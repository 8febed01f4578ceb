//! Focused tests of the bucket wrappers: fault plans (replayable seeds, crashes before and
//! after a request, write-only targeting) and the retry layer (what it never retries, how it
//! reads its own lost writes, cancellation under paused time), and that every wrapper forwards
//! the trait's defaulted methods (`get_buffers`) instead of falling back to the default.

mod support;

use std::sync::Arc;
use std::time::Duration;

use mushroom_backup::bucket::faults::{
    CrashKind, Fault, FaultPlan, FaultyBucket, LogEntry, Op, SeededFaults,
};
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::retry::{RetryPolicy, Retrying};
use mushroom_backup::bucket::{Bucket, BucketError, DynBucket, Part, PutCondition};
use support::{body, fast_retries, fs_bucket, is_precondition_failed};
use tokio_util::sync::CancellationToken;

/// A fixed sequential workload: same plan and workload, same log.
async fn seeded_log(seed: u64) -> Vec<LogEntry> {
    let (_dir, fs) = fs_bucket();
    let faults = SeededFaults {
        fail: 0.2,
        lose_answer: 0.2,
        delay: 0.2,
        max_delay: Duration::from_millis(3),
        conflict: 0.2,
    };
    let b = FaultyBucket::new(fs, FaultPlan::seeded(seed, faults));
    for i in 0..60 {
        let key = format!("k{}", i % 7);
        let _ = b
            .put(&key, body(format!("{i}")), PutCondition::IfNoneMatch)
            .await;
        let _ = b.head(&key).await;
        if i % 5 == 0 {
            let _ = b.delete(&key, None).await;
        }
    }
    b.log()
}

#[tokio::test]
async fn seeded_faults_replay_from_the_seed() {
    let (a, again, other) = (
        seeded_log(42).await,
        seeded_log(42).await,
        seeded_log(43).await,
    );
    assert_eq!(a, again, "same seed, different faults");
    assert_ne!(a, other, "different seeds, same faults");
    for f in [Fault::Fail, Fault::LoseAnswer, Fault::Conflict] {
        assert!(a.iter().any(|e| e.fault == f), "no {f:?} injected");
    }
    assert!(a.iter().any(|e| matches!(e.fault, Fault::Delay(_))));
    let conflicts_on_reads = a
        .iter()
        .any(|e| e.fault == Fault::Conflict && e.op == Op::Head);
    assert!(!conflicts_on_reads, "conflicts are for conditional writes");
}

#[tokio::test]
async fn crash_before_and_after() {
    for kind in [CrashKind::Before, CrashKind::After] {
        let (_dir, fs) = fs_bucket();
        let b = FaultyBucket::new(fs.clone(), FaultPlan::crash_at(2, kind));
        b.put("a", body("a"), PutCondition::None).await.unwrap();
        let r = b.put("b", body("b"), PutCondition::None).await;
        assert!(
            matches!(r, Err(BucketError::Crashed { request: 2 })),
            "{r:?}"
        );
        assert!(b.has_crashed());
        let r = b.head("a").await;
        assert!(
            matches!(r, Err(BucketError::Crashed { request: 2 })),
            "{r:?}"
        );
        let r = b.put("c", body("c"), PutCondition::None).await;
        assert!(matches!(r, Err(BucketError::Crashed { .. })), "{r:?}");
        assert_eq!(b.requests(), 4);
        assert!(fs.head("a").await.unwrap().is_some());
        assert_eq!(
            fs.head("b").await.unwrap().is_some(),
            kind == CrashKind::After,
            "{kind:?}"
        );
        assert!(
            fs.head("c").await.unwrap().is_none(),
            "a request after the crash happened"
        );
    }
}

#[tokio::test]
async fn crash_at_a_write_counts_only_writes() {
    let (_dir, fs) = fs_bucket();
    let b = FaultyBucket::new(
        fs.clone(),
        FaultPlan::crash_at(2, CrashKind::After).writes_only(),
    );
    for key in ["w1", "w2"] {
        assert!(b.head(key).await.unwrap().is_none());
        let _ = b.put(key, body(key), PutCondition::IfNoneMatch).await;
    }
    assert!(b.has_crashed());
    assert_eq!((b.requests(), b.writes()), (4, 2));
    assert!(
        fs.head("w2").await.unwrap().is_some(),
        "crash After: the write happened"
    );
    let crashed: Vec<u64> = b
        .log()
        .iter()
        .filter(|e| matches!(e.fault, Fault::Crash(_)))
        .map(|e| e.request)
        .collect();
    assert_eq!(crashed, [4]);
}

/// A retry layer over a fault wrapper whose plan is `f` (of the request number), over fs.
fn retrying(
    f: impl Fn(u64) -> Fault + Send + Sync + 'static,
) -> (tempfile::TempDir, Arc<FaultyBucket>, Retrying) {
    let (dir, fs) = fs_bucket();
    let faulty = Arc::new(FaultyBucket::new(
        fs,
        FaultPlan::custom(move |r| f(r.number)),
    ));
    let r = Retrying::new(faulty.clone(), fast_retries(), CancellationToken::new());
    (dir, faulty, r)
}

#[tokio::test]
async fn retrying_never_retries_what_cannot_pass() {
    let (_dir, faulty, b) = retrying(|_| Fault::Pass);
    let r = b.put("../bad", body("x"), PutCondition::None).await;
    assert!(matches!(r, Err(BucketError::Permanent { .. })), "{r:?}");
    assert_eq!(faulty.requests(), 1, "a permanent error was retried");
    b.put("k", body("x"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let r = b.put("k", body("y"), PutCondition::IfNoneMatch).await;
    assert!(is_precondition_failed(&r), "{r:?}");
    assert!(matches!(
        b.get("nope").await,
        Err(BucketError::NotFound { .. })
    ));
    assert_eq!(faulty.requests(), 4, "a 412 or 404 was retried");

    let (_dir, faulty, b) = retrying(|n| if n <= 2 { Fault::Fail } else { Fault::Pass });
    b.put("k", body("x"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(faulty.requests(), 3);

    let (_dir, faulty, b) = retrying(|n| {
        if n == 1 {
            Fault::LoseAnswer
        } else {
            Fault::Fail
        }
    });
    let r = b.put("k", body("x"), PutCondition::IfNoneMatch).await;
    assert!(r.as_ref().is_err_and(|e| e.is_indeterminate()), "{r:?}");
    assert_eq!(faulty.requests(), u64::from(fast_retries().max_attempts));
}

#[tokio::test]
async fn retrying_reads_its_own_lost_writes() {
    let (_dir, _, b) = retrying(|n| {
        if n == 1 {
            Fault::LoseAnswer
        } else {
            Fault::Pass
        }
    });
    let etag = b
        .put("k", body("mine"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(b.head("k").await.unwrap().unwrap().etag, etag);

    // A lost answer, then someone else's object: a real conflict.
    let (_dir, faulty, b) = retrying(|n| {
        if n == 2 {
            Fault::LoseAnswer
        } else {
            Fault::Pass
        }
    });
    b.put("k", body("theirs"), PutCondition::None)
        .await
        .unwrap();
    let r = b.put("k", body("mine"), PutCondition::IfNoneMatch).await;
    assert!(
        is_precondition_failed(&r),
        "{r:?} after {} requests",
        faulty.requests()
    );

    let (_dir, _, b) = retrying(|n| {
        if n == 2 {
            Fault::LoseAnswer
        } else {
            Fault::Pass
        }
    });
    let etag = b.put("d", body("x"), PutCondition::None).await.unwrap();
    b.delete("d", Some(&etag)).await.unwrap();
    assert!(b.head("d").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn retrying_honours_cancellation() {
    let (_dir, fs) = fs_bucket();
    let faulty = Arc::new(FaultyBucket::new(fs, FaultPlan::custom(|_| Fault::Fail)));
    let policy = RetryPolicy {
        first_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(60),
        max_attempts: 1000,
    };
    let cancel = CancellationToken::new();
    let b = Arc::new(Retrying::new(faulty.clone(), policy, cancel.clone()));
    let task = tokio::spawn({
        let b = b.clone();
        async move { b.get("k").await }
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = faulty.requests();
    assert!(
        (3..=5).contains(&before),
        "{before} attempts in 10 s of 1, 2, 4... s backoff"
    );
    cancel.cancel();
    let r = tokio::time::timeout(Duration::from_millis(1), task).await;
    let r = r.expect("cancellation did not end the backoff").unwrap();
    assert!(matches!(r, Err(BucketError::Cancelled)), "{r:?}");
    assert_eq!(faulty.requests(), before);
    assert!(matches!(b.head("k").await, Err(BucketError::Cancelled)));
    assert_eq!(
        faulty.requests(),
        before,
        "a request started after cancellation"
    );
}

/// Every wrapper of `src/bucket/` over `inner`, named.
fn every_wrapper(inner: DynBucket) -> Vec<(&'static str, DynBucket)> {
    use mushroom_backup::bucket::counting::CountingBucket;
    use mushroom_backup::bucket::metered::MeteredBucket;
    use mushroom_backup::bucket::read_only::ReadOnly;
    use mushroom_backup::bucket::usage::{Usage, UsageBucket};
    use mushroom_backup::bucket::write_once::{LockMode, ObjectLock, WriteOnce};
    vec![
        (
            "usage",
            Arc::new(UsageBucket::new(inner.clone(), Usage::new())),
        ),
        ("counting", Arc::new(CountingBucket::new(inner.clone()))),
        ("metered", Arc::new(MeteredBucket::new(inner.clone()))),
        (
            "retry",
            Arc::new(Retrying::new(
                inner.clone(),
                fast_retries(),
                CancellationToken::new(),
            )),
        ),
        ("read_only", Arc::new(ReadOnly::new(inner.clone()))),
        (
            "write_once",
            Arc::new(WriteOnce::new(
                inner.clone(),
                ObjectLock {
                    mode: LockMode::Compliance,
                    period: Duration::from_secs(60),
                },
            )),
        ),
        (
            "faults",
            Arc::new(FaultyBucket::new(inner, FaultPlan::none())),
        ),
    ]
}

/// A wrapper that does not forward `get_buffers` falls back to the trait's default, one
/// copied buffer, and a restore or drill through it loses the no-copy path: every wrapper hands
/// on the inner bucket's buffers, whole and ranged.
#[tokio::test]
async fn every_wrapper_forwards_get_buffers() {
    let mem = MemBucket::with_buffers_of(2);
    mem.put("k", body("abcdefg"), PutCondition::None)
        .await
        .unwrap();
    for (name, b) in every_wrapper(Arc::new(mem)) {
        let whole = b
            .get_buffers("k", Part::Whole { at_most: 7 })
            .await
            .unwrap();
        assert_eq!(whole.len(), 4, "{name}: {whole:?}");
        assert_eq!(whole.concat(), b"abcdefg", "{name}");
        let part = b.get_buffers("k", Part::Range(1..6)).await.unwrap();
        assert_eq!(part.len(), 3, "{name}: {part:?}");
        assert_eq!(part.concat(), b"bcdef", "{name}");
    }
}

/// The `Bucket` methods with a default body, from the trait's source.
fn defaulted_methods(module: &str) -> Vec<String> {
    let start = module.find("pub trait Bucket").expect("the trait");
    let body = &module[start..];
    let body = &body[..body.find("\n}\n").expect("the trait's end")];
    let mut out = Vec::new();
    for (at, _) in body.match_indices("fn ") {
        let rest = &body[at + 3..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let semi = rest.find(';').unwrap_or(usize::MAX);
        let brace = rest.find('{').unwrap_or(usize::MAX);
        if brace < semi {
            out.push(name);
        }
    }
    out
}

/// Guards the same fault for wrappers yet to come: a wrapper in `src/bucket/` (a `Bucket`
/// holding an `inner` bucket) defines every trait method that has a default body, but `put`
/// and `get`, conveniences over `put_with` and `get_at_most` that no bucket overrides (so
/// their defaults are always right).
#[test]
fn every_wrapper_defines_every_defaulted_method() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bucket");
    let module = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let defaulted = defaulted_methods(&module);
    assert!(
        ["get_buffers", "put", "get"]
            .iter()
            .all(|m| defaulted.contains(&m.to_string())),
        "{defaulted:?}"
    );
    let mut wrappers = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("mod.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("async fn put(&self"),
            "{path:?} overrides Bucket::put: implement put_with only"
        );
        assert!(
            !text.contains("async fn get(&self"),
            "{path:?} overrides Bucket::get: implement get_at_most only"
        );
        if !(text.contains("Bucket for") && text.contains("inner: DynBucket")) {
            continue;
        }
        wrappers += 1;
        for m in defaulted
            .iter()
            .filter(|m| !["put", "get"].contains(&m.as_str()))
        {
            assert!(
                text.contains(&format!("fn {m}(")),
                "{path:?} does not forward Bucket::{m}: it falls back to the default"
            );
        }
    }
    assert_eq!(
        wrappers, 7,
        "usage, counting, metered, retry, read_only, faults, write_once"
    );
}
