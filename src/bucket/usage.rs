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
//! # Bytes stored, an approximation
//!
//! The wrapper keeps the length of every key it has learned of under its root: each listing
//! page sets the lengths of the keys it shows (and forgets the keys the page's range no longer
//! shows, so another writer's deletes are seen when the range is listed again), a successful
//! PUT sets its key's length, a successful DELETE forgets its key. [`UsageSnapshot::bytes_stored`]
//! is their sum: what this process knows of the prefix. It is low until the prefix was listed
//! (the worker's first retention pass lists all of `gen/`, resume lists `manifests/`), and it
//! does not see objects written by others in ranges it never lists again. It costs one map
//! entry per object of the prefix. Versioned buckets, multipart uploads left behind and
//! per-object minimum storage durations (S3 IA, R2's none) are not modelled.
//!
//! A crash loses the counts: they are this process's, since [`Usage::started_unix_ms`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, PutOpts,
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
    /// Key → length of every object known under the root (see the module docs).
    stored: Mutex<BTreeMap<String, u64>>,
    /// The last key of each page whose next page is not listed yet, by its token: where the
    /// next page's range starts. At most [`MAX_PENDING_PAGES`] (more: forgotten, and those
    /// pages' ranges start at their first key).
    pending_pages: Mutex<BTreeMap<String, String>>,
    started_unix_ms: i64,
    started: tokio::time::Instant,
}

/// The most listings [`Usage`] follows page by page at once (see `pending_pages`).
const MAX_PENDING_PAGES: usize = 64;

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
            stored: Mutex::new(BTreeMap::new()),
            pending_pages: Mutex::new(BTreeMap::new()),
            started_unix_ms: crate::units::unix_now_ms(),
            started: tokio::time::Instant::now(),
        })
    }

    pub fn started_unix_ms(&self) -> i64 {
        self.started_unix_ms
    }

    fn record(&self, class: RequestClass) {
        self.requests[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn downloaded(&self, n: usize) {
        self.bytes_downloaded
            .fetch_add(crate::units::u64_len(n), Ordering::Relaxed);
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns a listing page: the keys it shows have the lengths it gives, and the keys of
    /// `prefix` in the range it covered that it does not show are gone.
    fn listed(&self, query: &ListQuery<'_>, page: &ListPage) {
        // The range a page covers: after `start_after` on a first page, after the previous
        // page's last key on a later one (else from its own first key: a token's position is
        // opaque), up to its last key, or to the end of the prefix on the last page.
        let previous = {
            let mut pending = self.pending_pages.lock().unwrap_or_else(|e| e.into_inner());
            let previous = query.token.as_ref().and_then(|t| pending.remove(t));
            if let (Some(next), Some(last)) = (&page.next_token, page.objects.last()) {
                if pending.len() >= MAX_PENDING_PAGES {
                    pending.clear();
                }
                pending.insert(next.clone(), last.key.clone());
            }
            previous
        };
        let mut stored = self.stored();
        let from = match (&query.token, &query.start_after, page.objects.first()) {
            (None, Some(after), _) => Some((after.clone(), false)),
            (None, None, _) => Some((query.prefix.to_string(), true)),
            (Some(_), _, _) if previous.is_some() => previous.map(|k| (k, false)),
            (Some(_), _, Some(first)) => Some((first.key.clone(), true)),
            (Some(_), _, None) => None,
        };
        let to = match (&page.next_token, page.objects.last()) {
            (None, _) => None,
            (Some(_), Some(last)) => Some(last.key.clone()),
            (Some(_), None) => return,
        };
        if let Some((from, inclusive)) = from {
            let shown: std::collections::HashSet<&str> =
                page.objects.iter().map(|o| o.key.as_str()).collect();
            let gone: Vec<String> = stored
                .range(from.clone()..)
                .map(|(k, _)| k)
                .skip_while(|k| !inclusive && **k == from)
                .take_while(|k| k.starts_with(query.prefix))
                .take_while(|k| to.as_ref().is_none_or(|to| *k <= to))
                .filter(|k| !shown.contains(k.as_str()))
                .cloned()
                .collect();
            for k in gone {
                stored.remove(&k);
            }
        }
        for o in &page.objects {
            stored.insert(o.key.clone(), o.len);
        }
    }

    /// The usage now.
    pub fn snapshot(&self) -> UsageSnapshot {
        let n = |c: RequestClass| self.requests[c as usize].load(Ordering::Relaxed);
        let (bytes_stored, objects_stored) = {
            let stored = self.stored();
            (stored.values().sum(), crate::units::u64_len(stored.len()))
        };
        UsageSnapshot {
            put: n(RequestClass::Put),
            get: n(RequestClass::Get),
            list: n(RequestClass::List),
            head: n(RequestClass::Head),
            delete: n(RequestClass::Delete),
            bytes_uploaded: self.bytes_uploaded.load(Ordering::Relaxed),
            bytes_downloaded: self.bytes_downloaded.load(Ordering::Relaxed),
            bytes_stored,
            objects_stored,
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
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get(&self, key: &str) -> Result<Object, BucketError> {
        self.usage.record(RequestClass::Get);
        let object = self.inner.get(key).await?;
        self.usage.downloaded(object.data.len());
        Ok(object)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.usage.record(RequestClass::Get);
        let data = self.inner.get_range(key, range).await?;
        self.usage.downloaded(data.len());
        Ok(data)
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.usage.record(RequestClass::Head);
        self.inner.head(key).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        self.usage.record(RequestClass::Put);
        let len = body.len();
        self.usage.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
        let etag = self.inner.put_with(key, body, opts).await?;
        self.usage.stored().insert(key.to_string(), len);
        Ok(etag)
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        self.usage.record(RequestClass::Delete);
        self.inner.delete(key, if_match).await?;
        self.usage.stored().remove(key);
        Ok(())
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.usage.record(RequestClass::List);
        let q = ListQuery {
            prefix: query.prefix,
            token: query.token.clone(),
            max_keys: query.max_keys,
            start_after: query.start_after.clone(),
        };
        let page = self.inner.list(query).await?;
        self.usage.listed(&q, &page);
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bucket::PutCondition;
    use crate::bucket::faults::{Fault, FaultPlan, FaultyBucket};
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
            "p/a's page covers only p/a"
        );
        b.list(ListQuery::new("p/", first.next_token, 1))
            .await
            .unwrap();
        let s = usage.snapshot();
        assert_eq!((s.bytes_stored, s.objects_stored), (8, 3), "{s:?}");
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
