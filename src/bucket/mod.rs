//! The object-store abstraction: one trait, several backends.
//!
//! A [`Bucket`] is rooted at a destination (`file:///path` or `s3://bucket/prefix`); every key
//! passed to it is relative to that root (`manifests/00000000000000000042.json`). Backends:
//! [`fs::FsBucket`] (a local directory acting as a bucket, the embedded default),
//! [`s3::S3Bucket`] (aws-sdk-s3), and the wrappers [`faults::FaultyBucket`] (fail, delay,
//! "succeeded but the answer was lost", crash at request N) and [`retry::Retrying`] (the one
//! retry layer). All of them pass one conformance suite (`tests/bucket_conformance.rs`).
//!
//! Semantics every backend gives, exactly as S3 does:
//! - `put` with [`PutCondition::IfNoneMatch`] creates the object only if no object has the key;
//!   otherwise [`BucketError::PreconditionFailed`]. With [`PutCondition::IfMatch`] it replaces
//!   the object only if its current ETag is the one given; otherwise `PreconditionFailed` (also
//!   when the object is missing).
//! - A reader never sees half an object under its final name: a write is all or nothing.
//! - `delete` is idempotent: deleting a missing key succeeds, unless `if_match` is given, in
//!   which case a missing key or another ETag is `PreconditionFailed`.
//! - `list` returns keys in lexicographic order, at most `max_keys` a page, with a token for the
//!   next page.
//! - ETags are opaque strings: pass them back unchanged.
//! - A [`PutHint`] (given with [`Bucket::put_with`]) may change how a backend writes an
//!   object, never what is written or under which condition: the lease marks its writes
//!   [`PutHint::FrequentRewrite`], which only [`fs::FsBucket`] acts on; wrappers pass it on.
//!
//! Errors are split into *determinate* (the request did not happen) and *indeterminate* (it may
//! have: a timeout, a dropped connection). After an indeterminate write, re-read before acting;
//! [`put_immutable`] does that for write-once objects. Every error's `Display` is one line in
//! words for the operator ("bucket b does not exist", "cannot reach the endpoint …"); no
//! backend passes an SDK's `Debug` dump through.
//!
//! # Opening
//! One opener, [`Open`], for every caller: the destination, the mode, the caller's
//! cancellation token, and optionally usage accounting, a retry policy and the instance's
//! shared S3 clients ([`s3::Clients`]). [`Open::read_write`] opens a destination for backups:
//! a `file://` directory is created as needed. The read-only commands (`ls`, `verify`,
//! `restore`, the service's `ListRestorePoints`, drills and Adopt's read phase) use
//! [`Open::read_only`], which creates nothing anywhere (no directory, no `.lock`, no `.tmp/`),
//! refuses every write and delete ([`read_only::ReadOnly`]), and proves it can list the
//! destination before it answers: a missing directory or S3 bucket is [`OpenError::Missing`],
//! an access denied or an unreachable endpoint says so. An instance holds one [`Opener`]:
//! every bucket it opens shares its S3 clients and its cancellation token.
//!
//! # The bucket's clock
//! [`Object::age`] is how long ago the object read was last written, by the clock of whatever
//! stamps the bucket's objects, never by the reader's: two processes on hosts whose clocks
//! disagree read the same age of one object (give or take the time between their reads). So
//! a reader may judge "written more than a TTL ago" without trusting its own clock against a
//! writer's. Per backend:
//! - S3: the response's `Date` header minus the object's `Last-Modified`, both the store's,
//!   to the second ([`s3`]); `None` when the store sends no `Date` (or no `Last-Modified`).
//! - A local directory ([`fs::FsBucket`]): now minus the file's mtime. Every process sharing
//!   the directory shares the host's clock, which is that bucket's clock; a step of it moves
//!   every age by the step.
//! - Memory ([`mem::MemBucket`]): the tokio clock (paused in tests) since the write.
//! - The wrappers pass the inner bucket's age through.
//!
//! An age is never negative: an object stamped after the moment of the read (a clock stepped
//! back, frontends that disagree) reads as zero, the reading least likely to make a caller act
//! early. A `None` must be handled as "unknown", never as "young" or "old".

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub mod body;
pub mod counting;
pub mod faults;
pub mod fs;
pub mod mem;
pub mod metered;
mod open;
pub mod read_only;
pub mod retry;
pub mod s3;
pub mod stored;
pub mod throttle;
pub mod url;
pub mod usage;
pub mod write_once;

pub use body::Body;
pub use open::{Open, OpenError, OpenMode, Opener};

