//! [`BucketLease`]: which process may write to a prefix.
//!
//! One object, `lease` ([`crate::manifest::LEASE_KEY`]) under the prefix, says who holds the
//! prefix: a JSON [`LeaseRecord`] `{holder, host, store, ttl_ms, renewals, acquired_at}`, plus
//! `fence` under an instance lease and `ack_window_ms` for a holder that promises an
//! acknowledgement window ([`ACK_WINDOW`], a sync worker: see
//! [`LeaseAcquirer::take_over_now`] and `worker/ack/mod.rs`; a deviation from DESIGN.md
//! section 7, which has no such field).
//! `holder` is a random id per process and worker ([`LeaseConfig::new`]); `renewals` goes up on
//! every write of the object, so its content, and so its ETag, changes with every renewal.
//!
//! # Acquiring
//! Through a [`LeaseAcquirer`], which remembers what this process has seen across attempts:
//! - no lease object: create it with `If-None-Match: *`;
//! - a lease object: read it (GET, with its ETag). Take it over (PUT `If-Match` that ETag) only
//!   when this process has seen that very ETag unchanged for a whole TTL on its own monotonic
//!   clock ([`tokio::time::Instant`]), or at once when its holder is this same holder id (a
//!   restart that kept its id). Nothing in the content is trusted as a time: not
//!   `acquired_at`, not another host's clock. The TTL waited is the longer of ours and the
//!   record's `ttl_ms` (so a holder configured with a longer TTL is not cut short), at most
//!   [`MAX_TTL`]. Or at once when the bucket's own clock shows it unwritten for that long
//!   ([`crate::bucket::Object::age`]: the response's `Date` minus its `Last-Modified`, plus
//!   [`BUCKET_CLOCK_RESOLUTION`]): that is one clock, the bucket's, judging its own stamps, so
//!   a successor that just started (a restart, a failover) need not watch for a TTL first.
//!   The holder's deadline runs from the *start* of its last write, before the stamp, so it
//!   has stopped writing by then.
//! - otherwise, or when a conditional write answers 412 (someone else won the race), the answer
//!   is [`Acquisition::HeldElsewhere`], naming the holder and saying when to look again: a third
//!   of a TTL, or sooner when the observed TTL runs out before. So a successor waiting on a
//!   holder that died takes over within a TTL and a third of its death.
//!
//! # Holding
//! A task owned by the [`BucketLease`] renews it every third of a TTL with `If-Match` on the ETag
//! it last wrote (rounded up onto the process's tick grid, [`LeaseConfig::coalesce`], so a fleet's
//! thousand renewals do not each wake the process); a failed renewal is retried after
//! [`RENEW_RETRY`] (at most the renewal interval). [`BucketLease::may_write`] holds only until the
//! *start* of the last successful renewal (or of the acquiring write) plus the TTL minus a margin
//! of a tenth of the TTL. A successor's clock for that ETag cannot start before the write landed,
//! which is after it started, so this holder stops writing at least a margin before any successor
//! may start; the margin absorbs the two clocks running at slightly different rates. The lease
//! stops holding, for good, when that deadline passes (renewals kept failing), when a renewal
//! answers 412 (the object was taken over or deleted), or on [`BucketLease::release`]. At that
//! moment [`BucketLease::token`] is cancelled (a timer, not polling), and every future run through
//! [`BucketLease::guard`] is dropped — a request in flight is cancelled — and returns
//! [`LeaseError::Lost`]. A lease that stopped holding is never held again: acquire anew, and start
//! from the bucket's state afresh.
//!
//! A renewal whose answer was lost (an indeterminate failure) may have landed: the next attempt
//! writes the same content, and if it is refused (412) and the object holds exactly that
//! content, the earlier attempt took effect and counts from its start.
//!
//! # What the lease does NOT guarantee
//! It is advisory. A process paused for longer than the margin — a GC pause, `SIGSTOP`, a VM
//! frozen and resumed, a request stuck in a kernel buffer — can wake after its deadline with a
//! write already on its way, while a successor holds the lease. The lease makes such overlaps
//! rare; it cannot make them impossible. The fence that keeps a stale writer from corrupting
//! restore points is the conditional writes on `GENERATION`, manifests and `LATEST` (see
//! [`crate::worker`]): a writer whose view of the bucket is stale is refused there, whatever it
//! believes about the lease.
//!
//! With `conditional: false` (`MUSHROOMDB_BACKUP_LEASE_CONDITIONAL=off`, object stores without
//! conditional PUT) every write of the lease object is plain. Acquisition is best effort: read,
//! and write only when the object is absent or was observed unchanged for a TTL; two processes
//! starting at once can both believe they hold it. A renewal reads the object first and gives
//! up the lease when it is not the one this holder last wrote (a GET and a PUT per renewal).
//! [`LeaseStatus::conditional`] (and [`BucketLease::is_conditional`]) say which mode a lease is
//! in; health's `conditional_writes` is taken from the configuration the worker was spawned
//! with (the lease's and the worker's setting together), not from here.
//!
//! # Timings (TTL = 30 s by default, [`TTL_ENV`])
//! - renewal every TTL/3 (10 s); a failed one again after [`RENEW_RETRY`] (1 s);
//! - `may_write` ends TTL − TTL/10 (27 s) after the last successful renewal's start;
//! - takeover after a TTL of observed staleness; looking again every TTL/3.
//!
//! # Under an instance lease
//! In the service, a store's lease object is not renewed: it names (in [`LeaseRecord::fence`])
//! the instance lease of its lease root, one object renewed for every store of the process
//! there, and holds while that does. See [`instance`] for how that keeps every guarantee above
//! at no request per idle store; the standalone `backup` command keeps a renewing lease of its
//! own. Either kind of acquirer judges either kind of lease object it finds.
//!
//! # What a crash leaves
//! A lease object naming the dead holder. A successor takes it over once it has seen it
//! unchanged for a TTL (a restart that keeps its holder id, at once). A clean shutdown
//! ([`BucketLease::release`]) stops renewing and deletes the object with `If-Match`, so a
//! successor acquires at once. Dropping a `BucketLease` without releasing it stops the renewals
//! and leaves the object, exactly like a crash.

