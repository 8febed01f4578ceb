//! The bucket lease (DESIGN.md section 7): acquisition, takeover after a TTL of observed
//! staleness, renewal, loss, guarded requests, release. On a `MemBucket` under paused time, so
//! every instant is exact; one test on a real local-directory bucket in real time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mushroom_backup::bucket::counting::CountingBucket;
use mushroom_backup::bucket::faults::{Fault, FaultPlan, FaultyBucket, Op, Request};
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::{Body, Bucket, BucketError, DynBucket, PutCondition};
use mushroom_backup::lease::{
    Acquisition, BucketLease, LeaseAcquirer, LeaseConfig, LeaseError, LeaseRecord, LeaseState,
    LostReason, ReleaseOutcome,
};
use mushroom_backup::manifest::LEASE_KEY;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

fn config(holder: &str) -> LeaseConfig {
    LeaseConfig {
        ttl: TTL,
        holder: holder.into(),
        host: format!("host-of-{holder}"),
        store: "store-1".into(),
        conditional: true,
        // These tests time renewals to the millisecond (one below checks the rounding).
        coalesce: false,
    }
}

async fn acquire(bucket: &DynBucket, config: LeaseConfig) -> BucketLease {
    match LeaseAcquirer::new(bucket.clone(), config)
        .try_acquire()
        .await
    {
        Ok(Acquisition::Acquired(lease)) => lease,
        other => panic!("not acquired: {other:?}"),
    }
}