/// What a listing or a HEAD says about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub len: u64,
    pub etag: String,
    /// When the object was written by the bucket's own clock (S3 `LastModified`, a `file://`
    /// object's mtime), unix milliseconds; `None` when the store does not say.
    pub modified_ms: Option<i64>,
    /// The object's S3 Object Lock retention, as a HEAD reads it (`None`: none, or a listing
    /// or a backend that cannot lock, which never says); see [`write_once`].
    pub lock: Option<write_once::Retention>,
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectMeta>,
    /// Pass back to get the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// The most a whole-object read ([`Bucket::get`]) takes: the largest object read whole
/// other than a restore's data pieces, a manifest (LATEST, the lease, claims, lineage and key
/// objects are a few hundred bytes each). A larger object is refused before its body is read,
/// naming it: one hostile or foreign object in a prefix costs an error, never the memory of
/// the service. The worker never writes a manifest past it
/// ([`crate::worker`]'s restore point refuses to).
pub const GET_MAX: u64 = 64 << 20;

/// Which bytes of an object a read takes ([`Bucket::get_buffers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The whole object, refused (naming it, before its body is read) when it is longer than
    /// `at_most` bytes: a reader that knows how long the object should be says so, and a
    /// hostile object costs it no more memory than that.
    Whole { at_most: u64 },
    /// Bytes `range` (a range past the end is cut at the end).
    Range(Range<u64>),
}

/// An object read whole.
#[derive(Debug, Clone)]
pub struct Object {
    pub data: Bytes,
    pub etag: String,
    /// How long ago the object was last written, by the bucket's own clock (see the module
    /// docs, "The bucket's clock"); `None` when the bucket did not say.
    pub age: Option<Duration>,
}

/// The precondition of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutCondition {
    /// Plain write (used only when conditional writes are turned off).
    None,
    /// `If-None-Match: *`: create only.
    IfNoneMatch,
    /// `If-Match: <etag>`: replace only that version.
    IfMatch(String),
}

/// What a writer knows of how an object will be written, for a backend that can use it;
/// every backend writes the same object, with the same semantics, whatever the hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutHint {
    /// An ordinary object.
    #[default]
    Normal,
    /// An object rewritten every few seconds (the bucket lease): [`fs::FsBucket`] replaces it
    /// by exchange with a scratch file instead of creating a new file each time.
    FrequentRewrite,
}

/// How a write is made: its precondition, a [`PutHint`], and the Object Lock retention the
/// object is written with (`None`: none; only S3 can lock, every other backend refuses a
/// `Some` with [`lock_refused`]; see [`write_once`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOpts {
    pub cond: PutCondition,
    pub hint: PutHint,
    pub retain: Option<write_once::Retention>,
}

/// What a backend that cannot lock objects answers a write asking for a retention.
pub fn lock_refused(backend: &str, key: &str) -> BucketError {
    BucketError::Permanent {
        op: "put",
        key: key.to_string(),
        message: format!(
            "{backend} cannot hold an Object Lock retention: a write-once prefix needs an S3 \
             bucket with Object Lock enabled"
        ),
    }
}

impl From<PutCondition> for PutOpts {
    fn from(cond: PutCondition) -> PutOpts {
        PutOpts {
            cond,
            hint: PutHint::Normal,
            retain: None,
        }
    }
}

/// What a listing asks for: the keys under `prefix`, at most `max_keys` of them, after the
/// page `token` ends (from the start when `None`) and after the key `start_after` (S3's
/// `StartAfter`: a key, present or not, that every listed key sorts after).
///
/// A token is itself the last key of the page it ends, so the two bounds are one kind of
/// bound: a listing starts after the greater of them ([`ListQuery::after`]), in every backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery<'a> {
    pub prefix: &'a str,
    pub token: Option<String>,
    pub max_keys: usize,
    pub start_after: Option<String>,
}

impl<'a> ListQuery<'a> {
    pub fn new(prefix: &'a str, token: Option<String>, max_keys: usize) -> ListQuery<'a> {
        ListQuery {
            prefix,
            token,
            max_keys,
            start_after: None,
        }
    }

    /// This query, listing only keys that sort after `key`.
    pub fn starting_after(mut self, key: impl Into<String>) -> ListQuery<'a> {
        self.start_after = Some(key.into());
        self
    }

    /// The key every listed key sorts after: the greater of the token and `start_after`.
    pub fn after(&self) -> Option<&str> {
        match (self.token.as_deref(), self.start_after.as_deref()) {
            (Some(t), Some(s)) => Some(t.max(s)),
            (t, s) => t.or(s),
        }
    }
}