use std::time::Duration;

use crate::bucket::BucketError;

mod acquire;
mod fence_watch;
mod holding;
pub mod instance;

pub use acquire::{Acquisition, Attempt, Fenced, LeaseAcquirer, TakeOver};
pub use holding::{BucketLease, LeaseHandle};
pub use instance::{Fence, InstanceLeaseConfig, InstanceLeases};

/// The default TTL of a lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The shortest TTL accepted from the environment.
pub const MIN_TTL: Duration = Duration::from_millis(30);
/// The longest TTL accepted, from the environment or from a lease object's `ttl_ms`.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// How coarse a bucket's clock may be ([`crate::bucket::Object::age`]: S3's `Date` and
/// `Last-Modified` are to the second): an age counts as a TTL only when it is a TTL and this.
pub const BUCKET_CLOCK_RESOLUTION: Duration = Duration::from_secs(1);

/// Whether an object of age `age` by the bucket's own clock has gone unwritten for `wait`.
pub(crate) fn stale_by_bucket_clock(age: Option<Duration>, wait: Duration) -> bool {
    age.is_some_and(|age| age >= wait + BUCKET_CLOCK_RESOLUTION)
}

/// How long after the start of a confirming read of its lease a holder that promises it
/// ([`LeaseRecord::ack_window_ms`]: a worker in `durability = sync`) may still publish a durable
/// position: the time a promotion waits after taking the lease before it reads what was
/// acknowledged. Confirmations run in the gap after an acknowledgement, one at most every half
/// window while commits are acknowledged, none while the store is idle
/// (`worker/ack/window.rs`).
pub const ACK_WINDOW: Duration = Duration::from_secs(1);
/// The longest [`LeaseRecord::ack_window_ms`] a taker trusts: past it, it waits for the
/// holder's deadline instead.
pub const MAX_ACK_WINDOW: Duration = Duration::from_secs(60);
/// The shortest [`LeaseRecord::ack_window_ms`] a taker trusts. A record is read from the
/// bucket: one that promised 0 ms would cut a promotion's wait to the 50 ms of slack, so a
/// window below this one is not trusted either (the taker waits for the deadline). Our
/// writers promise [`ACK_WINDOW`].
pub const MIN_ACK_WINDOW: Duration = Duration::from_millis(100);

