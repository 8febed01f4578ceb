//! [`MemBucket`]: an in-memory bucket with exactly the semantics of the [`Bucket`] trait, for
//! tests.
//!
//! It exists for tests that run many requests under `tokio::time::pause()` (lease renewals over
//! dozens of TTLs, say): a request whose body is [`Body::Bytes`] completes on the calling task
//! without yielding, touching no disk, so it takes neither paused nor real time and needs no
//! temporary directory. (A [`Body::File`] body is read on the blocking pool, as [`Body::read`]
//! always does.)
//!
//! Not the reason: that the local-directory bucket would let a paused clock run ahead. It does
//! not: on a current-thread runtime (the only kind that can pause) tokio inhibits auto-advance
//! while a `spawn_blocking` task runs, so [`super::fs::FsBucket`] requests under paused time
//! also take no paused time, only real time for the disk and its fsyncs. A bucket on real
//! network I/O (S3) is the one that lets a paused clock jump to the next timer mid-request.
//!
//! # Semantics
//! Those of the module docs of [`super`], held to by the conformance suite
//! (`tests/bucket_conformance.rs`): `If-None-Match: *` creates only, `If-Match` replaces only
//! the version named, deletes are idempotent unless conditional, listings are in byte order with
//! pages of at most 1000 keys, ranges past the end are cut. Keys are checked as the
//! local-directory bucket checks them, so a test cannot pass here with a key the embedded
//! default would refuse. Unlike that bucket, and like S3, a key may also be a prefix of other
//! keys (`a` and `a/b`).
//!
//! [`MemBucket::with_buffers_of`] hands `get_buffers` responses out in buffers of a set size, as
//! a transport does, so a test can see a wrapper pass them on rather than one copy.
//!
//! An object's age ([`Object::age`]) is the tokio clock's time since its write: under
//! `tokio::time::pause()` it advances with the paused clock, so a test can age an object by
//! advancing time.
//!
//! The ETag is the local-directory bucket's: quoted hex of the first 16 bytes of the content's
//! SHA-256. So equal content has equal ETags, and new content a new one.
//!
//! # Invariants
//! Every request takes one mutex for its whole effect, so each is atomic: the check of a
//! condition and the write it guards cannot interleave with another request. Clones share the
//! objects (one bucket, several handles); separate `MemBucket::new()`s are separate buckets.
//! Nothing survives the process: a "crash" in a test is a [`super::faults::FaultyBucket`] over
//! a `MemBucket` that outlives the code under test.

use std::collections::BTreeMap;
use std::ops::{Bound, Range};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::body::with_key;
use super::fs::check_key;
use super::{
    Body, Bucket, BucketError, ListPage, ListQuery, Object, ObjectMeta, Part, PutCondition, PutOpts,
};

/// S3's limit on a page of a listing; larger `max_keys` are cut to it.
const MAX_PAGE: usize = 1000;

/// Numbers the buckets of this process, so that each has its own URL in messages.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An in-memory bucket; see the module docs. Cheap to clone; clones share the objects.
#[derive(Clone)]
pub struct MemBucket {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    objects: Mutex<BTreeMap<String, Stored>>,
    /// Whether `get` reports ages ([`MemBucket::without_clock`]: like an endpoint that sends
    /// no `Date`).
    clock: bool,
    /// The size of the buffers `get_buffers` hands a response out in (0: one buffer), as a
    /// transport delivers a body ([`MemBucket::with_buffers_of`]).
    buffer: usize,
}

/// One object as stored.
#[derive(Clone)]
struct Stored {
    data: Bytes,
    etag: String,
    /// When it was written, by the tokio clock (so a paused test clock ages it).
    written: tokio::time::Instant,
    /// When it was written, by the wall clock (unix ms): its `ObjectMeta::modified_ms`.
    written_ms: i64,
}

impl Default for MemBucket {
    fn default() -> Self {
        Self::new()
    }
}

impl MemBucket {
    /// A new, empty bucket.
    pub fn new() -> Self {
        Self::with_clock(true)
    }

    /// A new, empty bucket whose objects have no known age (`Object::age` is `None`), like an
    /// S3 endpoint that sends no `Date`: for tests of what a reader does without the bucket's
    /// clock.
    pub fn without_clock() -> Self {
        Self::with_clock(false)
    }

    /// A new, empty bucket whose `get_buffers` hands each response out in buffers of `n`
    /// bytes (the last one shorter), as a transport delivers a body: for tests that a wrapper
    /// passes the buffers on rather than one copy.
    pub fn with_buffers_of(n: usize) -> Self {
        Self::made(true, n)
    }

    fn with_clock(clock: bool) -> Self {
        Self::made(clock, 0)
    }

    fn made(clock: bool, buffer: usize) -> Self {
        MemBucket {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                objects: Mutex::new(BTreeMap::new()),
                clock,
                buffer,
            }),
        }
    }

    fn objects(&self) -> MutexGuard<'_, BTreeMap<String, Stored>> {
        // Every request's effect is one map operation, so a panic elsewhere while the lock was
        // held cannot have left half a request behind.
        self.inner.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stored(&self, op: &'static str, key: &str) -> Result<Option<Stored>, BucketError> {
        check_key(op, key)?;
        Ok(self.objects().get(key).cloned())
    }
}