/// A bucket request that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BucketError {
    #[error("{key}: no such object")]
    NotFound { key: String },
    #[error("{key}: precondition failed (another writer, or the object already exists)")]
    PreconditionFailed { key: String },
    /// Real S3 answers 409 ConditionalRequestConflict to racing conditional writes: retry.
    #[error("{key}: conflicting conditional request; retry")]
    Conflict { key: String },
    /// A failure that may pass: throttling, 5xx, timeouts, dropped connections.
    /// `indeterminate` means the request may have taken effect.
    #[error("{op} {key}: {message}")]
    Transient {
        op: &'static str,
        key: String,
        message: String,
        indeterminate: bool,
    },
    /// A failure that retrying cannot fix: a bad key, a request the store refuses.
    #[error("{op} {key}: {message}")]
    Permanent {
        op: &'static str,
        key: String,
        message: String,
    },
    /// The S3 bucket itself does not exist (`NoSuchBucket`): nothing under it can be read or
    /// written. Not retried.
    #[error("bucket {bucket} does not exist")]
    NoSuchBucket { bucket: String },
    /// The store refused our credentials (HTTP 403: `AccessDenied`, `InvalidAccessKeyId`,
    /// `SignatureDoesNotMatch`, …). Not retried. `detail` is the store's code and message.
    #[error("access denied to {url} (check the credentials for {endpoint}): {detail}")]
    AccessDenied {
        url: String,
        endpoint: String,
        detail: String,
    },
    /// No credentials to sign a request with: the AWS credentials chain found none (or its
    /// configuration is broken). Nothing was sent. Not retried: no retry would find any.
    #[error(
        "no AWS credentials found ({detail}) for {url}: set AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with an instance or task role"
    )]
    NoCredentials { url: String, detail: String },
    /// No answer from the endpoint: the connection could not be made, broke, or timed out.
    /// Retried; `indeterminate` as for `Transient`.
    #[error("cannot reach the endpoint {endpoint}: {reason}")]
    Unreachable {
        endpoint: String,
        reason: String,
        indeterminate: bool,
    },
    /// The operation was cancelled (shutdown, or the lease stopped holding).
    #[error("cancelled")]
    Cancelled,
    /// Injected by [`faults::FaultyBucket`]: the process "died" at this request.
    #[error("simulated crash at request {request}")]
    Crashed { request: u64 },
}

impl BucketError {
    /// A whole-object read of an object longer than the read takes ([`Part::Whole`]).
    pub fn too_large(op: &'static str, key: &str, len: u64, at_most: u64) -> BucketError {
        BucketError::Permanent {
            op,
            key: key.to_string(),
            message: format!(
                "the object is {len} bytes, more than the {at_most} this read takes \
                 (not an object this project wrote as it is now)"
            ),
        }
    }

    pub fn not_found(key: &str) -> BucketError {
        BucketError::NotFound {
            key: key.to_string(),
        }
    }

    pub fn precondition_failed(key: &str) -> BucketError {
        BucketError::PreconditionFailed {
            key: key.to_string(),
        }
    }

    /// Whether a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BucketError::Transient { .. }
                | BucketError::Conflict { .. }
                | BucketError::Unreachable { .. }
        )
    }

    /// Whether the failed request may nevertheless have taken effect.
    pub fn is_indeterminate(&self) -> bool {
        matches!(
            self,
            BucketError::Transient {
                indeterminate: true,
                ..
            } | BucketError::Unreachable {
                indeterminate: true,
                ..
            }
        )
    }
}

