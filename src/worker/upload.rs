//! Uploading write-once objects of store data (a generation's objects, segments), shared by
//! [`super::generation`] and [`super::segment`].
//!
//! Store data goes up encoded ([`Uploader::put_encoded`], `src/at_rest/`): the object is
//! encoded on the blocking pool into a spool (memory, or an unnamed temporary file that a
//! crash cannot leave behind), and the spool is uploaded as a re-readable body stating the
//! stored CRC. An archive or snapshot is read from its descriptor while it is encoded and
//! its plain CRC must be the one the worker checked, so what is encoded is what was checked.
//! Encoding and uploading one object are sequential; several objects overlap (the generation
//! uploads run a few at once). A step dropped mid-encoding leaves its blocking task to finish
//! and drop its spool.

use uuid::Uuid;

use super::WorkerError;
use crate::at_rest::encode::{EncodeOptions, Plain, encode};
use crate::bucket::{self, Body, BucketError, Created, DynBucket, PutCondition};
use crate::manifest::ObjectEntry;

/// Uploads a write-once object; an object already there with other content means another
/// writer owns this generation.
///
/// No HEAD goes first: the generation's claim (`If-None-Match: *`) makes its keys this run's
/// alone, so the only object that can be there already is one of this run's own attempts,
/// which [`bucket::put_immutable`] recognises after its 412. A HEAD would cost a request per
/// object, and on a busy endpoint a round trip of queueing before every upload.
pub(super) async fn upload(
    bucket: &DynBucket,
    key: &str,
    body: Body,
    cond: &PutCondition,
) -> Result<Created, WorkerError> {
    match bucket::put_immutable(bucket.as_ref(), key, body, cond).await {
        Ok(c) => Ok(c),
        Err(BucketError::PreconditionFailed { .. }) => {
            Err(WorkerError::ConcurrentWriter { key: key.into() })
        }
        Err(e) => Err(e.into()),
    }
}

/// The bucket and the condition every write-once upload of one step goes with.
#[derive(Clone)]
pub(super) struct Uploader {
    pub bucket: DynBucket,
    pub cond: PutCondition,
    /// How store data is encoded before it goes up.
    pub encoding: EncodeOptions,
}

impl Uploader {
    /// [`upload`] with this uploader's bucket and condition.
    pub async fn put(&self, key: &str, body: Body) -> Result<Created, WorkerError> {
        upload(&self.bucket, key, body, &self.cond).await
    }
}

impl Uploader {
    /// Encodes `plain` (see the module docs) and uploads it as `key`; returns the manifest
    /// entry of what the bucket now holds.
    pub async fn put_encoded(
        &self,
        key: &str,
        plain: Plain,
        lineage: Uuid,
        generation: u64,
    ) -> Result<ObjectEntry, WorkerError> {
        Ok(self
            .put_encoded_tagged(key, plain, lineage, generation)
            .await?
            .0)
    }

    /// [`Uploader::put_encoded`], with the ETag the bucket holds the object under.
    pub async fn put_encoded_tagged(
        &self,
        key: &str,
        plain: Plain,
        lineage: Uuid,
        generation: u64,
    ) -> Result<(ObjectEntry, String), WorkerError> {
        let (k, opts) = (key.to_string(), self.encoding.clone());
        let encoded = tokio::task::spawn_blocking(move || encode(&k, plain, &opts))
            .await
            .map_err(|e| WorkerError::Io {
                path: key.into(),
                source: std::io::Error::other(format!("encoding task failed: {e}")),
            })??;
        let entry = encoded.entry(key.to_string(), lineage, generation);
        tracing::trace!(key, "encoded; uploading");
        let etag = match self.put(key, encoded.body).await? {
            Created::New(e) | Created::AlreadyThere(e) => e,
        };
        tracing::trace!(key, "uploaded");
        Ok((entry, etag))
    }
}