#[async_trait::async_trait]
impl Bucket for MemBucket {
    fn url(&self) -> String {
        format!("mem://{}", self.inner.id)
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        let stored = self
            .stored("get", key)?
            .ok_or_else(|| BucketError::not_found(key))?;
        let len = stored.data.len() as u64;
        if len > at_most {
            return Err(BucketError::too_large("get", key, len, at_most));
        }
        Ok(Object {
            data: stored.data,
            etag: stored.etag,
            age: self.inner.clock.then(|| stored.written.elapsed()),
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        let data = self
            .stored("get_range", key)?
            .ok_or_else(|| BucketError::not_found(key))?
            .data;
        let len = data.len() as u64;
        let (start, end) = (range.start.min(len), range.end.min(len));
        if start >= end {
            return Ok(Bytes::new());
        }
        Ok(data.slice(crate::units::usize_of(start)..crate::units::usize_of(end)))
    }

    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let mut data = match part {
            Part::Whole { at_most } => self.get_at_most(key, at_most).await?.data,
            Part::Range(r) => self.get_range(key, r).await?,
        };
        let n = match self.inner.buffer {
            0 => return Ok(vec![data]),
            n => n,
        };
        let mut out = Vec::with_capacity(data.len().div_ceil(n));
        while !data.is_empty() {
            out.push(data.split_to(n.min(data.len())));
        }
        Ok(out)
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        Ok(self.stored("head", key)?.map(|s| meta(key, &s)))
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        let cond = opts.cond;
        check_key("put", key)?;
        if opts.retain.is_some() {
            return Err(super::lock_refused("a memory bucket", key));
        }
        let data = body.to_bytes().await.map_err(|e| with_key(e, key))?;
        let etag = etag_of(&data);
        let mut objects = self.objects();
        let current = objects.get(key).map(|s| s.etag.as_str());
        let allowed = match &cond {
            PutCondition::None => true,
            PutCondition::IfNoneMatch => current.is_none(),
            PutCondition::IfMatch(expected) => current == Some(expected.as_str()),
        };
        if !allowed {
            return Err(BucketError::precondition_failed(key));
        }
        objects.insert(
            key.to_string(),
            Stored {
                data,
                etag: etag.clone(),
                written: tokio::time::Instant::now(),
                written_ms: crate::units::unix_now_ms(),
            },
        );
        Ok(etag)
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        check_key("delete", key)?;
        let mut objects = self.objects();
        if let Some(expected) = if_match
            && objects.get(key).map(|s| s.etag.as_str()) != Some(expected)
        {
            return Err(BucketError::precondition_failed(key));
        }
        objects.remove(key);
        Ok(())
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let (prefix, max_keys) = (query.prefix, query.max_keys);
        let max_keys = max_keys.clamp(1, MAX_PAGE);
        let objects = self.objects();
        let start = match query.after() {
            Some(after) => Bound::Excluded(after),
            None => Bound::Included(prefix),
        };
        let mut found: Vec<ObjectMeta> = objects
            .range::<str, _>((start, Bound::Unbounded))
            .skip_while(|(key, _)| !key.starts_with(prefix) && key.as_str() < prefix)
            .take_while(|(key, _)| key.starts_with(prefix))
            .take(max_keys + 1)
            .map(|(key, stored)| meta(key, stored))
            .collect();
        let more = found.len() > max_keys;
        found.truncate(max_keys);
        let next_token = if more {
            found.last().map(|o| o.key.clone())
        } else {
            None
        };
        Ok(ListPage {
            objects: found,
            next_token,
        })
    }
}

fn meta(key: &str, stored: &Stored) -> ObjectMeta {
    ObjectMeta {
        key: key.to_string(),
        len: stored.data.len() as u64,
        etag: stored.etag.clone(),
        modified_ms: Some(stored.written_ms),
        lock: None,
    }
}

/// The local-directory bucket's ETag of `data`.
fn etag_of(data: &[u8]) -> String {
    format!("\"{}\"", hex::encode(&Sha256::digest(data)[..16]))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn body(s: &'static str) -> Body {
        Body::from(Bytes::from_static(s.as_bytes()))
    }

    /// Under a paused clock its requests take no time: a timer raced against one never wins.
    #[tokio::test(start_paused = true)]
    async fn requests_take_no_paused_time() {
        let b = MemBucket::new();
        let start = tokio::time::Instant::now();
        for i in 0..100 {
            tokio::select! {
                biased;
                r = b.put("k", body("v"), PutCondition::None) => { r.unwrap(); }
                _ = tokio::time::sleep(Duration::from_nanos(1)) => panic!("request {i} yielded to a timer"),
            }
            tokio::select! {
                biased;
                r = b.get("k") => { r.unwrap(); }
                _ = tokio::time::sleep(Duration::from_nanos(1)) => panic!("request {i} yielded to a timer"),
            }
        }
        assert_eq!(tokio::time::Instant::now(), start);
    }

    #[tokio::test]
    async fn etag_is_the_fs_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let fs = super::super::fs::FsBucket::open(dir.path()).unwrap();
        let mem = MemBucket::new();
        for content in ["", "hello", "another content"] {
            let a = fs
                .put("k", body(content), PutCondition::None)
                .await
                .unwrap();
            let b = mem
                .put("k", body(content), PutCondition::None)
                .await
                .unwrap();
            assert_eq!(a, b, "{content:?}");
        }
    }

    #[tokio::test]
    async fn clones_share_objects_and_new_buckets_do_not() {
        let a = MemBucket::new();
        let clone = a.clone();
        let other = MemBucket::new();
        a.put("k", body("v"), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        assert!(clone.head("k").await.unwrap().is_some());
        assert!(other.head("k").await.unwrap().is_none());
        assert_ne!(a.url(), other.url());
        assert_eq!(a.url(), clone.url());
    }

    #[tokio::test]
    async fn a_key_may_prefix_other_keys() {
        let b = MemBucket::new();
        b.put("a", body("1"), PutCondition::None).await.unwrap();
        b.put("a/b", body("2"), PutCondition::None).await.unwrap();
        let page = b.list(ListQuery::new("a", None, 10)).await.unwrap();
        let keys: Vec<&str> = page.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a", "a/b"]);
    }
}
