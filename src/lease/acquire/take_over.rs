//! [`LeaseAcquirer::take_over_now`]: a promotion takes the lease from a live holder at once,
//! and learns when that holder has certainly stopped writing (`mushroom-backup promote`,
//! `standby::promote`).
//!
//! # The rule
//! Read the lease object (its ETag, its record, its age by the bucket's own clock); write this
//! holder's record `If-Match` that ETag. Of two takers (or a taker and the holder's renewal)
//! exactly one write lands; the other is answered [`TakeOver::HeldElsewhere`], naming the
//! record that won. Taking the object does not stop the old holder by itself: it stops at its
//! next renewal (refused: [`super::super::LostReason::TakenOver`]) or, if that never reaches
//! the bucket, at its deadline, the start of its last successful renewal plus its TTL minus a
//! tenth. Its last renewal is the version read, written no later than the bucket's
//! `Last-Modified`, so the deadline is at most `ttl − ttl/10 + BUCKET_CLOCK_RESOLUTION − age`
//! after the read: [`TakeOver::Taken::fenced_in`]. A holder under an instance lease (a
//! `serve`) writes its store lease only when it acquires it, and lives by its instance lease
//! ([`crate::lease::LeaseRecord::fence`]): its deadline is read from *that* object's age (the
//! instance lease it names, while it still names that holder), never from the store lease's,
//! which on a long-running `serve` is far older than a TTL. When the instance lease cannot be
//! read so (missing, another holder, no age), no deadline is proven and only the window below
//! is waited. A deadline read from the instance lease proves something only once it has
//! passed: the takeover does not stop the holder's instance renewals, so a deadline still
//! ahead moves on with the next one, and only the window fences a holder that is still
//! renewing. So the proof is [`Fenced::Deadline`] for such a holder only when its deadline
//! truly passed (`fenced_in` zero).
//!
//! Only this very holder *of this very store* (a restart that kept its holder id) is taken at
//! once: in the service every store of an instance has the instance's holder id, so a record
//! with this holder id and another `store` (a replica's lease on a prefix a standby of the
//! same instance follows) is another, live writer, judged as any other holder.
//!
//! That is the proof; where it cannot be made, the answer says so and nothing is written:
//! - the bucket gave no age (no `Date`/`Last-Modified`): [`TakeOver::Unprovable`];
//! - the holder's record names a fence (an instance lease, `serve`) and promises no window
//!   (below): such a holder never
//!   rewrites its store lease, so it would not see the takeover until a conditional write of
//!   its own is refused; its deadline follows its instance lease, not this object:
//!   [`TakeOver::Unprovable`] (the caller waits for the lease to go stale instead);
//! - conditional writes are off: [`TakeOver::Unprovable`] (no compare-and-swap to race on).
//!
//! # The acknowledgement window: a proof in about a second
//! A holder whose record promises a window ([`crate::lease::LeaseRecord::ack_window_ms`], a
//! worker in `durability = sync`, either kind of lease) publishes a durable position only
//! within that window of the *start* of a read of the lease object that found its own record
//! ([`crate::lease::LeaseHandle::confirm`]). A read that started before this write landed and
//! still saw the old record ended, for the holder, at most a window before its last
//! publication; so past `window + window/10 + 50 ms` after this answer (a tenth for the two
//! clocks' rates), nothing more is published, and every position it published rests on
//! objects whose PUT had been answered before: a LIST started then sees them (S3 is strongly
//! consistent). That is [`Fenced::AckWindow`]: it fences what the holder *acknowledged*, not
//! what it *writes*, in about a second at any TTL, and also for a `serve`'s store lease under
//! an instance lease. The holder notices at its next confirming read (half a window while it
//! acknowledges), renewal or conditional write, and stops. A caller that needs every write
//! stopped (not only acknowledgements) uses the deadline: a promotion needs only the
//! acknowledgements, because its claim of LATEST (`standby::promote`) keeps anything later out
//! of the prefix's history.
//!
//! Under an instance lease (an acquirer [`LeaseAcquirer::fenced`], the service), the takeover
//! holds the fence first and writes a record naming it, as an acquisition does.
//!
//! # What a crash leaves
//! The lease object naming this process (taken or not): it goes stale within its TTL.

use std::time::Duration;

use super::{Acquisition, LeaseAcquirer};
use crate::bucket::{BucketError, PutCondition};
use crate::lease::instance::FenceHold;
use crate::lease::{BUCKET_CLOCK_RESOLUTION, BucketLease, FenceRef, LeaseError, LeaseRecord};

