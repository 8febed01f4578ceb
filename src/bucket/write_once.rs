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
//!
//! A backend that cannot lock an object (a local directory, memory) refuses a write that asks
//! for a retention ([`PutOpts::retain`]) with a `Permanent` error: there is no emulation, a
//! write-once prefix lives in an S3 bucket with Object Lock enabled.
//!
//! Stateless: a crash leaves only what the requests sent before it did.

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;

use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part,
    PutCondition, PutHint, PutOpts,
};

/// The S3 Object Lock retention modes (`x-amz-object-lock-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// A bucket written as a write-once prefix; see the module docs.
pub struct WriteOnce {
    inner: DynBucket,
    lock: ObjectLock,
}

impl WriteOnce {
    pub fn new(inner: DynBucket, lock: ObjectLock) -> WriteOnce {
        WriteOnce { inner, lock }
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
        opts.retain = Some(self.lock.retention_now());
        self.inner.put_with(key, body, opts).await
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