/// Retry delay after a failed lease renewal (capped at the renewal interval).
pub const RENEW_RETRY: Duration = Duration::from_secs(1);
/// The variable holding the TTL in milliseconds.
pub const TTL_ENV: &str = "MUSHROOMDB_BACKUP_LEASE_TTL_MS";
/// The variable turning conditional writes `on` (default) or `off`.
pub const CONDITIONAL_ENV: &str = "MUSHROOMDB_BACKUP_LEASE_CONDITIONAL";

/// Who takes the lease, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease lives without renewal.
    pub ttl: Duration,
    /// This process's (and worker's) random id; a lease object naming it is ours.
    pub holder: String,
    /// The host name, for operators reading the lease object or health.
    pub host: String,
    /// The store the lease is for, likewise.
    pub store: String,
    /// Whether the bucket has conditional writes (`If-None-Match`, `If-Match`).
    pub conditional: bool,
    /// Whether renewals are rounded up onto the process-wide tick grid ([`crate::pacing`]), so
    /// that a fleet's renewals share the runtime's wake-ups with its ticks (and come at most a
    /// grid step, 100 ms, late). `false`: exactly every [`LeaseConfig::renew_every`].
    pub coalesce: bool,
}

impl LeaseConfig {
    /// The defaults for `store`: a fresh random holder id, this host's name, [`DEFAULT_TTL`],
    /// conditional writes.
    pub fn new(store: impl Into<String>) -> Self {
        LeaseConfig {
            ttl: DEFAULT_TTL,
            holder: uuid::Uuid::new_v4().simple().to_string(),
            host: host_name(),
            store: store.into(),
            conditional: true,
            coalesce: true,
        }
    }

    /// [`LeaseConfig::new`] with the TTL from [`TTL_ENV`] and conditional writes from
    /// [`CONDITIONAL_ENV`], when set.
    pub fn from_env(store: impl Into<String>) -> Result<Self, LeaseError> {
        Self::from_vars(store, |name| std::env::var(name).ok())
    }

    /// [`LeaseConfig::from_env`] with the variables read by `var`.
    pub fn from_vars(
        store: impl Into<String>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, LeaseError> {
        let mut config = Self::new(store);
        if let Some(value) = var(TTL_ENV) {
            let bad = |reason: String| LeaseError::BadSetting {
                var: TTL_ENV,
                value: value.clone(),
                reason,
            };
            let ms: u64 = value
                .trim()
                .parse()
                .map_err(|e| bad(format!("not a number of milliseconds: {e}")))?;
            let ttl = Duration::from_millis(ms);
            if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
                return Err(bad(format!(
                    "the TTL must be between {} and {} ms",
                    MIN_TTL.as_millis(),
                    MAX_TTL.as_millis()
                )));
            }
            config.ttl = ttl;
        }
        if let Some(value) = var(CONDITIONAL_ENV) {
            config.conditional = match value.trim() {
                "on" => true,
                "off" => false,
                _ => {
                    return Err(LeaseError::BadSetting {
                        var: CONDITIONAL_ENV,
                        value,
                        reason: "must be `on` or `off`".into(),
                    });
                }
            };
        }
        Ok(config)
    }

    /// How often the lease is renewed: a third of the TTL.
    pub fn renew_every(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(1))
    }

    /// When the renewal due at `due` runs: `due`, or (with [`LeaseConfig::coalesce`]) the next
    /// instant of the process-wide grid for ticks of [`LeaseConfig::renew_every`]; never earlier.
    pub fn renewal_at(&self, due: tokio::time::Instant) -> tokio::time::Instant {
        if self.coalesce {
            crate::pacing::coalesce(due, self.renew_every())
        } else {
            due
        }
    }

    /// The delay before retrying a failed renewal: [`RENEW_RETRY`], at most the interval.
    pub fn renew_retry(&self) -> Duration {
        RENEW_RETRY.min(self.renew_every())
    }

    /// How long before the TTL runs out `may_write` stops holding: a tenth of the TTL.
    pub fn margin(&self) -> Duration {
        self.ttl / 10
    }

    /// How long after the start of a successful write of the lease `may_write` holds.
    pub fn may_write_for(&self) -> Duration {
        self.ttl - self.margin()
    }
}

