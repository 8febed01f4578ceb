//! [`WriteOnce`]: the bucket as a writer of a write-once prefix sees it (issue 29; the layout
//! is in `src/latest.rs`). Every object it writes is created once, under S3 Object Lock, and
//! nothing it holds is rewritten or deleted:
//!
//! - A write (other than the lease's, hinted [`PutHint::FrequentRewrite`]) must be a create
//!   (`If-None-Match: *`); a plain or `If-Match` write is refused here, before any request,
//!   as a [`BucketError::Permanent`] naming the key. It goes up with an Object Lock retention
//!   ([`Retention`]: the configured [`LockMode`], retained until now plus the configured
//!   period by this host's clock), so the bucket itself refuses to delete or overwrite the
//!   version before that date, whoever asks.
//! - A delete without `If-Match` is refused likewise. A conditional delete passes: the only
//!   one a writer makes is the lease's release, and the lease object is the one key of a
//!   write-once prefix that is rewritten (the IAM policy in `deploy/` allows `DeleteObject` on
//!   it alone; it holds no data, and its versions expire by the lifecycle rule).
//! - Reads pass through untouched.
//! - [`Bucket::put_retention`] means here "hold this object at least until `retain.until_ms`"
//!   (what a restore point that reuses an object asks, item 2 of issue 29): it sends nothing
//!   when the object's retain-until is known to be late enough, and otherwise extends the lock
//!   to a full period from now (one `PutObjectRetention`), after a HEAD when this process
//!   never wrote or extended the object (a restart, another writer's object). It only ever
//!   extends: a date is set only when the one there is earlier. What this writer created or
//!   extended is remembered in memory (key and date; forgotten two [`CLOCK_SLACK`]s after it
//!   stopped being late enough to skip, so a long run holds only what it still reuses), so a
//!   restore point costs a request per reused object about once per [`CLOCK_SLACK`], and
//!   nothing otherwise. A create's retention is the one asked for ([`PutOpts::retain`]: the
//!   worker gives its manifest the date it holds the reused objects to), else a period from now.
//!
//! A backend that cannot lock an object (a local directory, memory) refuses a write that asks
//! for a retention ([`PutOpts::retain`]) with a `Permanent` error: there is no emulation, a
//! write-once prefix lives in an S3 bucket with Object Lock enabled.
//!
//! Nothing on disk: a crash leaves only what the requests sent before it did. The dates held in
//! memory are a cache; a new process starts without them and pays a HEAD per reused object
//! once.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part,
    PutCondition, PutHint, PutOpts,
};

/// The S3 Object Lock retention modes (`x-amz-object-lock-mode`); `governance` or
/// `compliance` as the flag, the TOML key and the registry row write it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LockMode {
    /// A user with `s3:BypassGovernanceRetention` may still shorten or lift the retention.
    Governance,
    /// No one, the account's root user included, may shorten it or delete the version early.
    Compliance,
}

impl LockMode {
    /// `governance` or `compliance`, as the flag, the TOML key and the registry write it.
    pub fn parse(s: &str) -> Result<LockMode, String> {
        match s {
            "governance" => Ok(LockMode::Governance),
            "compliance" => Ok(LockMode::Compliance),
            other => Err(format!(
                "object lock mode {other:?}: must be \"governance\" or \"compliance\""
            )),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            LockMode::Governance => "governance",
            LockMode::Compliance => "compliance",
        }
    }
}

/// The Object Lock retention one write asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub mode: LockMode,
    /// Retain until this moment, unix milliseconds.
    pub until_ms: i64,
}

/// What the lock period adds to the longest the retention policy keeps a restore point, for
/// the writer's clock against the bucket's (`crate::worker::retention::lock_period`). So a
/// restore point must be kept until its manifest's retain-until date less this: what
/// `verify --immutable` holds every object it names to ([`crate::verify::immutable`]).
pub const CLOCK_SLACK: Duration = Duration::from_secs(24 * 3600);

/// How a write-once prefix's objects are locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLock {
    pub mode: LockMode,
    /// How long after its write each object is retained.
    pub period: Duration,
}

impl ObjectLock {
    /// The retention of an object written now.
    pub fn retention_now(&self) -> Retention {
        let period = i64::try_from(self.period.as_millis()).unwrap_or(i64::MAX);
        Retention {
            mode: self.mode,
            until_ms: crate::units::unix_now_ms().saturating_add(period),
        }
    }
}

/// What holding reused objects cost and found ([`Bucket::put_retention`] on a [`WriteOnce`],
/// and the worker's check of each restore point it writes), for the worker's counters and its
/// store's health.
#[derive(Debug, Default)]
pub struct HoldCounts {
    /// HEADs sent to learn the retain-until date of an object this process never wrote.
    pub heads: AtomicU64,
    /// `PutObjectRetention`s asked of the bucket below (each extension, refused or not).
    pub extensions: AtomicU64,
    /// When the worker last checked a restore point it wrote (unix ms; 0: never).
    pub checked_at_ms: AtomicI64,
    /// Objects that restore point names whose lock could not be extended to its keep date.
    pub short: AtomicU64,
}

impl HoldCounts {
    pub fn heads(&self) -> u64 {
        self.heads.load(Ordering::Relaxed)
    }

    pub fn extensions(&self) -> u64 {
        self.extensions.load(Ordering::Relaxed)
    }
}

/// A bucket written as a write-once prefix; see the module docs.
pub struct WriteOnce {
    inner: DynBucket,
    lock: ObjectLock,
    counts: Arc<HoldCounts>,
    /// The retain-until date (unix ms) of each object this writer created or extended.
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    until: HashMap<String, i64>,
    /// The map's length after its last pruning.
    pruned_at: usize,
}

