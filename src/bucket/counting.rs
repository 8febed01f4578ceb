//! [`CountingBucket`]: a wrapper that counts the requests made through it, by kind.
//!
//! Requests are the running cost of continuous backup (an idle store must cost only its lease
//! renewals), so the counts are what request-economy tests and metrics read. Every request is
//! counted when it starts, whatever its outcome: a failed or cancelled request was still sent
//! (or would have been) and still costs. Counts live in a [`RequestCounts`] of atomics that
//! several wrappers may share (one per store, say, or one for the whole process);
//! [`RequestCounts::snapshot`] reads them into a plain, serializable [`RequestCountsSnapshot`],
//! and [`RequestCountsSnapshot::since`] gives the requests between two snapshots.
//!
//! The counts are independent of one another: a snapshot taken while requests start may count
//! one kind's newest request and not another's, but never loses or invents one.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::faults::Op;
use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutOpts,
};

/// Requests counted by kind; shared between [`CountingBucket`]s and whoever reports them.
#[derive(Debug, Default)]
pub struct RequestCounts {
    get: AtomicU64,
    get_range: AtomicU64,
    head: AtomicU64,
    put: AtomicU64,
    delete: AtomicU64,
    list: AtomicU64,
}

/// The counts at one moment, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestCountsSnapshot {
    pub get: u64,
    pub get_range: u64,
    pub head: u64,
    pub put: u64,
    pub delete: u64,
    pub list: u64,
    /// The sum of the kinds above.
    pub total: u64,
}

impl RequestCounts {
    /// New counts, all zero, ready to share.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts one request of kind `op`.
    pub fn record(&self, op: Op) {
        self.counter(op).fetch_add(1, Ordering::Relaxed);
    }

    /// The requests of kind `op` so far.
    pub fn count(&self, op: Op) -> u64 {
        self.counter(op).load(Ordering::Relaxed)
    }

    /// Every kind's count now.
    pub fn snapshot(&self) -> RequestCountsSnapshot {
        RequestCountsSnapshot::new(
            self.count(Op::Get),
            self.count(Op::GetRange),
            self.count(Op::Head),
            self.count(Op::Put),
            self.count(Op::Delete),
            self.count(Op::List),
        )
    }

    fn counter(&self, op: Op) -> &AtomicU64 {
        match op {
            Op::Get => &self.get,
            Op::GetRange => &self.get_range,
            Op::Head => &self.head,
            Op::Put => &self.put,
            Op::Delete => &self.delete,
            Op::List => &self.list,
        }
    }
}

impl RequestCountsSnapshot {
    fn new(get: u64, get_range: u64, head: u64, put: u64, delete: u64, list: u64) -> Self {
        RequestCountsSnapshot {
            get,
            get_range,
            head,
            put,
            delete,
            list,
            total: get + get_range + head + put + delete + list,
        }
    }

    /// The requests counted after `earlier` (a snapshot of the same counts taken before).
    pub fn since(&self, earlier: &RequestCountsSnapshot) -> RequestCountsSnapshot {
        RequestCountsSnapshot::new(
            self.get.saturating_sub(earlier.get),
            self.get_range.saturating_sub(earlier.get_range),
            self.head.saturating_sub(earlier.head),
            self.put.saturating_sub(earlier.put),
            self.delete.saturating_sub(earlier.delete),
            self.list.saturating_sub(earlier.list),
        )
    }

    /// Requests that read (get, get_range, head, list).
    pub fn reads(&self) -> u64 {
        self.get + self.get_range + self.head + self.list
    }

    /// Requests that change the bucket (put, delete).
    pub fn writes(&self) -> u64 {
        self.put + self.delete
    }
}

/// A bucket that counts its requests into a [`RequestCounts`]; see the module docs.
pub struct CountingBucket {
    inner: DynBucket,
    counts: Arc<RequestCounts>,
}

impl CountingBucket {
    /// Counts the requests to `inner` into fresh counts.
    pub fn new(inner: DynBucket) -> Self {
        Self::with_counts(inner, RequestCounts::new())
    }