/// The content of the lease object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseRecord {
    pub holder: String,
    pub host: String,
    pub store: String,
    pub ttl_ms: u64,
    /// Goes up by one on every write of the object (a takeover continues from the record it
    /// replaces), so every write has new content and a new ETag.
    pub renewals: u64,
    /// When the holder acquired it, by the holder's wall clock: for people, never for timing.
    pub acquired_at: String,
    /// For a store lease under an instance lease ([`instance`]): the instance lease that
    /// fences it. Such a store lease is not renewed; it holds while that lease does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceRef>,
    /// The holder's promise about its durable acknowledgements ([`ACK_WINDOW`]): it publishes
    /// a durable position only within this many milliseconds of the start of a read of this
    /// object that found it still its own ([`LeaseHandle::confirm`]). So once a taker's write
    /// of the object has landed, the holder publishes nothing more after this window (plus a
    /// tenth for the two clocks' rates): the promotion's fence for acknowledged commits
    /// ([`TakeOver::Taken`]). Absent: no such promise (a holder in `durability = async`, an
    /// older binary); a taker then waits for the holder's deadline, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_window_ms: Option<u64>,
}

/// The instance lease a store lease names ([`LeaseRecord::fence`]): its key under the lease
/// root of the store's destination ([`instance::lease_root`]) and the holder that must be
/// renewing it for the store lease to hold.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FenceRef {
    pub key: String,
    pub holder: String,
}

impl FenceRef {
    /// Whether the key is one this process would ever write: `instances/<name>.lease`, the
    /// name made of [`instance::key_for`]'s characters. A store lease object is read from the
    /// bucket; whatever else it names is not looked at.
    pub fn is_plausible(&self) -> bool {
        self.key
            .strip_prefix(instance::INSTANCES_PREFIX)
            .and_then(|k| k.strip_suffix(".lease"))
            .is_some_and(|name| {
                !name.is_empty()
                    && name.len() <= 200
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.%".contains(&b))
                    && !name.starts_with('.')
            })
    }
}

impl LeaseRecord {
    fn new(config: &LeaseConfig, renewals: u64) -> Self {
        let acquired_at = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        LeaseRecord {
            holder: config.holder.clone(),
            host: config.host.clone(),
            store: config.store.clone(),
            ttl_ms: config.ttl.as_millis().try_into().unwrap_or(u64::MAX),
            renewals,
            acquired_at,
            fence: None,
            ack_window_ms: None,
        }
    }

    /// Parses a lease object.
    pub fn from_json(data: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(data)
    }

    /// The object's bytes.
    pub fn to_json(&self) -> bytes::Bytes {
        serde_json::to_vec(self)
            .expect("a lease record serializes")
            .into()
    }

    /// `renewals` of the record that replaces this one. Wraps at `u64::MAX` (the object is
    /// read from the bucket: any value may be there): only that the content changes matters.
    pub fn next_renewals(&self) -> u64 {
        self.renewals.wrapping_add(1)
    }

    /// The record's TTL, within [`MAX_TTL`].
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms).min(MAX_TTL)
    }

    /// How long after a takeover of this record the holder has certainly published its last
    /// durable position: its window plus a tenth plus 50 ms ([`LeaseRecord::ack_window_ms`]);
    /// `None` when it promises no window, or one outside [`MIN_ACK_WINDOW`] ..=
    /// [`MAX_ACK_WINDOW`].
    pub fn acks_fenced_in(&self) -> Option<Duration> {
        let w = Duration::from_millis(self.ack_window_ms?);
        (MIN_ACK_WINDOW..=MAX_ACK_WINDOW)
            .contains(&w)
            .then(|| w + w / 10 + Duration::from_millis(50))
    }
}