impl Held {
    fn record(&mut self, key: &str, until_ms: i64, now_ms: i64, period_ms: i64) {
        self.until.insert(key.to_string(), until_ms);
        if self.until.len() > 2 * self.pruned_at + 1024 {
            // Dated before now + period - 2 slacks: not held by any restore point of the last
            // slack (those were extended), so most likely never asked for again.
            let slack = millis(CLOCK_SLACK);
            let floor = now_ms.saturating_add(period_ms).saturating_sub(2 * slack);
            self.until.retain(|_, u| *u >= floor);
            self.pruned_at = self.until.len();
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl WriteOnce {
    pub fn new(inner: DynBucket, lock: ObjectLock) -> WriteOnce {
        WriteOnce {
            inner,
            lock,
            counts: Arc::default(),
            held: Mutex::new(Held::default()),
        }
    }

    /// This bucket, counting what holding objects costs into `counts`.
    pub fn counting_into(mut self, counts: Arc<HoldCounts>) -> WriteOnce {
        self.counts = counts;
        self
    }

    fn remember(&self, key: &str, until_ms: i64) {
        let now = crate::units::unix_now_ms();
        let period = millis(self.lock.period);
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(key, until_ms, now, period);
    }

    fn known(&self, key: &str) -> Option<i64> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.until.get(key).copied()
    }
}

fn refused(op: &'static str, key: &str, what: &str) -> BucketError {
    BucketError::Permanent {
        op,
        key: key.to_string(),
        message: format!("refused in a write-once (Object Lock) prefix: {what}"),
    }
}

#[async_trait::async_trait]
impl Bucket for WriteOnce {
    fn url(&self) -> String {
        self.inner.url()
    }

    /// Another prefix of a locked bucket is written as this one is: created once, locked.
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(Arc::new(
            WriteOnce::new(self.inner.sibling(url)?, self.lock).counting_into(self.counts.clone()),
        ))
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.inner.get_at_most(key, at_most).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.inner.get_range(key, range).await
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        self.inner.get_buffers(key, part).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.inner.head(key).await
    }

    async fn put_with(
        &self,
        key: &str,
        body: Body,
        mut opts: PutOpts,
    ) -> Result<String, BucketError> {
        if opts.hint == PutHint::FrequentRewrite {
            return self.inner.put_with(key, body, opts).await;
        }
        if opts.cond != PutCondition::IfNoneMatch {
            return Err(refused(
                "put",
                key,
                "only a create (If-None-Match) is written",
            ));
        }
        let retain = match opts.retain {
            Some(r) => Retention {
                mode: self.lock.mode,
                until_ms: r.until_ms,
            },
            None => self.lock.retention_now(),
        };
        opts.retain = Some(retain);
        let etag = self.inner.put_with(key, body, opts).await?;
        self.remember(key, retain.until_ms);
        Ok(etag)
    }

    async fn put_retention(&self, key: &str, retain: Retention) -> Result<(), BucketError> {
        if self.known(key).is_some_and(|u| u >= retain.until_ms) {
            return Ok(());
        }
        if self.known(key).is_none() {
            self.counts.heads.fetch_add(1, Ordering::Relaxed);
            let there = self.inner.head(key).await?;
            let Some(there) = there else {
                return Err(BucketError::not_found(key));
            };
            if let Some(l) = there.lock {
                self.remember(key, l.until_ms);
                if l.until_ms >= retain.until_ms {
                    return Ok(());
                }
            }
        }
        let mut to = self.lock.retention_now();
        to.until_ms = to.until_ms.max(retain.until_ms);
        self.counts.extensions.fetch_add(1, Ordering::Relaxed);
        self.inner.put_retention(key, to).await?;
        self.remember(key, to.until_ms);
        Ok(())
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        match if_match {
            Some(_) => self.inner.delete(key, if_match).await,
            None => Err(refused("delete", key, "nothing is deleted")),
        }
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.inner.list(query).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::bucket::mem::MemBucket;

    fn lock() -> ObjectLock {
        ObjectLock {
            mode: LockMode::Compliance,
            period: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn refuses_overwrites_and_deletes_before_any_request() {
        let mem = Arc::new(MemBucket::new());
        let b = WriteOnce::new(mem.clone(), lock());
        for cond in [PutCondition::None, PutCondition::IfMatch("e".into())] {
            let e = b.put("k", Body::from(vec![1]), cond).await.unwrap_err();
            assert!(e.to_string().contains("write-once"), "{e}");
        }
        let e = b.delete("k", None).await.unwrap_err();
        assert!(e.to_string().contains("nothing is deleted"), "{e}");
        assert!(mem.head("k").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_create_asks_for_a_retention_a_backend_without_locks_refuses() {
        let b = WriteOnce::new(Arc::new(MemBucket::new()), lock());
        let e = b
            .put("k", Body::from(vec![1]), PutCondition::IfNoneMatch)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("Object Lock"), "{e}");
        let until = lock().retention_now().until_ms - crate::units::unix_now_ms();
        assert!((59_000..=60_000).contains(&until), "{until}");
    }

    #[test]
    fn modes_parse_by_name() {
        for m in [LockMode::Governance, LockMode::Compliance] {
            assert_eq!(LockMode::parse(m.name()), Ok(m));
        }
        assert!(
            LockMode::parse("GOVERNANCE")
                .unwrap_err()
                .contains("governance")
        );
    }
}
