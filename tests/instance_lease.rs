//! Store leases under an instance lease (`lease::instance`): what they cost, how a waiter
//! judges them, how a single store moves, how a holder that cannot renew stops, and how a
//! restart takes its own leases. On `MemBucket`s under paused time, so every instant is exact:
//! one bucket per store prefix and one for the lease root, shared by every "process".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mushroom_backup::bucket::counting::CountingBucket;
use mushroom_backup::bucket::faults::{Fault, FaultPlan, FaultyBucket, Op};
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::{Body, Bucket, DynBucket, PutCondition};
use mushroom_backup::lease::instance::key_for;
use mushroom_backup::lease::{
    Acquisition, BucketLease, Fence, InstanceLeaseConfig, InstanceLeases, LeaseAcquirer,
    LeaseConfig, LeaseError, LeaseRecord, LeaseState, LostReason,
};
use mushroom_backup::manifest::LEASE_KEY;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::task::TaskTracker;

const TTL: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);
const ROOT: &str = "mem://root";

/// A "process" running instance `id` with nonce `nonce`.
fn instance(id: &str, nonce: &str, proven_dead: &[&str]) -> InstanceLeases {
    InstanceLeases::new(
        InstanceLeaseConfig {
            ttl: TTL,
            coalesce: false,
            proven_dead: proven_dead.iter().map(|s| s.to_string()).collect(),
            ..InstanceLeaseConfig::new(id, nonce)
        },
        &TaskTracker::new(),
        mushroom_backup::bucket::Opener::new(tokio_util::sync::CancellationToken::new()),
    )
}

fn store_config(worker: &str) -> LeaseConfig {
    LeaseConfig {
        ttl: TTL,
        holder: worker.into(),
        host: format!("host-of-{worker}"),
        store: "store-1".into(),
        conditional: true,
        coalesce: false,
    }
}

fn acquirer(store: &DynBucket, fence: &Fence, worker: &str) -> LeaseAcquirer {
    LeaseAcquirer::new(store.clone(), store_config(worker)).fenced(fence.clone())
}

async fn acquired(a: &mut LeaseAcquirer) -> BucketLease {
    match a.try_acquire().await {
        Ok(Acquisition::Acquired(lease)) => lease,
        other => panic!("not acquired: {other:?}"),
    }
}

