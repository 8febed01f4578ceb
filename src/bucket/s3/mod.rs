//! S3 (and S3-compatible stores) through aws-sdk-s3: `s3://bucket/prefix`.
//!
//! Every key is joined onto the prefix (`prefix/key`); listings strip it off again. The client's
//! own retries are **off**: [`super::retry::Retrying`] is the one retry layer, and each request
//! here is exactly one attempt, bounded by the connect and attempt timeouts of [`S3Options`].
//!
//! Writes are all or nothing under the final key, as S3 gives them: a body up to
//! [`S3Options::multipart_threshold`] is one `PutObject`; a larger one is a multipart upload
//! (see [`multipart`]) whose parts go up a few at a time and which becomes visible only at
//! `CompleteMultipartUpload`, carrying the write's condition (`If-None-Match: *` or `If-Match`).
//! A multipart upload that fails is aborted; one whose process dies is left to the bucket's
//! `AbortIncompleteMultipartUpload` lifecycle rule (it is never visible as an object).
//! A write given an Object Lock retention ([`super::PutOpts::retain`]) carries its mode and
//! retain-until date on the `PutObject`, or on the `CreateMultipartUpload` (where S3 takes
//! them for the object the upload becomes).
//!
//! A `PutObject` of a file range given with its CRC-32 (the worker's archives and snapshots)
//! streams from the file descriptor with that CRC as its checksum (see [`stream`]); any other
//! body is read into memory first, and the SDK adds its checksum and signs the payload.
//!
//! # Errors
//! Mapped once, in [`error::map_error`], each into a one-line error in words. 404/`NoSuchKey`
//! is `NotFound`; 412 is `PreconditionFailed` (matched on the HTTP status: no error type has
//! such a variant, and a HEAD's 412 has no code); 409 is `Conflict`; 503/`SlowDown`/throttling
//! is `Transient` and determinate (S3 did not do it); 500/502/504 are `Transient`,
//! indeterminate for writes (they may have happened) and determinate for reads; timeouts and
//! connection trouble are `Unreachable`, indeterminate for writes likewise; `NoSuchBucket` is
//! `NoSuchBucket`; 403 and bad credentials are `AccessDenied`; no credentials at all (the
//! chain found none: nothing is sent) is `NoCredentials`; anything else (400, say) is
//! `Permanent`. A HEAD of any key in a missing bucket answers a bare 404, so it reads as "no
//! such object": a read-only open lists the root first to tell the two apart
//! ([`super::open_read_only`]).
//!
//! # As of an instant
//! [`S3Bucket::as_of`] reads the prefix as it was at an instant, from object versions, and
//! refuses every write: `--bucket-as-of TIME` on `restore`, `ls` and `verify` (see [`as_of`]).
//!
//! # The bucket's clock
//! A `get` reports the object's age by the store's own clock: the response's `Date` minus the
//! object's `Last-Modified`, to the second (see [`clock`]).

use std::ops::Range;
use std::time::Duration;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::ResponseChecksumValidation;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_types::body::SdkBody;
use bytes::Bytes;
use error::map_error;

use super::body::with_key;
use super::throttle::Pacer;
use super::url::S3Settings;
use super::write_once::{LockMode, Retention};
use super::{
    Body, BucketError, ListPage, ListQuery, Object, ObjectMeta, OpenError, Part, PutCondition,
    PutOpts,
};

mod as_of;
mod clock;
mod error;
mod multipart;
mod paced;
pub mod shared;
mod stream;

pub use shared::Clients;
use shared::Configured;

/// The `x-amz-object-lock-mode` and `x-amz-object-lock-retain-until-date` of a retention
/// (`PutObject` and `CreateMultipartUpload` carry the same two; see [`super::write_once`]).
fn lock_fields(
    r: Retention,
) -> (
    aws_sdk_s3::types::ObjectLockMode,
    aws_smithy_types::DateTime,
) {
    let mode = match r.mode {
        LockMode::Governance => aws_sdk_s3::types::ObjectLockMode::Governance,
        LockMode::Compliance => aws_sdk_s3::types::ObjectLockMode::Compliance,
    };
    (mode, aws_smithy_types::DateTime::from_millis(r.until_ms))
}