/// What went wrong with the lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The lease does not hold: lost, past its deadline, or released.
    #[error("the bucket lease does not hold (lost, past its deadline, or released)")]
    Lost,
    #[error("bucket lease: {0}")]
    Bucket(#[from] BucketError),
    #[error("{var}={value:?}: {reason}")]
    BadSetting {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// The lease object kept appearing and vanishing under this acquirer's writes.
    #[error("lost the race for the lease object {rounds} times in a row")]
    Contended { rounds: u32 },
    #[error("cancelled while waiting for the bucket lease")]
    Cancelled,
    /// The lease root a store lease's fence lives in cannot be read.
    #[error("the lease root {url} cannot be read: {reason}")]
    FenceRoot { url: String, reason: String },
}

/// Where a lease stands, for health.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// This process holds it: `may_write` holds.
    Holding,
    /// Another holder has it (from [`Acquisition::HeldElsewhere`]).
    HeldElsewhere {
        holder: String,
        host: String,
        store: String,
    },
    /// It stopped holding and will not hold again.
    Lost { reason: LostReason },
    /// Released (or dropped) by this process.
    Released,
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// A renewal found the object replaced or deleted by someone else.
    TakenOver,
    /// Renewals failed until the deadline passed.
    Expired,
    /// The instance lease that fenced this store lease stopped holding ([`instance`]).
    InstanceLeaseEnded,
}

/// A snapshot of a lease, for health.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LeaseStatus {
    pub state: LeaseState,
    /// This process's holder id, host and store.
    pub holder: String,
    pub host: String,
    pub store: String,
    pub ttl: Duration,
    /// Whether the lease is written with conditional writes; `false` is best effort.
    pub conditional: bool,
    /// Successful renewals since it was acquired.
    pub renewals: u64,
    /// The error of the latest renewal attempt, while renewals are failing (`None` once one
    /// succeeds).
    pub last_renewal_error: Option<String>,
}

/// How [`BucketLease::release`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease object was ours and is deleted: a successor acquires at once.
    Deleted,
    /// The object was no longer ours (taken over, or deleted by someone else): left alone.
    TakenOver,
}

/// This host's name, or `unknown`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match (rc, std::str::from_utf8(&buf[..len])) {
        (0, Ok(name)) if !name.is_empty() => name.to_string(),
        _ => "unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn config_from_vars() {
        let c = LeaseConfig::from_vars("s1", vars(&[])).unwrap();
        assert_eq!(
            (c.ttl, c.conditional, c.store.as_str()),
            (DEFAULT_TTL, true, "s1")
        );
        assert_eq!(c.holder.len(), 32);
        assert_ne!(c.holder, LeaseConfig::new("s1").holder, "holder ids repeat");
        assert!(!c.host.is_empty());

        let c = LeaseConfig::from_vars("s", vars(&[(TTL_ENV, "900"), (CONDITIONAL_ENV, "off")]))
            .unwrap();
        assert_eq!((c.ttl, c.conditional), (Duration::from_millis(900), false));

        for (var, value) in [
            (TTL_ENV, "soon"),
            (TTL_ENV, "0"),
            (TTL_ENV, "29"),
            (TTL_ENV, "3600001"),
            (CONDITIONAL_ENV, "yes"),
        ] {
            let r = LeaseConfig::from_vars("s", vars(&[(var, value)]));
            assert!(
                matches!(r, Err(LeaseError::BadSetting { var: v, .. }) if v == var),
                "{var}={value}: {r:?}"
            );
        }
    }

    #[test]
    fn timings() {
        let c = LeaseConfig::new("s");
        assert_eq!(c.renew_every(), Duration::from_secs(10));
        assert_eq!(c.renew_retry(), RENEW_RETRY);
        assert_eq!(c.margin(), Duration::from_secs(3));
        assert_eq!(c.may_write_for(), Duration::from_secs(27));
        let short = LeaseConfig {
            ttl: Duration::from_millis(300),
            ..c
        };
        assert_eq!(
            short.renew_retry(),
            Duration::from_millis(100),
            "not capped"
        );
    }

    #[test]
    fn record_round_trips_with_the_documented_fields() {
        let r = LeaseRecord::new(&LeaseConfig::new("store-7"), 5);
        let json: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        let mut fields: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "acquired_at",
                "holder",
                "host",
                "renewals",
                "store",
                "ttl_ms"
            ]
        );
        assert_eq!(json["ttl_ms"], 30_000);
        assert_eq!(LeaseRecord::from_json(&r.to_json()).unwrap(), r);
        let huge = LeaseRecord {
            ttl_ms: u64::MAX,
            ..r
        };
        assert_eq!(huge.ttl(), MAX_TTL);
    }
}