/// The holder and how long it was seen unchanged, of an attempt that must not acquire.
fn held_elsewhere(attempt: Result<Acquisition, LeaseError>) -> (String, Duration, Duration) {
    match attempt {
        Ok(Acquisition::HeldElsewhere {
            holder,
            seen_unchanged_for,
            retry_in,
            ..
        }) => (holder, seen_unchanged_for, retry_in),
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
}

async fn lease_object(bucket: &dyn Bucket) -> (LeaseRecord, String) {
    let object = bucket.get(LEASE_KEY).await.expect("a lease object");
    (LeaseRecord::from_json(&object.data).unwrap(), object.etag)
}

/// A bucket whose plan sees every request: `fault` picks its fault, and the log keeps
/// (op, key, conditional) of each.
type Log = Arc<Mutex<Vec<(Op, String, bool)>>>;
fn planned(
    mem: &MemBucket,
    fault: impl Fn(&Request<'_>) -> Fault + Send + Sync + 'static,
) -> (DynBucket, Log) {
    let log: Log = Arc::default();
    let plan_log = log.clone();
    let plan = FaultPlan::custom(move |r| {
        let mut log = plan_log.lock().unwrap();
        log.push((r.op, r.key.to_string(), r.conditional));
        fault(r)
    });
    (
        Arc::new(FaultyBucket::new(Arc::new(mem.clone()), plan)),
        log,
    )
}

fn body(s: &str) -> Body {
    Body::from(Bytes::from(s.to_string()))
}

#[tokio::test(start_paused = true)]
async fn acquires_an_empty_prefix() {
    let mem = MemBucket::new();
    let (bucket, log) = planned(&mem, |_| Fault::Pass);
    let lease = acquire(&bucket, config("a")).await;
    assert!(lease.may_write());
    assert!(lease.is_conditional());
    assert!(!lease.token().is_cancelled());
    let status = lease.status();
    assert_eq!(status.state, LeaseState::Holding);
    assert_eq!((status.holder.as_str(), status.renewals), ("a", 0));

    let (record, _) = lease_object(&mem).await;
    assert_eq!(
        (
            record.holder.as_str(),
            record.host.as_str(),
            record.store.as_str()
        ),
        ("a", "host-of-a", "store-1")
    );
    assert_eq!((record.ttl_ms, record.renewals), (30_000, 0));
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            (Op::Get, LEASE_KEY.to_string(), false),
            (Op::Put, LEASE_KEY.to_string(), true)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn takes_over_only_after_a_full_ttl_of_observed_staleness() {
    // Without the bucket's clock (an endpoint with no `Date`): only what this process saw.
    let mem = MemBucket::without_clock();
    let bucket: DynBucket = Arc::new(mem.clone());
    let t0 = Instant::now();
    let a = acquire(&bucket, config("a")).await;
    let mut b = LeaseAcquirer::new(bucket.clone(), config("b"));

    // While `a` renews, `b` never sees one version for a TTL, however long it looks.
    while Instant::now() < t0 + 5 * TTL {
        let (holder, seen, retry_in) = held_elsewhere(b.try_acquire().await);
        assert_eq!(holder, "a");
        assert!(seen < TTL, "seen unchanged for {seen:?} while renewed");
        assert!(retry_in <= TTL / 3, "{retry_in:?}");
        sleep(retry_in).await;
    }
    assert!(a.may_write());

    // `a` dies (no release): its last renewal started at a multiple of TTL/3 after t0.
    sleep(TTL / 7).await;
    let crashed = Instant::now();
    let renew_every = config("a").renew_every();
    let last_renewal =
        t0 + renew_every * ((crashed - t0).as_millis() / renew_every.as_millis()) as u32;
    drop(a);
    let (holder, seen, _) = held_elsewhere(b.try_acquire().await);
    assert_eq!(holder, "a");
    assert!(
        seen <= crashed - last_renewal,
        "seen {seen:?}, but that version is only {:?} old",
        crashed - last_renewal
    );
    let takeover_at = crashed + (TTL - seen);

    sleep_until(takeover_at - MS).await;
    let (holder, seen, retry_in) = held_elsewhere(b.try_acquire().await);
    assert_eq!((holder.as_str(), seen, retry_in), ("a", TTL - MS, MS));
    assert_eq!(lease_object(&mem).await.0.holder, "a");

    sleep(MS).await;
    let before = lease_object(&mem).await.0;
    let Ok(Acquisition::Acquired(b_lease)) = b.try_acquire().await else {
        panic!("not taken over after a full TTL of staleness");
    };
    assert!(Instant::now() - crashed <= TTL + TTL / 3);
    assert!(b_lease.may_write());
    let after = lease_object(&mem).await.0;
    assert_eq!(after.holder, "b");
    assert_eq!(after.renewals, before.renewals + 1, "the counter goes on");
}

#[tokio::test(start_paused = true)]
async fn a_lease_the_buckets_clock_shows_stale_is_taken_at_once() {
    let mem = MemBucket::new();
    let bucket: DynBucket = Arc::new(mem.clone());
    let a = acquire(&bucket, config("a")).await;
    sleep(TTL / 6).await;
    drop(a); // a crash: its only write is TTL/6 old
    let t = Instant::now();
    let mut b = LeaseAcquirer::new(bucket.clone(), config("b"));
    // First look: the object is young by the bucket's clock, and new to `b`.
    let (_, seen, retry_in) = held_elsewhere(b.try_acquire().await);
    assert_eq!((seen, retry_in), (Duration::ZERO, TTL / 3));
    // The bucket's clock, not `b`'s observation, decides: a TTL and the clock's resolution
    // after the write, long before `b` has watched it for a TTL.
    let written = t - TTL / 6;
    let stale_at = written + TTL + mushroom_backup::lease::BUCKET_CLOCK_RESOLUTION;
    sleep_until(stale_at - MS).await;
    assert_eq!(held_elsewhere(b.try_acquire().await).0, "a");
    sleep(MS).await;
    let Ok(Acquisition::Acquired(lease)) = b.try_acquire().await else {
        panic!("not taken at once though the bucket's clock shows it stale");
    };
    assert!(lease.may_write());
    assert!(Instant::now() - t < TTL, "watched for a TTL anyway");
}

#[tokio::test(start_paused = true)]
async fn the_same_holder_id_takes_its_own_lease_at_once() {
    let bucket: DynBucket = Arc::new(MemBucket::new());
    drop(acquire(&bucket, config("same")).await);
    let mut other = LeaseAcquirer::new(bucket.clone(), config("other"));
    assert_eq!(held_elsewhere(other.try_acquire().await).0, "same");
    let again = acquire(&bucket, config("same")).await;
    assert!(again.may_write());
    assert_eq!(lease_object(&*bucket).await.0.renewals, 1);
}

#[tokio::test(start_paused = true)]
async fn release_deletes_with_if_match_and_a_successor_acquires_at_once() {
    let mem = MemBucket::new();
    let (bucket, log) = planned(&mem, |_| Fault::Pass);
    let a = acquire(&bucket, config("a")).await;
    let mut b = LeaseAcquirer::new(bucket.clone(), config("b"));
    assert_eq!(held_elsewhere(b.try_acquire().await).0, "a");
    sleep(TTL).await; // a few renewals, so the version deleted is not the first
    let handle = a.handle();
    let started = Instant::now();
    assert_eq!(a.release().await.unwrap(), ReleaseOutcome::Deleted);
    assert_eq!(Instant::now(), started);
    assert!(mem.head(LEASE_KEY).await.unwrap().is_none());
    let deletes: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(op, _, _)| *op == Op::Delete)
        .cloned()
        .collect();
    assert_eq!(deletes, [(Op::Delete, LEASE_KEY.to_string(), true)]);

    assert!(!handle.may_write());
    assert!(handle.token().is_cancelled());
    assert_eq!(handle.status().state, LeaseState::Released);
    let polled = AtomicBool::new(false);
    let r = handle
        .guard(async { polled.store(true, Ordering::SeqCst) })
        .await;
    assert!(matches!(r, Err(LeaseError::Lost)), "{r:?}");
    assert!(
        !polled.load(Ordering::SeqCst),
        "a released lease ran a guarded future"
    );

    let Ok(Acquisition::Acquired(b_lease)) = b.try_acquire().await else {
        panic!("the successor did not acquire a released lease at once");
    };
    assert_eq!(Instant::now(), started);
    assert!(b_lease.may_write());
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_it_held_change_the_etag_and_cost_only_puts() {
    let mem = MemBucket::new();
    let counting = Arc::new(CountingBucket::new(Arc::new(mem.clone())));
    let bucket: DynBucket = counting.clone();
    let t0 = Instant::now();
    let lease = acquire(&bucket, config("a")).await;
    let after_acquire = counting.counts().snapshot();
    let token = lease.token();

    let mut etags = vec![lease_object(&mem).await.1];
    while Instant::now() < t0 + 10 * TTL {
        sleep(Duration::from_secs(1)).await;
        assert!(
            lease.may_write(),
            "not holding at {:?}",
            Instant::now() - t0
        );
        assert!(!token.is_cancelled());
        let etag = lease_object(&mem).await.1;
        if etags.last() != Some(&etag) {
            etags.push(etag);
        }
    }
    sleep(MS).await;
    etags.push(lease_object(&mem).await.1);
    let renewals = (10 * TTL).as_secs() / config("a").renew_every().as_secs();
    assert_eq!(renewals, 30);
    assert_eq!(lease.status().renewals, renewals);
    assert_eq!(lease_object(&mem).await.0.renewals, renewals);
    let mut distinct = etags.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len() as u64, renewals + 1, "an ETag repeated");
    let cost = counting.counts().snapshot().since(&after_acquire);
    assert_eq!(
        (cost.put, cost.total),
        (renewals, renewals),
        "an idle lease costs only its renewals: {cost:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_end_may_write_ttl_minus_margin_after_the_last_good_one() {
    let mem = MemBucket::new();
    let failing = Arc::new(AtomicBool::new(false));
    let switch = failing.clone();
    let slow = Duration::from_secs(2);
    let (bucket, log) = planned(&mem, move |r| match (r.op, r.key) {
        (Op::Put, LEASE_KEY) if switch.load(Ordering::SeqCst) => Fault::Fail,
        // Request 4 is the second renewal: it takes a while to land.
        (Op::Put, LEASE_KEY) if r.number == 4 => Fault::Delay(slow),
        _ => Fault::Pass,
    });
    let c = config("a");
    let t0 = Instant::now();
    let lease = acquire(&bucket, c.clone()).await;
    let token = lease.token();
    sleep_until(t0 + 2 * c.renew_every() + slow - MS).await;
    assert_eq!(lease.status().renewals, 1, "the slow renewal landed early");
    sleep(2 * MS).await;
    assert_eq!(lease.status().renewals, 2);
    failing.store(true, Ordering::SeqCst);
    // From the *start* of the last good renewal, not from when its answer came.
    let deadline = t0 + 2 * c.renew_every() + c.ttl - c.margin();

    sleep_until(deadline - MS).await;
    assert!(lease.may_write(), "stopped holding before its deadline");
    assert!(!token.is_cancelled());
    assert!(lease.status().last_renewal_error.is_some());

    token.cancelled().await;
    assert_eq!(
        Instant::now(),
        deadline,
        "the token was not cancelled at the deadline"
    );
    assert!(!lease.may_write());
    let status = lease.status();
    assert_eq!(
        status.state,
        LeaseState::Lost {
            reason: LostReason::Expired
        }
    );
    assert_eq!(status.renewals, 2);
    let failed_puts = || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|(op, _, _)| *op == Op::Put)
            .count()
            - 3
    };
    // Due at 30 s, then again every RENEW_RETRY until 47 s: not a renewal interval apart.
    assert_eq!(failed_puts(), 17);
    sleep(3 * TTL).await;
    assert_eq!(failed_puts(), 17, "renewing after the lease was lost");
    assert!(!lease.may_write(), "a lost lease held again");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_makes_the_next_renewal_lose_the_lease() {
    let mem = MemBucket::new();
    let bucket: DynBucket = Arc::new(mem.clone());
    let t0 = Instant::now();
    let lease = acquire(&bucket, config("a")).await;
    let token = lease.token();
    sleep(Duration::from_secs(1)).await;

    // Another process takes it over (as if it had waited out a TTL).
    let (_, etag) = lease_object(&mem).await;
    let theirs = LeaseRecord {
        holder: "intruder".into(),
        ..lease_object(&mem).await.0
    };
    let their_etag = mem
        .put(
            LEASE_KEY,
            theirs.to_json().into(),
            PutCondition::IfMatch(etag),
        )
        .await
        .unwrap();

    token.cancelled().await;
    assert_eq!(Instant::now(), t0 + config("a").renew_every());
    assert!(!lease.may_write());
    assert_eq!(
        lease.status().state,
        LeaseState::Lost {
            reason: LostReason::TakenOver
        }
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::TakenOver);
    let (record, etag) = lease_object(&mem).await;
    assert_eq!((record.holder.as_str(), etag), ("intruder", their_etag));
}

/// Issue 40, finding 3: a renewal refused over an object that holds this holder's own record
/// (the process wrote it under another name: one bucket reached by two spellings of its URL)
/// is no takeover. The lease renews over that version at its next attempt and keeps holding;
/// an intruder's record still ends it.
#[tokio::test(start_paused = true)]
async fn a_renewal_refused_over_this_holders_own_record_is_no_takeover() {
    let mem = MemBucket::new();
    let bucket: DynBucket = Arc::new(mem.clone());
    let lease = acquire(&bucket, config("a")).await;
    sleep(Duration::from_secs(1)).await;
    let (ours, etag) = lease_object(&mem).await;
    let rewritten = LeaseRecord {
        renewals: ours.renewals + 7,
        ..ours.clone()
    };
    mem.put(
        LEASE_KEY,
        rewritten.to_json().into(),
        PutCondition::IfMatch(etag),
    )
    .await
    .unwrap();
    // The renewal due at a third of a TTL is refused, reads its own record, and the retry a
    // second later renews over it.
    sleep(config("a").renew_every() + Duration::from_secs(2)).await;
    assert!(lease.may_write(), "{:?}", lease.status());
    assert_eq!(lease.status().state, LeaseState::Holding);
    let (record, _) = lease_object(&mem).await;
    assert_eq!(record.holder, "a");
    assert_eq!(record.renewals, rewritten.renewals + 1, "renewed over it");
    assert_eq!(lease.status().last_renewal_error, None);

    // Another holder's record (or the same holder id of another store): a takeover.
    let (_, etag) = lease_object(&mem).await;
    let theirs = LeaseRecord {
        store: "store-2".into(),
        ..record
    };
    mem.put(
        LEASE_KEY,
        theirs.to_json().into(),
        PutCondition::IfMatch(etag),
    )
    .await
    .unwrap();
    tokio::time::timeout(TTL, lease.token().cancelled())
        .await
        .expect("still holds");
    assert_eq!(
        lease.status().state,
        LeaseState::Lost {
            reason: LostReason::TakenOver
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_guarded_request_is_cancelled_when_the_lease_stops_holding() {
    let mem = MemBucket::new();
    let (bucket, _) = planned(&mem, |r| match (r.op, r.key) {
        (Op::Put, "data/x") => Fault::Delay(10 * TTL),
        (Op::Put, LEASE_KEY) if r.number > 2 => Fault::Fail, // every renewal
        _ => Fault::Pass,
    });
    let t0 = Instant::now();
    let lease = acquire(&bucket, config("a")).await;
    let r = lease
        .guard(bucket.put("data/x", body("late"), PutCondition::IfNoneMatch))
        .await;
    assert!(matches!(r, Err(LeaseError::Lost)), "{r:?}");
    assert_eq!(Instant::now(), t0 + config("a").may_write_for());
    assert!(lease.token().is_cancelled());
    sleep(20 * TTL).await;
    assert!(
        mem.head("data/x").await.unwrap().is_none(),
        "the cancelled put landed"
    );
    let polled = AtomicBool::new(false);
    let r = lease
        .guard(async { polled.store(true, Ordering::SeqCst) })
        .await;
    assert!(matches!(r, Err(LeaseError::Lost)) && !polled.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_whose_answer_was_lost_still_counts() {
    let mem = MemBucket::new();
    // Request 4 is the first renewal (1 get, 2 put: acquisition; 3 get: the check below).
    let (bucket, log) = planned(&mem, |r| match (r.number, r.op) {
        (4, Op::Put) => Fault::LoseAnswer,
        _ => Fault::Pass,
    });
    let t0 = Instant::now();
    let lease = acquire(&bucket, config("a")).await;
    assert_eq!(
        held_elsewhere(
            LeaseAcquirer::new(bucket.clone(), config("b"))
                .try_acquire()
                .await
        )
        .0,
        "a"
    );
    while Instant::now() < t0 + 5 * TTL {
        sleep(Duration::from_secs(1)).await;
        assert!(lease.may_write(), "lost at {:?}", Instant::now() - t0);
    }
    sleep(MS).await;
    let status = lease.status();
    assert_eq!(status.state, LeaseState::Holding);
    assert_eq!(status.renewals, 15);
    assert!(status.last_renewal_error.is_none());
    let log = log.lock().unwrap();
    assert!(
        log.iter().filter(|(op, _, _)| *op == Op::Get).count() == 3,
        "the refused retry did not read the object back: {log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn racing_acquirers_one_wins_the_other_names_it() {
    let mem = MemBucket::new();
    // Both look before either writes.
    let (bucket, _) = planned(&mem, |r| match r.op {
        Op::Get if r.number <= 2 => Fault::Delay(MS),
        _ => Fault::Pass,
    });
    let mut a = LeaseAcquirer::new(bucket.clone(), config("a"));
    let mut b = LeaseAcquirer::new(bucket.clone(), config("b"));
    let (ra, rb) = tokio::join!(a.try_acquire(), b.try_acquire());
    let (winner, loser) = match (ra.unwrap(), rb.unwrap()) {
        (Acquisition::Acquired(_), loser) => ("a", loser),
        (loser, Acquisition::Acquired(_)) => ("b", loser),
        other => panic!("no winner: {other:?}"),
    };
    assert_eq!(held_elsewhere(Ok(loser)).0, winner);
    assert_eq!(lease_object(&mem).await.0.holder, winner);
}

#[tokio::test(start_paused = true)]
async fn without_conditional_writes_renewals_are_plain_and_notice_an_overwrite() {
    let mem = MemBucket::new();
    let (bucket, log) = planned(&mem, |_| Fault::Pass);
    let plain = |holder| LeaseConfig {
        conditional: false,
        ..config(holder)
    };
    let t0 = Instant::now();
    let lease = acquire(&bucket, plain("a")).await;
    assert!(!lease.is_conditional() && !lease.status().conditional);
    let mut b = LeaseAcquirer::new(bucket.clone(), plain("b"));
    assert_eq!(held_elsewhere(b.try_acquire().await).0, "a");
    sleep(TTL + MS).await;
    assert!(lease.may_write());
    assert_eq!(lease.status().renewals, 3);

    let theirs = LeaseRecord {
        holder: "intruder".into(),
        ..lease_object(&mem).await.0
    };
    mem.put(LEASE_KEY, theirs.to_json().into(), PutCondition::None)
        .await
        .unwrap();
    lease.token().cancelled().await;
    assert_eq!(Instant::now(), t0 + TTL + config("a").renew_every());
    assert_eq!(
        lease.status().state,
        LeaseState::Lost {
            reason: LostReason::TakenOver
        }
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::TakenOver);
    assert_eq!(lease_object(&mem).await.0.holder, "intruder");
    let log = log.lock().unwrap();
    assert!(
        log.iter().all(|(_, _, conditional)| !conditional),
        "a conditional request with conditional writes off: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_local_directory_in_real_time() {
    let dir = tempfile::tempdir().unwrap();
    let bucket: DynBucket = Arc::new(FsBucket::open(dir.path()).unwrap());
    let short = |holder| LeaseConfig {
        ttl: Duration::from_millis(1200),
        ..config(holder)
    };
    let c = short("a");
    let a = acquire(&bucket, c.clone()).await;
    let mut b = LeaseAcquirer::new(bucket.clone(), short("b"));
    let until = Instant::now() + 3 * c.ttl;
    let mut looks = 0;
    while Instant::now() < until {
        let (holder, seen, _) = held_elsewhere(b.try_acquire().await);
        assert_eq!(holder, "a");
        assert!(seen < c.ttl, "seen unchanged for {seen:?} while renewed");
        assert!(a.may_write());
        looks += 1;
        sleep(Duration::from_millis(50)).await;
    }
    assert!(looks >= 10, "only {looks} looks");
    assert!(a.status().renewals >= 6, "{:?}", a.status());

    drop(a);
    let crashed = Instant::now();
    let cancel = CancellationToken::new();
    let b_lease = tokio::time::timeout(10 * c.ttl, b.acquire(&cancel))
        .await
        .expect("no takeover of a dead holder's lease")
        .unwrap();
    let waited = crashed.elapsed();
    assert!(
        waited >= c.ttl / 3 && waited <= c.ttl + c.renew_every() + c.ttl,
        "took over {waited:?} after the holder died"
    );
    assert!(b_lease.may_write());
    assert_eq!(lease_object(&*bucket).await.0.holder, "b");
    assert_eq!(b_lease.release().await.unwrap(), ReleaseOutcome::Deleted);
    assert!(!dir.path().join(LEASE_KEY).exists());
    assert!(matches!(
        bucket.get(LEASE_KEY).await,
        Err(BucketError::NotFound { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn coalesced_renewals_fall_on_the_tick_grid_never_early_at_most_a_step_late() {
    let mem = MemBucket::new();
    let times = Arc::new(Mutex::new(Vec::new()));
    let seen = times.clone();
    let plan = FaultPlan::custom(move |r| {
        if (r.op, r.key) == (Op::Put, LEASE_KEY) {
            seen.lock().unwrap().push(Instant::now());
        }
        Fault::Pass
    });
    let bucket: DynBucket = Arc::new(FaultyBucket::new(Arc::new(mem.clone()), plan));
    let c = LeaseConfig {
        coalesce: true,
        ..config("a")
    };
    // Acquired off the grid.
    sleep(Duration::from_millis(37)).await;
    let lease = acquire(&bucket, c.clone()).await;
    sleep(5 * c.renew_every() + MS).await;
    assert!(lease.may_write());
    let times = times.lock().unwrap().clone();
    assert_eq!(times.len(), 6, "the acquiring write and five renewals");
    for pair in times.windows(2) {
        let (before, renewed) = (pair[0], pair[1]);
        assert_eq!(
            mushroom_backup::pacing::coalesce(renewed, c.renew_every()),
            renewed,
            "a renewal off the grid"
        );
        let gap = renewed - before;
        assert!(
            gap >= c.renew_every() && gap < c.renew_every() + mushroom_backup::pacing::MAX_GRID,
            "renewed {gap:?} after the last write"
        );
    }
}

/// `take_over_now` (a promotion): a live holder's lease is taken at once; of two takers racing,
/// exactly one write lands and the other is answered with the winner's name; the taker learns a
/// bound on the old holder's deadline from the bucket's clock, and the old holder loses the
/// lease at its next renewal. A lease under an instance lease cannot be proven: untouched.
#[tokio::test]
async fn take_over_now_takes_a_live_lease_once_and_bounds_the_old_holders_deadline() {
    use mushroom_backup::lease::TakeOver;
    let dir = tempfile::tempdir().unwrap();
    let bucket: DynBucket = Arc::new(FsBucket::open(dir.path()).unwrap());
    let short = |holder: &str| LeaseConfig {
        ttl: Duration::from_secs(2),
        ..config(holder)
    };
    let old = acquire(&bucket, short("old")).await;
    let (mut b, mut c) = (
        LeaseAcquirer::new(bucket.clone(), short("b")),
        LeaseAcquirer::new(bucket.clone(), short("c")),
    );
    let (rb, rc) = tokio::join!(b.take_over_now(), c.take_over_now());
    let record = |bucket: DynBucket| async move {
        LeaseRecord::from_json(&bucket.get(LEASE_KEY).await.unwrap().data).unwrap()
    };
    let last = record(bucket.clone()).await.holder;
    // Both read the old holder's version: one write lands, the other is refused naming it. Or
    // the second read the first taker's version (they did not overlap): it took that over, and
    // says so. Never two holders believing they took the same version.
    let mut taken = Vec::new();
    let mut refused = Vec::new();
    for r in [rb.unwrap(), rc.unwrap()] {
        match r {
            TakeOver::Taken {
                lease,
                previous,
                fenced_in,
                ..
            } => {
                assert!(fenced_in <= Duration::from_millis(2800), "{fenced_in:?}");
                taken.push((lease.status().holder, previous.unwrap().0, lease));
            }
            TakeOver::HeldElsewhere(Acquisition::HeldElsewhere { holder, .. }) => {
                refused.push(holder)
            }
            other => panic!("a taker: {other:?}"),
        }
    }
    match (taken.as_slice(), refused.as_slice()) {
        ([(winner, previous, _)], [named]) => {
            assert_eq!(previous, "old");
            assert_eq!(named, winner);
            assert_eq!(&last, winner);
        }
        ([(h1, p1, _), (h2, p2, _)], []) => {
            let (first, second) = if p1 == "old" { (h1, p2) } else { (h2, p1) };
            assert_eq!(second, first, "the second taker took the first's version");
            assert_ne!(&last, first);
        }
        other => panic!("no taker won, or two from one version: {other:?}"),
    }
    let record = record(bucket.clone()).await;
    // The old holder's next renewal (a third of a TTL) is refused: it stops writing.
    tokio::time::timeout(Duration::from_secs(2), old.token().cancelled())
        .await
        .expect("the old holder still holds a TTL after the takeover");
    assert!(!old.may_write());
    assert!(matches!(
        old.status().state,
        LeaseState::Lost {
            reason: LostReason::TakenOver
        }
    ));

    // A store lease under an instance lease: not taken, nothing written.
    let mut fenced = record.clone();
    fenced.fence = Some(mushroom_backup::lease::FenceRef {
        key: "instances/i1.lease".into(),
        holder: "h".into(),
    });
    bucket
        .put(LEASE_KEY, Body::from(fenced.to_json()), PutCondition::None)
        .await
        .unwrap();
    let before = bucket.get(LEASE_KEY).await.unwrap().etag;
    let mut d = LeaseAcquirer::new(bucket.clone(), short("d"));
    assert!(matches!(
        d.take_over_now().await.unwrap(),
        TakeOver::Unprovable(why) if why.contains("instance lease")
    ));
    assert_eq!(bucket.get(LEASE_KEY).await.unwrap().etag, before);
}

/// The acknowledgement window (`LeaseRecord::ack_window_ms`, a sync worker's promise): a
/// takeover is proven for acknowledgements in about a second whatever the TTL, for a renewing
/// lease and for one under an instance lease alike; the old holder's next confirming read
/// finds the lease taken and ends it; a holder's own confirming reads pass.
#[tokio::test]
async fn a_promised_ack_window_proves_a_takeover_in_about_a_second_at_any_ttl() {
    use mushroom_backup::lease::{ACK_WINDOW, Fenced, TakeOver};
    let dir = tempfile::tempdir().unwrap();
    let bucket: DynBucket = Arc::new(FsBucket::open(dir.path()).unwrap());
    let long = |holder: &str| LeaseConfig {
        ttl: Duration::from_secs(3600),
        ..config(holder)
    };
    let mut promising = LeaseAcquirer::new(bucket.clone(), long("old"));
    promising.promising_ack_window(Some(ACK_WINDOW));
    let old = match promising.try_acquire().await.unwrap() {
        Acquisition::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    let record = LeaseRecord::from_json(&bucket.get(LEASE_KEY).await.unwrap().data).unwrap();
    assert_eq!(record.ack_window_ms, Some(1000));
    old.handle().confirm().await.expect("its own record");

    let mut taker = LeaseAcquirer::new(bucket.clone(), long("promoter"));
    let TakeOver::Taken {
        fenced_in, proof, ..
    } = taker.take_over_now().await.unwrap()
    else {
        panic!("not taken")
    };
    assert_eq!(proof, Fenced::AckWindow);
    assert_eq!(fenced_in, Duration::from_millis(1150));
    assert!(old.may_write(), "it has not noticed yet");
    assert!(matches!(
        old.handle().confirm().await,
        Err(mushroom_backup::lease::LeaseError::Lost)
    ));
    assert!(!old.may_write());
    assert!(matches!(
        old.status().state,
        LeaseState::Lost {
            reason: LostReason::TakenOver
        }
    ));

    // A store lease under an instance lease that promises the window: taken too.
    let mut fenced = LeaseRecord::from_json(&bucket.get(LEASE_KEY).await.unwrap().data).unwrap();
    fenced.holder = "serve/1".into();
    fenced.ack_window_ms = Some(1000);
    fenced.fence = Some(mushroom_backup::lease::FenceRef {
        key: "instances/i1.lease".into(),
        holder: "serve/1".into(),
    });
    bucket
        .put(LEASE_KEY, Body::from(fenced.to_json()), PutCondition::None)
        .await
        .unwrap();
    let mut again = LeaseAcquirer::new(bucket.clone(), long("second"));
    assert!(matches!(
        again.take_over_now().await.unwrap(),
        TakeOver::Taken {
            proof: Fenced::AckWindow,
            ..
        }
    ));
    // A promise outside the trusted range (a hostile or corrupt record): not trusted, as if
    // there were none; nothing written.
    for window in [0, 99, 60_001, u64::MAX] {
        fenced.ack_window_ms = Some(window);
        assert_eq!(fenced.acks_fenced_in(), None, "{window} ms");
        bucket
            .put(LEASE_KEY, Body::from(fenced.to_json()), PutCondition::None)
            .await
            .unwrap();
        let before = bucket.get(LEASE_KEY).await.unwrap().etag;
        let mut taker = LeaseAcquirer::new(bucket.clone(), long("hostile"));
        assert!(
            matches!(
                taker.take_over_now().await.unwrap(),
                TakeOver::Unprovable(_)
            ),
            "{window} ms"
        );
        assert_eq!(bucket.get(LEASE_KEY).await.unwrap().etag, before);
    }
    // Without the promise, as before: not provable, nothing written.
    fenced.ack_window_ms = None;
    bucket
        .put(LEASE_KEY, Body::from(fenced.to_json()), PutCondition::None)
        .await
        .unwrap();
    let mut third = LeaseAcquirer::new(bucket.clone(), long("third"));
    assert!(matches!(
        third.take_over_now().await.unwrap(),
        TakeOver::Unprovable(_)
    ));
}

/// Issue 40, finding 5c: a record with this taker's holder id but another `store` is another,
/// live writer (in the service every store of an instance has the instance's holder id: the
/// replica's lease on the prefix a standby of the same instance follows). Its window is waited,
/// never nothing. Only this very holder of this very store is taken at once.
#[tokio::test]
async fn take_over_now_judges_this_holder_id_of_another_store_as_another_holder() {
    use mushroom_backup::lease::{ACK_WINDOW, Fenced, TakeOver};
    let dir = tempfile::tempdir().unwrap();
    let bucket: DynBucket = Arc::new(FsBucket::open(dir.path()).unwrap());
    let of = |store: &str| LeaseConfig {
        ttl: Duration::from_secs(3600),
        store: store.into(),
        ..config("serve/1")
    };
    let mut replica = LeaseAcquirer::new(bucket.clone(), of("b (replica)"));
    replica.promising_ack_window(Some(ACK_WINDOW));
    let live = match replica.try_acquire().await.unwrap() {
        Acquisition::Acquired(lease) => lease,
        other => panic!("{other:?}"),
    };
    let mut promoter = LeaseAcquirer::new(bucket.clone(), of("standby-of-p"));
    match promoter.take_over_now().await.unwrap() {
        TakeOver::Taken {
            previous,
            fenced_in,
            proof,
            ..
        } => {
            assert_eq!(previous.unwrap().2, "b (replica)");
            assert_eq!(
                proof,
                Fenced::AckWindow,
                "waited for nothing: {fenced_in:?}"
            );
            assert_eq!(fenced_in, Duration::from_millis(1150));
        }
        other => panic!("not taken: {other:?}"),
    }
    assert!(matches!(
        live.handle().confirm().await,
        Err(LeaseError::Lost)
    ));
    // The same holder of the same store (a restart that kept its id): at once, as before.
    let mut again = LeaseAcquirer::new(bucket.clone(), of("standby-of-p"));
    assert!(matches!(
        again.take_over_now().await.unwrap(),
        TakeOver::Taken {
            fenced_in: Duration::ZERO,
            proof: Fenced::Deadline,
            ..
        }
    ));
}

/// Issue 40, finding 8: a `serve` writes its store lease only when it acquires it and lives by
/// its instance lease, so on a long-running `serve` the store lease object is older than a TTL.
/// A taker judges the holder's deadline by the instance lease the record names: renewed, the
/// holder is live and its acknowledgement window is waited; renewed less than its deadline
/// ago, it may renew again, and the window is waited too; unrenewed past its deadline, the
/// deadline is the proof.
#[tokio::test]
async fn a_serve_holders_deadline_is_read_from_its_instance_lease_not_its_store_lease() {
    use mushroom_backup::lease::{ACK_WINDOW, FenceRef, Fenced, TakeOver};
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| -> DynBucket {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        Arc::new(FsBucket::open(&path).unwrap())
    };
    let root = open(".mushroom-backup");
    let ttl_ms = 2000;
    let instance = |id: &str, renewals: u64| LeaseRecord {
        holder: format!("{id}/nonce"),
        host: "h".into(),
        store: format!("instance {id}"),
        ttl_ms,
        renewals,
        acquired_at: String::new(),
        fence: None,
        ack_window_ms: None,
    };
    let store_lease = |id: &str| LeaseRecord {
        store: format!("store of {id}"),
        fence: Some(FenceRef {
            key: format!("instances/{id}.lease"),
            holder: format!("{id}/nonce"),
        }),
        ack_window_ms: Some(u64::try_from(ACK_WINDOW.as_millis()).unwrap()),
        ..instance(id, 0)
    };
    let (live, dead, aging) = (open("live"), open("dead"), open("aging"));
    for (id, store) in [("live", &live), ("dead", &dead), ("aging", &aging)] {
        root.put(
            &format!("instances/{id}.lease"),
            Body::from(instance(id, 0).to_json()),
            PutCondition::None,
        )
        .await
        .unwrap();
        store
            .put(
                LEASE_KEY,
                Body::from(store_lease(id).to_json()),
                PutCondition::None,
            )
            .await
            .unwrap();
    }
    // Longer than the TTL plus the bucket clock's resolution: every store lease is "old".
    // "aging" renews its instance lease 2 s before the takeover: past its TTL by this
    // process's clock, within it by the bucket's (1 s resolution), so it may still be
    // renewing; its deadline, read from that renewal, is still ahead.
    sleep(Duration::from_millis(1500)).await;
    root.put(
        "instances/aging.lease",
        Body::from(instance("aging", 1).to_json()),
        PutCondition::None,
    )
    .await
    .unwrap();
    sleep(Duration::from_millis(2000)).await;
    root.put(
        "instances/live.lease",
        Body::from(instance("live", 1).to_json()),
        PutCondition::None,
    )
    .await
    .unwrap();
    let taker = |store: &DynBucket| {
        LeaseAcquirer::new(
            store.clone(),
            LeaseConfig {
                ttl: Duration::from_millis(ttl_ms),
                ..config("promoter")
            },
        )
        .watching_fences_in(root.clone())
    };
    match taker(&live).take_over_now().await.unwrap() {
        TakeOver::Taken {
            fenced_in, proof, ..
        } => {
            assert_eq!(proof, Fenced::AckWindow, "a live holder: {fenced_in:?}");
            assert_eq!(fenced_in, Duration::from_millis(1150));
        }
        other => panic!("not taken: {other:?}"),
    }
    // Finding 8: a deadline still ahead does not stop a holder that renews its instance
    // lease (this write does not touch it): only the window fences it. Before, the deadline
    // (0.8 s away) was taken as the proof, short of the holder's window.
    match taker(&aging).take_over_now().await.unwrap() {
        TakeOver::Taken {
            fenced_in, proof, ..
        } => {
            assert_eq!(
                proof,
                Fenced::AckWindow,
                "a holder maybe renewing: {fenced_in:?}"
            );
            assert_eq!(fenced_in, Duration::from_millis(1150));
        }
        other => panic!("not taken: {other:?}"),
    }
    match taker(&dead).take_over_now().await.unwrap() {
        TakeOver::Taken {
            fenced_in, proof, ..
        } => {
            assert_eq!(proof, Fenced::Deadline, "{fenced_in:?}");
            assert_eq!(fenced_in, Duration::ZERO, "a deadline that truly passed");
        }
        other => panic!("not taken: {other:?}"),
    }
}