/// What the wait of [`TakeOver::Taken::fenced_in`] proves about the old holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Its deadline has passed: it writes nothing more (bar a request already on its way).
    Deadline,
    /// Its acknowledgement window has passed ([`crate::lease::LeaseRecord::ack_window_ms`]):
    /// it publishes no durable position more, but may still write until it notices (its next
    /// confirming read, renewal or conditional write): what it ships meanwhile is past what the
    /// taker reads, and a promotion's claim of LATEST keeps it out of the prefix's history.
    AckWindow,
}

/// How [`LeaseAcquirer::take_over_now`] ended.
#[derive(Debug)]
pub enum TakeOver {
    /// This process holds the lease; the previous holder (if any) has stopped writing within
    /// `fenced_in` of the answer.
    Taken {
        lease: BucketLease,
        /// The previous record's holder, host and store, when there was one.
        previous: Option<(String, String, String)>,
        fenced_in: Duration,
        /// What `fenced_in` proves.
        proof: Fenced,
    },
    /// Someone else's write landed first: that holder is named.
    HeldElsewhere(Acquisition),
    /// The holder cannot be proven stopped from the lease object: why.
    Unprovable(String),
}

impl LeaseAcquirer {
    /// Takes the lease at once, whoever holds it; see the module docs.
    pub async fn take_over_now(&mut self) -> Result<TakeOver, LeaseError> {
        if !self.config.conditional {
            return Ok(TakeOver::Unprovable(
                "conditional writes are off (MUSHROOMDB_BACKUP_LEASE_CONDITIONAL=off): two \
                 takers could both believe they won"
                    .into(),
            ));
        }
        let fence = match &self.fence {
            None => None,
            Some(f) => match f.hold().await? {
                FenceHold::Held(handle) => Some(handle),
                FenceHold::Elsewhere(answer) => return Ok(TakeOver::HeldElsewhere(answer)),
            },
        };
        let me = match &self.fence {
            Some(f) => f.holder().to_string(),
            None => self.config.holder.clone(),
        };
        let object = match self.bucket.get(&self.key).await {
            Ok(object) => object,
            Err(BucketError::NotFound { .. }) => return self.take_absent().await,
            Err(e) => return Err(e.into()),
        };
        let record = LeaseRecord::from_json(&object.data).ok();
        // A holder that promises an acknowledgement window publishes nothing durable past it
        // once this write has landed, whatever kind of lease it holds.
        let window = record.as_ref().and_then(LeaseRecord::acks_fenced_in);
        let held = match Held::judge(record.as_ref(), window, self.config.ttl) {
            Ok(held) => held,
            Err(why) => return Ok(TakeOver::Unprovable(why)),
        };
        // This very holder of this very store (a restart that kept its holder id): nothing to
        // wait for. The holder id alone proves nothing: in the service every store of an
        // instance has the instance's holder id, so another store's lease (a replica's, say)
        // with this holder id is another, live writer.
        let same_holder = held
            .previous
            .as_ref()
            .is_some_and(|(h, _, s)| *h == me && *s == self.config.store);
        let named = record
            .as_ref()
            .and_then(|r| r.fence.as_ref())
            .filter(|f| f.is_plausible());
        let under_instance_lease = record.as_ref().is_some_and(|r| r.fence.is_some());
        let (ttl, age) = if same_holder {
            (held.ttl, Some(Duration::ZERO))
        } else {
            let written_age = object.age.or(window.map(|_| Duration::ZERO));
            self.holder_age(held.ttl, named, under_instance_lease, written_age)
                .await?
        };
        let bounded_by_deadline = same_holder || named.is_none();
        let (fenced_in, proof) = match fenced_in(same_holder, bounded_by_deadline, ttl, age, window)
        {
            Ok(fenced) => fenced,
            Err(why) => return Ok(TakeOver::Unprovable(why)),
        };
        let new = self.record(&me, held.renewals);
        match self
            .write(
                new,
                PutCondition::IfMatch(object.etag.clone()),
                fence.as_ref(),
            )
            .await?
        {
            Some(lease) => Ok(TakeOver::Taken {
                lease,
                previous: held.previous,
                fenced_in,
                proof,
            }),
            None => self.lost_race().await,
        }
    }

    /// No lease object: acquired as any acquisition, with nothing to wait for.
    async fn take_absent(&mut self) -> Result<TakeOver, LeaseError> {
        match self.try_acquire().await? {
            Acquisition::Acquired(lease) => Ok(TakeOver::Taken {
                lease,
                previous: None,
                fenced_in: Duration::ZERO,
                proof: Fenced::Deadline,
            }),
            other => Ok(TakeOver::HeldElsewhere(other)),
        }
    }