/// An object store rooted at one destination. See the module docs for the semantics.
#[async_trait::async_trait]
pub trait Bucket: Send + Sync + 'static {
    /// The destination URL this bucket is rooted at, for messages.
    fn url(&self) -> String;

    /// Reads a whole object of at most [`GET_MAX`] bytes (see [`Bucket::get_at_most`]).
    async fn get(&self, key: &str) -> Result<Object, BucketError> {
        self.get_at_most(key, GET_MAX).await
    }

    /// Reads a whole object, refusing one longer than `at_most` bytes before its body is read
    /// ([`BucketError::too_large`], naming the object).
    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError>;

    /// Reads bytes `range` of an object (a range past the end is cut at the end).
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError>;

    /// The bytes of [`Bucket::get_at_most`] ([`Part::Whole`]) or [`Bucket::get_range`]
    /// ([`Part::Range`]), in the buffers the transport delivered them in, in order: a caller
    /// that writes them out or hashes them needs no copy into one buffer. The caller checks
    /// them against its own CRC (S3 does not validate a response checksum here). Default: one
    /// buffer.
    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        Ok(vec![match part {
            Part::Whole { at_most } => self.get_at_most(key, at_most).await?.data,
            Part::Range(r) => self.get_range(key, r).await?,
        }])
    }

    /// The object's length and ETag, or `None` when there is no such object.
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError>;

    /// Writes a whole object under `cond`; returns its new ETag. Large bodies go up in parts
    /// (multipart on S3), still all or nothing under the final key. A convenience over
    /// [`Bucket::put_with`] that no bucket overrides (`tests/bucket_wrappers.rs` holds them
    /// to it), so a wrapper's `put` is always its own `put_with`. Every other method with a
    /// default body ([`Bucket::get_buffers`]) every wrapper forwards, or it would fall back to
    /// the default behind the inner bucket's back.
    async fn put(&self, key: &str, body: Body, cond: PutCondition) -> Result<String, BucketError> {
        self.put_with(key, body, cond.into()).await
    }

    /// [`Bucket::put`] with a [`PutHint`] beside the condition: what every backend implements.
    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError>;

    /// Deletes an object; see the module docs for `if_match`.
    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError>;

    /// One page of the keys under the query's prefix, in order.
    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError>;

    /// Sets the Object Lock retention of the current version of `key` to `retain` (S3
    /// `PutObjectRetention`, one PUT-class request): how a write-once writer extends the lock
    /// of an object a newer restore point reuses ([`write_once`]). The store refuses to
    /// shorten a retention (COMPLIANCE always, GOVERNANCE without the bypass, which is never
    /// sent). Default: refused, as [`lock_refused`]: only S3 holds locks.
    async fn put_retention(
        &self,
        key: &str,
        _retain: write_once::Retention,
    ) -> Result<(), BucketError> {
        Err(lock_refused(&self.url(), key))
    }

    /// The bucket rooted at `url`, another prefix of the same bucket reached as this one is
    /// (the same client, settings and wrappers, sharing their counters): how a branch's
    /// restore reads the parent objects its manifest names, and how a branch writes and a
    /// retention reads pins. `url` has no query: it is what a branch manifest names. An S3
    /// bucket refuses another bucket; a local one opens another existing directory and creates
    /// nothing in it. Default: refused, as [`sibling_refused`].
    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Err(sibling_refused(
            &self.url(),
            url,
            "this bucket reaches no other prefix",
        ))
    }
}

/// What a refused [`Bucket::sibling`] says.
pub fn sibling_refused(from: &str, url: &str, why: &str) -> BucketError {
    BucketError::Permanent {
        op: "sibling",
        key: url.to_string(),
        message: format!("{why} (from {})", url::without_query(from)),
    }
}

/// A shared bucket handle.
pub type DynBucket = Arc<dyn Bucket>;

/// Every object under `prefix`, following pages.
pub async fn list_all(bucket: &dyn Bucket, prefix: &str) -> Result<Vec<ObjectMeta>, BucketError> {
    let mut out = Vec::new();
    let mut token = None;
    loop {
        let page = bucket.list(ListQuery::new(prefix, token, 1000)).await?;
        out.extend(page.objects);
        match page.next_token {
            Some(t) => token = Some(t),
            None => return Ok(out),
        }
    }
}

/// How [`put_immutable`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// This call created the object.
    New(String),
    /// The object was already there with the same content (a retry, or a crashed run's upload).
    AlreadyThere(String),
}

/// Writes a write-once object: `If-None-Match: *`, and a 412 is accepted only when the object
/// already there has exactly this content (a retry of our own upload, or an upload of an
/// earlier run that crashed before recording it). Any other content is `PreconditionFailed`.
pub async fn put_immutable(
    bucket: &dyn Bucket,
    key: &str,
    body: Body,
    cond: &PutCondition,
) -> Result<Created, BucketError> {
    let write_cond = match cond {
        PutCondition::None => PutCondition::None,
        _ => PutCondition::IfNoneMatch,
    };
    match bucket.put(key, body.clone(), write_cond).await {
        Ok(etag) => Ok(Created::New(etag)),
        Err(BucketError::PreconditionFailed { .. }) => {
            let there = bucket.get(key).await?;
            if body.same_content(&there.data).await? {
                Ok(Created::AlreadyThere(there.etag))
            } else {
                Err(BucketError::PreconditionFailed {
                    key: key.to_string(),
                })
            }
        }
        Err(e) => Err(e),
    }
}