    /// Counts the requests to `inner` into `counts`, which others may share.
    pub fn with_counts(inner: DynBucket, counts: Arc<RequestCounts>) -> Self {
        CountingBucket { inner, counts }
    }

    /// The counts this wrapper adds to.
    pub fn counts(&self) -> &Arc<RequestCounts> {
        &self.counts
    }
}

#[async_trait::async_trait]
impl Bucket for CountingBucket {
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(Arc::new(CountingBucket::with_counts(
            self.inner.sibling(url)?,
            self.counts.clone(),
        )))
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.counts.record(Op::Get);
        self.inner.get_at_most(key, at_most).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.counts.record(Op::GetRange);
        self.inner.get_range(key, range).await
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        self.counts.record(Op::of_part(&part));
        self.inner.get_buffers(key, part).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.counts.record(Op::Head);
        self.inner.head(key).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        self.counts.record(Op::Put);
        self.inner.put_with(key, body, opts).await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        self.counts.record(Op::Delete);
        self.inner.delete(key, if_match).await
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        // Counted as a PUT: S3 bills it as one.
        self.counts.record(Op::Put);
        self.inner.put_retention(key, retain).await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.counts.record(Op::List);
        self.inner.list(query).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::PutCondition;
    use crate::bucket::faults::{Fault, FaultPlan, FaultyBucket};
    use crate::bucket::mem::MemBucket;

    fn body(s: &'static str) -> Body {
        Body::from(Bytes::from_static(s.as_bytes()))
    }

    #[tokio::test]
    async fn counts_every_kind_and_the_total() {
        let b = CountingBucket::new(Arc::new(MemBucket::new()));
        let e = b.put("a", body("1"), PutCondition::None).await.unwrap();
        b.put("b", body("2"), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        b.get("a").await.unwrap();
        b.get_range("a", 0..1).await.unwrap();
        b.head("a").await.unwrap();
        b.head("missing").await.unwrap();
        b.head("b").await.unwrap();
        b.list(ListQuery::new("", None, 10)).await.unwrap();
        b.delete("a", Some(&e)).await.unwrap();
        let want = RequestCountsSnapshot {
            get: 1,
            get_range: 1,
            head: 3,
            put: 2,
            delete: 1,
            list: 1,
            total: 9,
        };
        assert_eq!(b.counts().snapshot(), want);
        assert_eq!((want.reads(), want.writes()), (6, 3));
    }

    #[tokio::test]
    async fn failed_requests_count_too() {
        let faulty = FaultyBucket::new(
            Arc::new(MemBucket::new()),
            FaultPlan::custom(|_| Fault::Fail),
        );
        let b = CountingBucket::new(Arc::new(faulty));
        assert!(b.put("a", body("1"), PutCondition::None).await.is_err());
        assert!(b.get("a").await.is_err());
        assert!(b.get("../bad").await.is_err());
        let s = b.counts().snapshot();
        assert_eq!((s.put, s.get, s.total), (1, 2, 3));
    }

    #[tokio::test]
    async fn shared_counts_add_up_and_since_subtracts() {
        let counts = RequestCounts::new();
        let mem: DynBucket = Arc::new(MemBucket::new());
        let a = CountingBucket::with_counts(mem.clone(), counts.clone());
        let b = CountingBucket::with_counts(mem, counts.clone());
        a.put("k", body("1"), PutCondition::None).await.unwrap();
        let before = counts.snapshot();
        b.get("k").await.unwrap();
        a.get("k").await.unwrap();
        b.list(ListQuery::new("", None, 1)).await.unwrap();
        let after = counts.snapshot();
        assert_eq!((after.put, after.get, after.total), (1, 2, 4));
        let delta = after.since(&before);
        assert_eq!(
            delta,
            RequestCountsSnapshot {
                get: 2,
                list: 1,
                total: 3,
                ..Default::default()
            }
        );
    }

    #[test]
    fn snapshot_serializes_as_plain_numbers() {
        let s = RequestCountsSnapshot::new(1, 2, 3, 4, 5, 6);
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "get": 1, "get_range": 2, "head": 3, "put": 4, "delete": 5, "list": 6, "total": 21
            })
        );
    }
}