/// The retention a HEAD read: both the mode and the date, or none.
fn lock_of(
    mode: Option<&aws_sdk_s3::types::ObjectLockMode>,
    until: Option<&aws_smithy_types::DateTime>,
) -> Option<Retention> {
    let mode = match mode? {
        aws_sdk_s3::types::ObjectLockMode::Compliance => LockMode::Compliance,
        _ => LockMode::Governance,
    };
    Some(Retention {
        mode,
        until_ms: until?.to_millis().ok()?,
    })
}

/// Set to `false` to use virtual-hosted-style addressing with a custom endpoint.
pub const PATH_STYLE_ENV: &str = "MUSHROOMDB_BACKUP_S3_PATH_STYLE";
/// Set to `when_required` to send request checksums only where S3 requires them (for
/// S3-compatible stores that refuse the SDK's default checksums).
pub const CHECKSUMS_ENV: &str = "MUSHROOMDB_BACKUP_S3_CHECKSUMS";
/// S3's smallest part size (except the last part).
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// How [`S3Bucket`] talks to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Options {
    /// Bodies larger than this go up as multipart uploads (of `part_size` parts); smaller ones
    /// as one `PutObject`, which costs one request and is cheaper for the store to assemble.
    /// Raised to at least `part_size`.
    pub multipart_threshold: u64,
    /// The part size of multipart uploads (at least [`MIN_PART_SIZE`]; smaller values are
    /// raised to it).
    pub part_size: u64,
    /// Parts in flight at once per upload.
    pub upload_concurrency: usize,
    /// Send request checksums only when an operation requires them
    /// (`RequestChecksumCalculation::WhenRequired`).
    pub checksums_when_required: bool,
    pub connect_timeout: Duration,
    /// The longest one request (one attempt) may take until its response starts.
    pub attempt_timeout: Duration,
    /// The longest a response may go without sending data.
    pub read_timeout: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            multipart_threshold: 64 << 20,
            part_size: 8 << 20,
            upload_concurrency: 4,
            checksums_when_required: false,
            connect_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(120),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// A bucket on S3, rooted at `s3://bucket/prefix`; see the module docs.
#[derive(Clone)]
pub struct S3Bucket {
    client: Client,
    bucket: String,
    /// No leading or trailing `/`; empty for the bucket's root.
    prefix: String,
    options: S3Options,
    /// The endpoint, as errors name it ("cannot reach the endpoint …").
    endpoint: String,
    /// Read as the prefix was at an instant, from object versions ([`as_of`]); read-only.
    as_of: Option<std::sync::Arc<as_of::AsOf>>,
    /// What the URL's query named (its [`super::Bucket::url`] names it again).
    settings: S3Settings,
}

impl S3Bucket {
    /// Opens `s3://bucket/prefix` with the standard AWS environment: the credentials chain,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL` (with which path-style addressing is used unless
    /// `MUSHROOMDB_BACKUP_S3_PATH_STYLE=false`), each overridden by what `settings` (the URL's
    /// query) names. The client comes from `clients`: one per configuration, shared by every
    /// bucket opened through them (see [`shared`]).
    pub async fn open(
        clients: &Clients,
        bucket: &str,
        prefix: &str,
        settings: &S3Settings,
    ) -> Result<S3Bucket, OpenError> {
        let url = format!("s3://{bucket}/{prefix}");
        let client = clients
            .configured(settings)
            .await
            .map_err(|reason| OpenError::Unavailable { url, reason })?;
        let mut b = Self::on(&client, bucket, prefix);
        b.settings = settings.clone();
        Ok(b)
    }