    /// The TTL to judge another holder by, and how long ago it last renewed what keeps it
    /// alive, by the bucket's clock (`None`: not known). A holder under an instance lease (a
    /// `serve`) never rewrites its store lease: its age says nothing, and the instance lease
    /// it names is read instead. Nothing readable there: no deadline is proven, and only the
    /// window is waited. Otherwise the lease object's age (`written_age`) is the holder's.
    async fn holder_age(
        &mut self,
        ttl: Duration,
        named: Option<&FenceRef>,
        under_instance_lease: bool,
        written_age: Option<Duration>,
    ) -> Result<(Duration, Option<Duration>), LeaseError> {
        Ok(match named {
            Some(f) => {
                let url = self.bucket.url();
                match self.watch.renewed_ago(&url, f).await? {
                    Some((age, fence_ttl)) => (ttl.max(fence_ttl), Some(age)),
                    None => (ttl, None),
                }
            }
            None if under_instance_lease => (ttl, None),
            // Written no later than now: the deadline is at most a TTL away.
            None => (ttl, written_age),
        })
    }

    /// The take-over's write lost: another taker (or the holder's renewal) landed first. Names
    /// what is there.
    async fn lost_race(&mut self) -> Result<TakeOver, LeaseError> {
        let (holder, host, store) = match self.bucket.get(&self.key).await {
            Ok(o) => match LeaseRecord::from_json(&o.data) {
                Ok(r) => (r.holder, r.host, r.store),
                Err(_) => ("?".into(), "?".into(), "?".into()),
            },
            Err(BucketError::NotFound { .. }) => {
                ("(released meanwhile)".into(), "?".into(), "?".into())
            }
            Err(e) => return Err(e.into()),
        };
        Ok(TakeOver::HeldElsewhere(Acquisition::HeldElsewhere {
            holder,
            host,
            store,
            seen_unchanged_for: Duration::ZERO,
            retry_in: self.config.renew_every(),
        }))
    }
}

/// The lease record being taken over, as judged: the TTL its holder runs by, the renewals
/// the new record continues from, and its holder, host and store.
struct Held {
    ttl: Duration,
    renewals: u64,
    previous: Option<(String, String, String)>,
}

impl Held {
    /// Judges the record (`None`: unreadable, judged by this acquirer's `ttl`, as
    /// `try_acquire` judges it). A holder under an instance lease without an acknowledgement
    /// `window` cannot be proven stopped: `Err` says why.
    fn judge(
        record: Option<&LeaseRecord>,
        window: Option<Duration>,
        ttl: Duration,
    ) -> Result<Held, String> {
        let Some(r) = record else {
            return Ok(Held {
                ttl,
                renewals: 0,
                previous: None,
            });
        };
        if r.fence.is_some() && window.is_none() {
            return Err(format!(
                "the lease is held by {} on {} (store {}) under an instance lease (a \
                 `serve`), which does not see its store lease taken until a write of its \
                 own is refused",
                r.holder, r.host, r.store
            ));
        }
        Ok(Held {
            ttl: r.ttl(),
            renewals: r.next_renewals(),
            previous: Some((r.holder.clone(), r.host.clone(), r.store.clone())),
        })
    }
}

/// How long after the write the old holder has stopped writing, and what that wait proves:
/// nothing for the same holder, else the sooner of its deadline (a TTL less a tenth after its
/// last renewal, `age` ago) and its acknowledgement `window`. A holder under an instance lease
/// renews that object, not this one, and this write does not stop those renewals: unless
/// `bounded_by_deadline`, a deadline still ahead is no bound (the holder renews again and
/// writes on until it notices). Only one already past proves it stopped; otherwise its
/// acknowledgement window is what fences it (security review 4, finding 8: with a TTL of 2 s
/// an instance lease renewed 1.7 s before was taken as a proof after 1.1 s, short of the
/// window of a live holder). Neither known: `Err` says why.
fn fenced_in(
    same_holder: bool,
    bounded_by_deadline: bool,
    ttl: Duration,
    age: Option<Duration>,
    window: Option<Duration>,
) -> Result<(Duration, Fenced), String> {
    if same_holder {
        return Ok((Duration::ZERO, Fenced::Deadline));
    }
    let by_deadline = age.map(|age| (ttl - ttl / 10 + BUCKET_CLOCK_RESOLUTION).saturating_sub(age));
    let by_deadline = if bounded_by_deadline {
        by_deadline
    } else {
        by_deadline.filter(|d| d.is_zero())
    };
    match (window, by_deadline) {
        (Some(w), Some(d)) if d <= w => Ok((d, Fenced::Deadline)),
        (Some(w), _) => Ok((w, Fenced::AckWindow)),
        (None, Some(d)) => Ok((d, Fenced::Deadline)),
        (None, None) => Err(
            "the bucket does not say when the lease object was written (no Date \
             or Last-Modified): its holder's deadline cannot be read from the \
             bucket's clock"
                .into(),
        ),
    }
}
