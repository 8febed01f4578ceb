//! [`UsageBucket`]: a wrapper that records what a store costs at its object store: requests by
//! billing class, bytes uploaded and downloaded, and the bytes it knows are stored.
//!
//! It sits *under* the retry layer (`bucket::open_with_usage`), so every attempt is one
//! request, as the object store sees (and bills) them: a retried PUT is two PUTs. A request is
//! counted when it starts, whatever its outcome (a failed or cancelled request was sent).
//!
//! Classes, as S3 bills them: `put` (PutObject; a conditional one too), `get` (GetObject, whole
//! or ranged), `head`, `list` (ListObjectsV2, one per page) and `delete`. A body above the S3
//! backend's multipart threshold (64 MiB by default) is counted as one PUT although S3 sees
//! 2 + parts requests; the service's objects are smaller than that unless snapshots are.
//!
//! Bytes uploaded: the body's length, at every attempt (a retry sends it again). Bytes
//! downloaded: the length of every body read that arrived (a failed GET's partial bytes are
//! not known and not counted). Listings and HEADs count no bytes.
//!
//! # Bytes stored
//!
//! [`UsageSnapshot::bytes_stored`] and `objects_stored` are what the wrapper has learned the
//! prefix holds, from the listings the worker makes anyway (retention's, resume's) and its own
//! successful writes and deletes, as totals per group of keys (a directory: `gen/<g>/wal/`, the
//! manifests, the top level): the memory they take does not grow with the objects. What the totals
//! mean between listings, and what they miss, is [`super::stored`]'s. They are low until the
//! prefix was listed (the worker's first retention pass lists all of `gen/`, resume lists
//! `manifests/`). Versioned buckets, multipart uploads left behind and per-object minimum
//! storage durations (S3 IA, R2's none) are not modelled.
//!
//! A crash loses the counts: they are this process's, since [`Usage::started_unix_ms`].

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::stored::{Stored, Write};
use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part,
    PutCondition, PutOpts,
};

/// A request's billing class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestClass {
    Put,
    Get,
    List,
    Head,
    Delete,
}

impl RequestClass {
    pub const ALL: [RequestClass; 5] = [
        RequestClass::Put,
        RequestClass::Get,
        RequestClass::List,
        RequestClass::Head,
        RequestClass::Delete,
    ];

    /// The `op` label and the name in `ctl cost`: `put`, `get`, `list`, `head`, `delete`.
    pub fn name(self) -> &'static str {
        match self {
            RequestClass::Put => "put",
            RequestClass::Get => "get",
            RequestClass::List => "list",
            RequestClass::Head => "head",
            RequestClass::Delete => "delete",
        }
    }
}

/// One store's usage, shared between its [`UsageBucket`] and whoever reports it.
#[derive(Debug)]
pub struct Usage {
    requests: [AtomicU64; 5],
    bytes_uploaded: AtomicU64,
    bytes_downloaded: AtomicU64,
    /// What the prefix holds, by group of keys (see the module docs).
    stored: Mutex<Stored>,
    started_unix_ms: i64,
    started: tokio::time::Instant,
}

/// The usage at one moment, as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UsageSnapshot {
    pub put: u64,
    pub get: u64,
    pub list: u64,
    pub head: u64,
    pub delete: u64,
    pub bytes_uploaded: u64,
    pub bytes_downloaded: u64,
    pub bytes_stored: u64,
    /// Objects known under the root.
    pub objects_stored: u64,
    /// Since when the counts run (this process's wrapper was made), milliseconds since the
    /// epoch.
    pub since_unix_ms: i64,
    /// How long they have run, milliseconds (by the tokio clock).
    pub window_ms: u64,
}

impl UsageSnapshot {
    /// The requests of `class`.
    pub fn requests(&self, class: RequestClass) -> u64 {
        match class {
            RequestClass::Put => self.put,
            RequestClass::Get => self.get,
            RequestClass::List => self.list,
            RequestClass::Head => self.head,
            RequestClass::Delete => self.delete,
        }
    }

    /// Every class's requests.
    pub fn total_requests(&self) -> u64 {
        RequestClass::ALL.iter().map(|c| self.requests(*c)).sum()
    }
}

impl Usage {
    /// New usage, all zero, starting now.
    pub fn new() -> Arc<Usage> {
        Arc::new(Usage {
            requests: Default::default(),
            bytes_uploaded: AtomicU64::new(0),
            bytes_downloaded: AtomicU64::new(0),
            stored: Mutex::new(Stored::default()),
            started_unix_ms: crate::units::unix_now_ms(),
            started: tokio::time::Instant::now(),
        })
    }