    /// Wraps `client`, overriding its retry (off), timeout and checksum settings from `options`.
    pub fn new(client: Client, bucket: &str, prefix: &str, options: S3Options) -> S3Bucket {
        Self::on(&Configured::new(client, options), bucket, prefix)
    }

    /// A bucket on a client already configured: no configuration is built or copied.
    fn on(client: &Configured, bucket: &str, prefix: &str) -> S3Bucket {
        S3Bucket {
            client: client.client.clone(),
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            options: client.options.clone(),
            endpoint: client.endpoint.clone(),
            as_of: None,
            settings: S3Settings::default(),
        }
    }

    /// This prefix as it was at `at_ms` (unix ms), read from object versions: delete markers
    /// and versions newer than it are not seen, and every write is refused ([`as_of`]).
    pub fn as_of(mut self, at_ms: i64) -> S3Bucket {
        self.as_of = Some(std::sync::Arc::new(as_of::AsOf::new(at_ms)));
        self
    }

    /// The version of `key` to read: `None` when reading the current one; `NotFound` when the
    /// key did not exist at the instant read as of.
    async fn version(&self, key: &str) -> Result<Option<String>, BucketError> {
        let Some(a) = &self.as_of else {
            return Ok(None);
        };
        let root = self.full_key("");
        let table = a.table(self, &self.client, &self.bucket, &root).await?;
        match table.get(key) {
            Some(v) => Ok(Some(v.id.clone())),
            None => Err(BucketError::not_found(key)),
        }
    }

    /// Refuses a write when read as of an instant.
    fn writable(&self, op: &'static str, key: &str) -> Result<(), BucketError> {
        match &self.as_of {
            Some(a) => Err(as_of::refused(op, key, a.at_ms)),
            None => Ok(()),
        }
    }

    /// Names the client's endpoint in errors (the SDK's config does not say it).
    pub fn endpoint_named(mut self, endpoint: &str) -> S3Bucket {
        self.endpoint = endpoint.to_string();
        self
    }

    /// The key in the S3 bucket of our key `key`.
    fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }

    async fn put_one(
        &self,
        key: &str,
        body: &Body,
        cond: &PutCondition,
        retain: Option<Retention>,
    ) -> Result<String, BucketError> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full_key(key));
        if let Some(r) = retain {
            let (mode, until) = lock_fields(r);
            req = req
                .object_lock_mode(mode)
                .object_lock_retain_until_date(until);
        }
        req = match cond {
            PutCondition::None => req,
            PutCondition::IfNoneMatch => req.if_none_match("*"),
            PutCondition::IfMatch(etag) => req.if_match(etag),
        };
        let pacer = Pacer::current();
        let streamed = match body {
            // A checked file range goes up from its descriptor, the CRC of its check as the
            // request's checksum (see `stream`). Not where checksums are sent only when
            // required: there the store may refuse the header, and the in-memory body's signed
            // SHA-256 is what protects it.
            Body::File {
                file,
                offset,
                len,
                crc32: Some(crc),
            } if *len > 0 && !self.options.checksums_when_required => {
                let outcome = stream::Outcome::default();
                let (file, offset, len, crc) = (file.clone(), *offset, *len, *crc);
                let out = outcome.clone();
                let pacer = pacer.clone().filter(Pacer::limited);
                let body = SdkBody::retryable(move || {
                    let range = stream::FileBody::new(file.clone(), offset, len, crc, out.clone());
                    match &pacer {
                        Some(p) => SdkBody::from_body_1_x(paced::Paced::new(range, p.clone())),
                        None => SdkBody::from_body_1_x(range),
                    }
                });
                req = req
                    .content_length(crate::units::i64_of(len))
                    .checksum_crc32(aws_smithy_types::base64::encode(crc.to_be_bytes()))
                    .body(ByteStream::new(body));
                Some(outcome)
            }
            _ => {
                let data = body.to_bytes().await.map_err(|e| with_key(e, key))?;
                req = paced::body(
                    req,
                    data,
                    pacer.clone(),
                    !self.options.checksums_when_required,
                );
                None
            }
        };
        let sent = match paced::timeouts(&self.options, pacer.as_ref(), body.len()) {
            Some(longer) => req.customize().config_override(longer).send().await,
            None => req.send().await,
        };
        let out = sent.map_err(|e| {
            // The body stopped before its last byte: the store cannot have taken it.
            match streamed.as_ref().and_then(stream::Outcome::failure) {
                Some(why) => BucketError::Permanent {
                    op: "put",
                    key: key.to_string(),
                    message: format!("reading the body: {why}"),
                },
                None => map_put_error(self, "S3 PutObject", key, cond, e),
            }
        })?;
        etag_of(out.e_tag(), "put", key)
    }
}