/// The holder named and when to look again, of an attempt that must not acquire.
fn held_elsewhere(attempt: Result<Acquisition, LeaseError>) -> (String, Duration) {
    match attempt {
        Ok(Acquisition::HeldElsewhere {
            holder, retry_in, ..
        }) => (holder, retry_in),
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
}

async fn record(bucket: &dyn Bucket, key: &str) -> LeaseRecord {
    LeaseRecord::from_json(&bucket.get(key).await.expect("a lease object").data).unwrap()
}

#[tokio::test(start_paused = true)]
async fn two_hundred_idle_stores_cost_only_the_instance_leases_renewals() {
    let root = Arc::new(CountingBucket::new(Arc::new(MemBucket::new())));
    let a = instance("a", "n1", &[]);
    let fence = a.fence_at(ROOT, root.clone());
    let stores: Vec<Arc<CountingBucket>> = (0..200)
        .map(|_| Arc::new(CountingBucket::new(Arc::new(MemBucket::new()))))
        .collect();
    let mut leases = Vec::new();
    for s in &stores {
        let s: DynBucket = s.clone();
        leases.push(acquired(&mut acquirer(&s, &fence, "w")).await);
    }
    // Each store lease names the instance lease and is written once.
    let r = record(&*stores[0], LEASE_KEY).await;
    let fence_ref = r.fence.expect("a fenced store lease");
    assert_eq!(
        (fence_ref.key.as_str(), fence_ref.holder.as_str()),
        ("instances/a.lease", "a/n1")
    );
    assert_eq!(r.holder, "a/n1");
    let t0 = Instant::now();
    let root_before = root.counts().snapshot();
    let stores_before: Vec<_> = stores.iter().map(|s| s.counts().snapshot()).collect();

    while Instant::now() < t0 + 10 * TTL {
        sleep(Duration::from_secs(1)).await;
        assert!(leases.iter().all(BucketLease::may_write));
    }
    sleep(MS).await; // the renewal due at 10 TTLs
    for (s, before) in stores.iter().zip(&stores_before) {
        let cost = s.counts().snapshot().since(before);
        assert_eq!(cost.total, 0, "an idle store sent requests: {cost:?}");
    }
    let cost = root.counts().snapshot().since(&root_before);
    assert_eq!(
        (cost.put, cost.total),
        (30, 30),
        "the instance lease renews every third of a TTL, whatever the number of stores"
    );
    assert_eq!(leases[0].status().renewals, 30, "the fence's renewals");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_names_the_holder_and_takes_over_only_a_ttl_after_the_fence_stopped() {
    let root: DynBucket = Arc::new(MemBucket::new());
    let store: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let lease_a = acquired(&mut acquirer(&store, &a.fence_at(ROOT, root.clone()), "wa")).await;
    let b = instance("b", "n2", &[]);
    let mut waiter = acquirer(&store, &b.fence_at(ROOT, root.clone()), "wb");

    // While `a` renews its instance lease, `b` never takes the store, however long it looks.
    let t0 = Instant::now();
    while Instant::now() < t0 + 4 * TTL {
        let (holder, retry_in) = held_elsewhere(waiter.try_acquire().await);
        assert_eq!(holder, "a/n1");
        assert!(retry_in <= TTL / 3, "{retry_in:?}");
        sleep(retry_in).await;
    }
    assert!(lease_a.may_write());

    // `a` dies: its last renewal was at the latest now.
    let died = Instant::now();
    drop(a);
    std::mem::forget(lease_a); // a crash: nothing released
    let acquired_at = loop {
        match waiter.try_acquire().await.unwrap() {
            Acquisition::Acquired(lease) => {
                assert!(lease.may_write());
                break Instant::now();
            }
            Acquisition::HeldElsewhere { retry_in, .. } => sleep(retry_in).await,
        }
    };
    let waited = acquired_at - died;
    assert!(
        waited >= TTL && waited <= TTL + TTL / 3 + MS,
        "took over {waited:?} after the holder died"
    );
    assert_eq!(record(&*store, LEASE_KEY).await.holder, "b/n2");
}

#[tokio::test(start_paused = true)]
async fn one_store_moves_at_once_while_the_holders_other_stores_stay() {
    let root: DynBucket = Arc::new(MemBucket::new());
    let x: DynBucket = Arc::new(MemBucket::new());
    let y: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let fa = a.fence_at(ROOT, root.clone());
    let ax = acquired(&mut acquirer(&x, &fa, "ax")).await;
    let ay = acquired(&mut acquirer(&y, &fa, "ay")).await;
    let b = instance("b", "n2", &[]);
    let fb = b.fence_at(ROOT, root.clone());
    let mut bx = acquirer(&x, &fb, "bx");
    let mut by = acquirer(&y, &fb, "by");
    assert_eq!(held_elsewhere(bx.try_acquire().await).0, "a/n1");

    // `a` hands store x over (a planned move, a deregistration): x moves at once, y stays.
    ax.release().await.unwrap();
    let moved = acquired(&mut bx).await;
    assert!(moved.may_write());
    sleep(3 * TTL).await;
    assert!(ay.may_write() && moved.may_write());
    assert_eq!(held_elsewhere(by.try_acquire().await).0, "a/n1");
    assert_eq!(record(&*x, LEASE_KEY).await.holder, "b/n2");
    assert_eq!(record(&*y, LEASE_KEY).await.holder, "a/n1");
}

#[tokio::test(start_paused = true)]
async fn racing_instances_one_wins_the_other_names_it() {
    let root: DynBucket = Arc::new(MemBucket::new());
    let store: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let b = instance("b", "n2", &[]);
    let mut aa = acquirer(&store, &a.fence_at(ROOT, root.clone()), "wa");
    let mut bb = acquirer(&store, &b.fence_at(ROOT, root.clone()), "wb");
    let (ra, rb) = tokio::join!(aa.try_acquire(), bb.try_acquire());
    let outcomes = [ra.unwrap(), rb.unwrap()];
    let won: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o, Acquisition::Acquired(_)))
        .collect();
    assert_eq!(won.len(), 1, "{outcomes:?}");
    let winner = record(&*store, LEASE_KEY).await.holder;
    let named: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            Acquisition::HeldElsewhere { holder, .. } => Some(holder.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(named, [winner]);
}

#[tokio::test(start_paused = true)]
async fn failing_instance_renewals_stop_every_store_at_the_fences_deadline() {
    let mem = MemBucket::new();
    let failing = Arc::new(AtomicBool::new(false));
    let switch = failing.clone();
    let key = key_for("a");
    let plan_key = key.clone();
    let root: DynBucket = Arc::new(FaultyBucket::new(
        Arc::new(mem.clone()),
        FaultPlan::custom(move |r| {
            if r.op == Op::Put && r.key == plan_key && switch.load(Ordering::SeqCst) {
                Fault::Fail
            } else {
                Fault::Pass
            }
        }),
    ));
    // A slow upload under store x's lease.
    let x_mem = MemBucket::new();
    let x: DynBucket = Arc::new(FaultyBucket::new(
        Arc::new(x_mem.clone()),
        FaultPlan::custom(|r| {
            if r.op == Op::Put && r.key == "data/x" {
                Fault::Delay(10 * TTL)
            } else {
                Fault::Pass
            }
        }),
    ));
    let y: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let fa = a.fence_at(ROOT, root.clone());
    let t0 = Instant::now();
    let lx = acquired(&mut acquirer(&x, &fa, "ax")).await;
    let ly = acquired(&mut acquirer(&y, &fa, "ay")).await;
    sleep_until(t0 + TTL / 3 + MS).await;
    assert_eq!(lx.status().renewals, 1);
    failing.store(true, Ordering::SeqCst);
    // From the start of the last good renewal of the instance lease.
    let deadline = t0 + TTL / 3 + TTL - TTL / 10;

    let upload = lx.guard(x.put(
        "data/x",
        Body::from(Bytes::from_static(b"late")),
        PutCondition::IfNoneMatch,
    ));
    let (uploaded, _) = tokio::join!(upload, async {
        sleep_until(deadline - MS).await;
        assert!(
            lx.may_write() && ly.may_write(),
            "stopped before the deadline"
        );
        assert!(lx.status().last_renewal_error.is_some());
    });
    assert!(matches!(uploaded, Err(LeaseError::Lost)), "{uploaded:?}");
    assert_eq!(Instant::now(), deadline, "not cancelled at the deadline");
    assert!(lx.token().is_cancelled() && ly.token().is_cancelled());
    assert!(!lx.may_write() && !ly.may_write());
    assert_eq!(
        ly.status().state,
        LeaseState::Lost {
            reason: LostReason::InstanceLeaseEnded
        }
    );
    sleep(20 * TTL).await;
    assert!(
        x_mem.head("data/x").await.unwrap().is_none(),
        "the cancelled upload landed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_taken_over_instance_lease_ends_its_stores_at_the_next_renewal() {
    let mem = MemBucket::new();
    let root: DynBucket = Arc::new(mem.clone());
    let store: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let t0 = Instant::now();
    let lease = acquired(&mut acquirer(&store, &a.fence_at(ROOT, root.clone()), "w")).await;
    let key = key_for("a");
    let there = mem.get(&key).await.unwrap();
    let theirs = LeaseRecord {
        holder: "a/intruder".into(),
        ..LeaseRecord::from_json(&there.data).unwrap()
    };
    mem.put(
        &key,
        theirs.to_json().into(),
        PutCondition::IfMatch(there.etag),
    )
    .await
    .unwrap();
    lease.token().cancelled().await;
    assert_eq!(Instant::now(), t0 + TTL / 3);
    assert_eq!(
        lease.status().state,
        LeaseState::Lost {
            reason: LostReason::InstanceLeaseEnded
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_restart_proven_dead_takes_its_instance_and_store_leases_at_once() {
    let counting = Arc::new(CountingBucket::new(Arc::new(MemBucket::new())));
    let root: DynBucket = counting.clone();
    let stores: Vec<DynBucket> = (0..3)
        .map(|_| Arc::new(MemBucket::new()) as DynBucket)
        .collect();
    let old = instance("a", "n1", &[]);
    let f_old = old.fence_at(ROOT, root.clone());
    for s in &stores {
        std::mem::forget(acquired(&mut acquirer(s, &f_old, "w")).await);
    }
    drop(old); // SIGKILL: leases left behind

    let t0 = Instant::now();
    let new = instance("a", "n2", &["a/n1"]);
    let f_new = new.fence_at(ROOT, root.clone());
    let before = counting.counts().snapshot();
    for s in &stores {
        let lease = acquired(&mut acquirer(s, &f_new, "w2")).await;
        assert!(lease.may_write());
        assert_eq!(record(&**s, LEASE_KEY).await.holder, "a/n2");
    }
    assert_eq!(Instant::now(), t0, "waited");
    // The instance lease: one GET and one PUT, whatever the number of stores; and no GET of
    // it per store (it is this process's own fence now).
    let cost = counting.counts().snapshot().since(&before);
    assert_eq!((cost.get, cost.put, cost.total), (1, 1, 2), "{cost:?}");
}

#[tokio::test(start_paused = true)]
async fn a_restart_without_proof_waits_a_ttl_for_its_old_instance_lease_then_takes_all() {
    let root: DynBucket = Arc::new(MemBucket::new());
    let store: DynBucket = Arc::new(MemBucket::new());
    let old = instance("a", "n1", &[]);
    std::mem::forget(
        acquired(&mut acquirer(
            &store,
            &old.fence_at(ROOT, root.clone()),
            "w",
        ))
        .await,
    );
    drop(old);

    let t0 = Instant::now();
    let new = instance("a", "n2", &[]);
    let mut again = acquirer(&store, &new.fence_at(ROOT, root.clone()), "w2");
    let names: Arc<Mutex<Vec<String>>> = Arc::default();
    let acquired_at = loop {
        match again.try_acquire().await.unwrap() {
            Acquisition::Acquired(_) => break Instant::now(),
            Acquisition::HeldElsewhere {
                retry_in, holder, ..
            } => {
                names.lock().unwrap().push(holder);
                sleep(retry_in).await;
            }
        }
    };
    assert!(
        acquired_at - t0 >= TTL && acquired_at - t0 <= TTL + TTL / 3,
        "{:?}",
        acquired_at - t0
    );
    let names = names.lock().unwrap().clone();
    assert!(
        !names.is_empty() && names.iter().all(|n| n == "a/n1"),
        "{names:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_per_store_lease_holder_respects_a_fenced_lease_and_acquires_after_its_release() {
    let root: DynBucket = Arc::new(MemBucket::new());
    let store: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let held = acquired(&mut acquirer(&store, &a.fence_at(ROOT, root.clone()), "w")).await;
    // The standalone `backup` command: a lease of its own, judging the fence it finds.
    let mut standalone =
        LeaseAcquirer::new(store.clone(), store_config("solo")).watching_fences_in(root.clone());
    let t0 = Instant::now();
    while Instant::now() < t0 + 3 * TTL {
        let (holder, retry_in) = held_elsewhere(standalone.try_acquire().await);
        assert_eq!(holder, "a/n1");
        sleep(retry_in).await;
    }
    held.release().await.unwrap();
    a.release_all().await;
    let lease = match standalone.try_acquire().await.unwrap() {
        Acquisition::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    assert!(lease.may_write());
    let r = record(&*store, LEASE_KEY).await;
    assert_eq!((r.holder.as_str(), r.fence), ("solo", None));
}

#[tokio::test(start_paused = true)]
async fn release_all_deletes_the_instance_lease_and_acquires_nothing_after() {
    let mem = MemBucket::new();
    let root: DynBucket = Arc::new(mem.clone());
    let store: DynBucket = Arc::new(MemBucket::new());
    let a = instance("a", "n1", &[]);
    let fa = a.fence_at(ROOT, root.clone());
    let lease = acquired(&mut acquirer(&store, &fa, "w")).await;
    lease.release().await.unwrap();
    assert!(store.head(LEASE_KEY).await.unwrap().is_none());
    assert_eq!(a.status().await.len(), 1);
    a.release_all().await;
    assert!(mem.head(&key_for("a")).await.unwrap().is_none());
    let r = acquirer(&store, &fa, "w").try_acquire().await;
    assert!(matches!(r, Err(LeaseError::Cancelled)), "{r:?}");
}

/// Issue 40, finding 5d: a `file://` lease root `<parent>/.mushroom-backup` that is a symbolic
/// link is refused, naming it: no lease, `.tmp/` or `.lock` is created where it points. A link
/// planted after the root was opened fails the next request the same way. A waiter reading
/// fences refuses it too.
#[tokio::test]
async fn a_file_lease_root_that_is_a_link_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (dst, elsewhere) = (dir.path().join("dst"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(dst.join("b")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let link = dst.join(".mushroom-backup");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let leases = instance("i1", "n1", &[]);
    let destination = format!("file://{}", dst.join("b").display());
    let e = leases
        .fence_for(&destination)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&link.display().to_string()) && e.contains("symbolic link"),
        "{e}"
    );
    let planted: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(planted.is_empty(), "created through the link: {planted:?}");

    // A waiter judging a store lease that names a fence there: refused, not followed.
    let store: DynBucket =
        Arc::new(mushroom_backup::bucket::fs::FsBucket::open(&dst.join("b")).unwrap());
    let mut fenced = record_of("serve/1");
    fenced.fence = Some(mushroom_backup::lease::FenceRef {
        key: key_for("i9"),
        holder: "i9/n".into(),
    });
    store
        .put(LEASE_KEY, Body::from(fenced.to_json()), PutCondition::None)
        .await
        .unwrap();
    let mut waiter = LeaseAcquirer::new(store.clone(), store_config("w"));
    let e = waiter.try_acquire().await.unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    // A dangling link is no missing lease root (which would let the waiter take it at once).
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
    let mut waiter = LeaseAcquirer::new(store.clone(), store_config("w"));
    let e = waiter.try_acquire().await.unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert!(!dir.path().join("nowhere").exists());

    // A real directory: opened; replaced by a link afterwards: the next request is refused.
    std::fs::remove_file(&link).unwrap();
    let fence = leases.fence_for(&destination).await.unwrap();
    let mut a = acquirer(&store, &fence, "w1");
    store.delete(LEASE_KEY, None).await.unwrap();
    drop(acquired(&mut a).await);
    std::fs::rename(&link, dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    assert!(fence.bucket().get(&key_for("i1")).await.is_err());
    let planted: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(planted.is_empty(), "created through the link: {planted:?}");
}

fn record_of(holder: &str) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        host: "h".into(),
        store: "store-1".into(),
        ttl_ms: 30_000,
        renewals: 0,
        acquired_at: String::new(),
        fence: None,
        ack_window_ms: None,
    }
}