    pub fn started_unix_ms(&self) -> i64 {
        self.started_unix_ms
    }

    /// Every request recorded so far, of any class: what changes whenever anything of the
    /// usage but its window does (a write of stored bytes is a request too). A few atomic
    /// loads, no lock.
    pub fn requests_so_far(&self) -> u64 {
        self.requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    fn record(&self, class: RequestClass) {
        self.requests[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn downloaded(&self, n: usize) {
        self.bytes_downloaded
            .fetch_add(crate::units::u64_len(n), Ordering::Relaxed);
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many groups of keys the stored totals are kept for (what their memory grows with).
    pub fn stored_groups(&self) -> usize {
        self.stored().groups()
    }

    /// The usage now.
    pub fn snapshot(&self) -> UsageSnapshot {
        let n = |c: RequestClass| self.requests[c as usize].load(Ordering::Relaxed);
        let stored = self.stored().totals();
        UsageSnapshot {
            put: n(RequestClass::Put),
            get: n(RequestClass::Get),
            list: n(RequestClass::List),
            head: n(RequestClass::Head),
            delete: n(RequestClass::Delete),
            bytes_uploaded: self.bytes_uploaded.load(Ordering::Relaxed),
            bytes_downloaded: self.bytes_downloaded.load(Ordering::Relaxed),
            bytes_stored: stored.bytes,
            objects_stored: stored.objects,
            since_unix_ms: self.started_unix_ms,
            window_ms: crate::units::millis_u64(self.started.elapsed()),
        }
    }
}

/// A bucket whose requests are recorded into a [`Usage`]; see the module docs.
pub struct UsageBucket {
    inner: DynBucket,
    usage: Arc<Usage>,
}

impl UsageBucket {
    pub fn new(inner: DynBucket, usage: Arc<Usage>) -> Self {
        UsageBucket { inner, usage }
    }
}

#[async_trait::async_trait]
impl Bucket for UsageBucket {
    /// The sibling's requests and bytes are counted into the same usage (a branch pays for
    /// what it reads of its parent).
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(Arc::new(UsageBucket::new(
            self.inner.sibling(url)?,
            self.usage.clone(),
        )))
    }

    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.usage.record(RequestClass::Get);
        let object = self.inner.get_at_most(key, at_most).await?;
        self.usage.downloaded(object.data.len());
        Ok(object)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.usage.record(RequestClass::Get);
        let data = self.inner.get_range(key, range).await?;
        self.usage.downloaded(data.len());
        Ok(data)
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        self.usage.record(RequestClass::Get);
        let buffers = self.inner.get_buffers(key, part).await?;
        self.usage.downloaded(buffers.iter().map(Bytes::len).sum());
        Ok(buffers)
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.usage.record(RequestClass::Head);
        self.inner.head(key).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        self.usage.record(RequestClass::Put);
        let len = body.len();
        self.usage.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
        let write = match opts.cond {
            PutCondition::IfMatch(_) => Write::Replaced(len),
            PutCondition::IfNoneMatch | PutCondition::None => Write::Created(len),
        };
        let etag = self.inner.put_with(key, body, opts).await?;
        self.usage.stored().written(key, write);
        Ok(etag)
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        self.usage.record(RequestClass::Delete);
        self.inner.delete(key, if_match).await?;
        self.usage.stored().written(key, Write::Deleted);
        Ok(())
    }

    async fn put_retention(
        &self,
        key: &str,
        retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        // Billed as a PUT-class request; it changes no stored byte.
        self.usage.record(RequestClass::Put);
        self.inner.put_retention(key, retain).await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.usage.record(RequestClass::List);
        let prefix = query.prefix;
        let after = query.after().map(str::to_string);
        let continued = query.token.is_some();
        let page = self.inner.list(query).await?;
        self.usage.stored().listed(
            prefix,
            after.as_deref(),
            continued,
            &page.objects,
            page.next_token.is_none(),
        );
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bucket::faults::{Fault, FaultPlan, FaultyBucket};
    use crate::bucket::list_all;
    use crate::bucket::mem::MemBucket;
    use crate::bucket::retry::{RetryPolicy, Retrying};

    fn body(s: &'static str) -> Body {
        Body::from(Bytes::from_static(s.as_bytes()))
    }

    #[tokio::test]
    async fn counts_classes_bytes_and_what_is_stored() {
        let usage = Usage::new();
        let b = UsageBucket::new(Arc::new(MemBucket::new()), usage.clone());
        let e = b.put("a", body("123"), PutCondition::None).await.unwrap();
        b.put("b", body("45"), PutCondition::None).await.unwrap();
        b.get("a").await.unwrap();
        b.get_range("a", 1..3).await.unwrap();
        b.head("a").await.unwrap();
        b.list(ListQuery::new("", None, 10)).await.unwrap();
        b.delete("a", Some(&e)).await.unwrap();
        let s = usage.snapshot();
        assert_eq!((s.put, s.get, s.head, s.list, s.delete), (2, 2, 1, 1, 1));
        assert_eq!((s.bytes_uploaded, s.bytes_downloaded), (5, 5));
        assert_eq!((s.bytes_stored, s.objects_stored), (2, 1));
        assert_eq!(s.total_requests(), 7);
    }

    #[tokio::test]
    async fn a_listing_learns_lengths_and_forgets_what_is_gone() {
        let mem: DynBucket = Arc::new(MemBucket::new());
        for (k, v) in [("p/a", "1"), ("p/b", "22"), ("p/c", "333"), ("q/x", "4444")] {
            mem.put(k, body(v), PutCondition::None).await.unwrap();
        }
        let usage = Usage::new();
        let b = UsageBucket::new(mem.clone(), usage.clone());
        b.list(ListQuery::new("", None, 100)).await.unwrap();
        assert_eq!(usage.snapshot().bytes_stored, 10);
        // Another writer deletes p/b; a two-page listing of p/ sees it gone, and leaves q/x.
        mem.delete("p/b", None).await.unwrap();
        let first = b.list(ListQuery::new("p/", None, 1)).await.unwrap();
        assert_eq!(
            usage.snapshot().bytes_stored,
            10,
            "a listing counts once its last page is in"
        );
        b.list(ListQuery::new("p/", first.next_token, 1))
            .await
            .unwrap();
        let s = usage.snapshot();
        assert_eq!((s.bytes_stored, s.objects_stored), (8, 3), "{s:?}");
    }

    #[tokio::test]
    async fn a_listing_resumed_from_a_key_counts_what_lies_after_it() {
        let mem: DynBucket = Arc::new(MemBucket::new());
        for (k, v) in [("gen/1/a", "1"), ("gen/2/a", "22"), ("gen/3/a", "333")] {
            mem.put(k, body(v), PutCondition::IfNoneMatch)
                .await
                .unwrap();
        }
        let usage = Usage::new();
        let b = UsageBucket::new(mem.clone(), usage.clone());
        list_all(&b, "gen/").await.unwrap();
        assert_eq!(usage.snapshot().bytes_stored, 6);
        // Another writer deletes gen/2/a; a listing resumed after gen/1/a (its token a key no
        // listing here stopped at) covers gen/2/ and gen/3/, and sees gen/2/ gone.
        mem.delete("gen/2/a", None).await.unwrap();
        let page = b
            .list(ListQuery::new("gen/", Some("gen/1/a".into()), 100))
            .await
            .unwrap();
        assert_eq!(page.objects.len(), 1);
        let s = usage.snapshot();
        assert_eq!((s.bytes_stored, s.objects_stored), (4, 2), "{s:?}");
    }

    #[tokio::test]
    async fn get_buffers_is_forwarded_and_counted_as_a_get() {
        let usage = Usage::new();
        let mem = MemBucket::with_buffers_of(2);
        mem.put("k", body("abcdef"), PutCondition::None)
            .await
            .unwrap();
        let b = UsageBucket::new(Arc::new(mem), usage.clone());
        let whole = b
            .get_buffers("k", Part::Whole { at_most: 1 << 20 })
            .await
            .unwrap();
        assert_eq!(whole.len(), 3, "the inner bucket's buffers, not one copy");
        let part = b.get_buffers("k", Part::Range(1..5)).await.unwrap();
        assert_eq!(part.concat(), b"bcde");
        let s = usage.snapshot();
        assert_eq!((s.get, s.bytes_downloaded), (2, 10), "{s:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn under_the_retry_layer_every_attempt_counts() {
        let usage = Usage::new();
        // The first two requests fail (transiently), the third passes.
        let faulty = FaultyBucket::new(
            Arc::new(MemBucket::new()),
            FaultPlan::custom(|r| {
                if r.number <= 2 {
                    Fault::Fail
                } else {
                    Fault::Pass
                }
            }),
        );
        let counted: DynBucket = Arc::new(UsageBucket::new(Arc::new(faulty), usage.clone()));
        let policy = RetryPolicy {
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(1),
            max_attempts: 5,
        };
        let b = Retrying::new(counted, policy, Default::default());
        b.put("k", body("abcd"), PutCondition::None).await.unwrap();
        let s = usage.snapshot();
        assert_eq!(
            (s.put, s.bytes_uploaded, s.bytes_stored),
            (3, 12, 4),
            "{s:?}"
        );
    }
}