#[async_trait::async_trait]
impl super::Bucket for S3Bucket {
    /// Another prefix of the same bucket (`s3://bucket/prefix`), on the same client and
    /// settings; another bucket is refused.
    fn sibling(&self, url: &str) -> Result<super::DynBucket, BucketError> {
        let refused = |why: &str| super::sibling_refused(&self.url(), url, why);
        if url.contains('?') {
            return Err(refused("a sibling is named without a query"));
        }
        let (bucket, prefix) = match super::url::parse(url) {
            Ok(super::url::DestinationUrl::S3 { bucket, prefix, .. }) => (bucket, prefix),
            Ok(_) => return Err(refused("not an s3:// URL")),
            Err(e) => return Err(refused(&e.to_string())),
        };
        if bucket != self.bucket {
            return Err(refused(&format!(
                "another bucket than {} (a branch names prefixes of its own bucket only)",
                self.bucket
            )));
        }
        let mut b = self.clone();
        b.prefix = prefix;
        Ok(std::sync::Arc::new(b))
    }

    fn url(&self) -> String {
        format!(
            "s3://{}/{}{}",
            self.bucket,
            self.prefix,
            self.settings.query()
        )
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        super::fs::check_key("get", key)?;
        let date = clock::ResponseDate::default();
        let mut get = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .set_version_id(self.version(key).await?)
            .customize()
            .interceptor(date.clone());
        if let Some(longer) = paced::timeouts(&self.options, Pacer::current().as_ref(), at_most) {
            get = get.config_override(longer);
        }
        let out = get
            .send()
            .await
            .map_err(|e| map_error(self, "S3 GetObject", key, false, e))?;
        let etag = etag_of(out.e_tag(), "get", key)?;
        let age = clock::age(date.date().as_deref(), out.last_modified());
        let stated = out.content_length();
        let data = read_body(out.body, stated, at_most, key).await?;
        Ok(Object {
            data: one_buffer(data),
            etag,
            age,
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        super::fs::check_key("get_range", key)?;
        if range.start >= range.end {
            // No bytes to ask for, but a missing object is still an error.
            return match self.head(key).await? {
                Some(_) => Ok(Bytes::new()),
                None => Err(BucketError::NotFound {
                    key: key.to_string(),
                }),
            };
        }
        let sent = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .set_version_id(self.version(key).await?)
            .range(format!("bytes={}-{}", range.start, range.end - 1))
            .send()
            .await;
        match sent {
            Ok(out) => {
                let asked = range.end - range.start;
                let buffers = read_body(out.body, out.content_length, asked, key).await?;
                Ok(one_buffer(buffers))
            }
            // 416: the range starts at or past the end (or the object is empty).
            Err(SdkError::ServiceError(e)) if e.raw().status().as_u16() == 416 => Ok(Bytes::new()),
            Err(e) => Err(map_error(self, "S3 GetObject", key, false, e)),
        }
    }

    /// One `GetObject`, whole or ranged, without the SDK's response checksum validation
    /// (`ResponseChecksumValidation::WhenRequired` for this request: the caller checks the
    /// bytes against its own CRC, so the SDK's CRC-32 over every byte would be a second one),
    /// the body's buffers kept as they came.
    async fn get_buffers(&self, key: &str, part: Part) -> Result<Vec<Bytes>, BucketError> {
        let op = crate::bucket::faults::Op::of_part(&part).name();
        super::fs::check_key(op, key)?;
        let mut req = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .set_version_id(self.version(key).await?);
        let at_most = match &part {
            Part::Range(r) if r.start >= r.end => {
                return Ok(vec![self.get_range(key, r.clone()).await?]);
            }
            Part::Range(r) => {
                req = req.range(format!("bytes={}-{}", r.start, r.end - 1));
                r.end - r.start
            }
            Part::Whole { at_most } => *at_most,
        };
        let pacer = Pacer::current();
        let over = paced::timeouts(&self.options, pacer.as_ref(), at_most)
            .unwrap_or_default()
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        let sent = req.customize().config_override(over).send().await;
        let out = match sent {
            Ok(out) => out,
            Err(SdkError::ServiceError(e))
                if matches!(part, Part::Range(_)) && e.raw().status().as_u16() == 416 =>
            {
                return Ok(Vec::new());
            }
            Err(e) => return Err(map_error(self, "S3 GetObject", key, false, e)),
        };
        read_body(out.body, out.content_length, at_most, key).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        super::fs::check_key("head", key)?;
        let version = match self.version(key).await {
            Err(BucketError::NotFound { .. }) => return Ok(None),
            v => v?,
        };
        let sent = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .set_version_id(version)
            .send()
            .await;
        match sent.map_err(|e| map_error(self, "S3 HeadObject", key, false, e)) {
            Ok(out) => Ok(Some(ObjectMeta {
                key: key.to_string(),
                len: crate::units::u64_of(out.content_length().unwrap_or(0)),
                etag: etag_of(out.e_tag(), "head", key)?,
                modified_ms: out.last_modified().and_then(|t| t.to_millis().ok()),
                lock: lock_of(out.object_lock_mode(), out.object_lock_retain_until_date()),
            })),
            Err(BucketError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        // The hint is for backends that write objects themselves; S3 has one way to write.
        let (cond, retain) = (opts.cond, opts.retain);
        super::fs::check_key("put", key)?;
        self.writable("put", key)?;
        if body.len() > self.options.multipart_threshold {
            multipart::put(self, key, &body, &cond, retain).await
        } else {
            self.put_one(key, &body, &cond, retain).await
        }
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        super::fs::check_key("delete", key)?;
        self.writable("delete", key)?;
        let mut req = self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key));
        if let Some(etag) = if_match {
            req = req.if_match(etag);
        }
        match req
            .send()
            .await
            .map_err(|e| map_error(self, "S3 DeleteObject", key, true, e))
        {
            Ok(_) => Ok(()),
            // A conditional delete of a missing object fails its precondition.
            Err(BucketError::NotFound { .. }) if if_match.is_some() => {
                Err(BucketError::PreconditionFailed {
                    key: key.to_string(),
                })
            }
            Err(BucketError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn put_retention(&self, key: &str, retain: Retention) -> Result<(), BucketError> {
        super::fs::check_key("put_retention", key)?;
        self.writable("put_retention", key)?;
        let mode = match retain.mode {
            LockMode::Governance => aws_sdk_s3::types::ObjectLockRetentionMode::Governance,
            LockMode::Compliance => aws_sdk_s3::types::ObjectLockRetentionMode::Compliance,
        };
        let retention = aws_sdk_s3::types::ObjectLockRetention::builder()
            .mode(mode)
            .retain_until_date(aws_smithy_types::DateTime::from_millis(retain.until_ms))
            .build();
        self.client
            .put_object_retention()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .retention(retention)
            .send()
            .await
            .map_err(|e| map_error(self, "S3 PutObjectRetention", key, true, e))?;
        Ok(())
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let (prefix, max_keys) = (query.prefix, query.max_keys);
        let root = self.full_key("");
        if let Some(a) = &self.as_of {
            let table = a.table(self, &self.client, &self.bucket, &root).await?;
            return Ok(as_of::list(table, &query));
        }
        let mut req = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(format!("{root}{prefix}"))
            .max_keys(i32::try_from(max_keys.clamp(1, 1000)).unwrap_or(1000));
        // Our tokens are keys (the last of the page), so both bounds are S3's StartAfter.
        if let Some(after) = query.after() {
            req = req.start_after(format!("{root}{after}"));
        }
        let out = req
            .send()
            .await
            .map_err(|e| map_error(self, "S3 ListObjectsV2", prefix, false, e))?;
        let mut objects = Vec::with_capacity(out.contents().len());
        for o in out.contents() {
            let Some(key) = o.key().and_then(|k| k.strip_prefix(&root)) else {
                continue;
            };
            objects.push(ObjectMeta {
                key: key.to_string(),
                len: crate::units::u64_of(o.size().unwrap_or(0)),
                etag: etag_of(o.e_tag(), "list", key)?,
                modified_ms: o.last_modified().and_then(|t| t.to_millis().ok()),
                lock: None,
            });
        }
        let next_token = match out.is_truncated() {
            Some(true) => objects.last().map(|o| o.key.clone()),
            _ => None,
        };
        Ok(ListPage {
            objects,
            next_token,
        })
    }
}

/// `buffers` as one (a copy only when there are several).
fn one_buffer(buffers: Vec<Bytes>) -> Bytes {
    match buffers.as_slice() {
        [one] => one.clone(),
        many => Bytes::from(many.concat()),
    }
}

/// A GetObject's body, in the buffers it came in, refused (naming the object) as soon as it is
/// known to be longer than `at_most`: by its stated length before a byte is read, or, without
/// one, once the bytes read pass it. The connection of a refused body is dropped.
async fn read_body(
    mut body: ByteStream,
    stated: Option<i64>,
    at_most: u64,
    key: &str,
) -> Result<Vec<Bytes>, BucketError> {
    const OP: &str = "S3 GetObject";
    if let Some(len) = stated.and_then(|l| u64::try_from(l).ok())
        && len > at_most
    {
        return Err(BucketError::too_large(OP, key, len, at_most));
    }
    let mut buffers = Vec::new();
    let mut read = 0u64;
    loop {
        match body.try_next().await {
            Ok(Some(buffer)) => {
                read += buffer.len() as u64;
                if read > at_most {
                    return Err(BucketError::too_large(OP, key, read, at_most));
                }
                // Paced as it comes: the socket's window holds the store back meanwhile.
                crate::bucket::throttle::pace(buffer.len() as u64).await;
                buffers.push(buffer);
            }
            Ok(None) => return Ok(buffers),
            Err(e) => {
                return Err(BucketError::Transient {
                    op: OP,
                    key: key.to_string(),
                    message: format!("reading the response: {}", error::chain(&e)),
                    indeterminate: false,
                });
            }
        }
    }
}

fn etag_of(etag: Option<&str>, op: &'static str, key: &str) -> Result<String, BucketError> {
    etag.map(str::to_string)
        .ok_or_else(|| BucketError::Permanent {
            op,
            key: key.to_string(),
            message: "the store answered without an ETag".into(),
        })
}

/// Maps the error of the request `op` that writes an object under `cond`.
fn map_put_error<E>(
    b: &S3Bucket,
    op: &'static str,
    key: &str,
    cond: &PutCondition,
    e: SdkError<E>,
) -> BucketError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match map_error(b, op, key, true, e) {
        // S3 answers an If-Match on a missing object with 404: its precondition failed.
        BucketError::NotFound { key } if matches!(cond, PutCondition::IfMatch(_)) => {
            BucketError::PreconditionFailed { key }
        }
        BucketError::NotFound { key } => BucketError::Permanent {
            op,
            key,
            message: "404 on a write".into(),
        },
        e => e,
    }
}
