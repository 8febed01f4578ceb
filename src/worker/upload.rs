//! Uploading write-once objects of store data (a generation's objects, segments), shared by
//! [`super::generation`] and [`super::segment`].

use super::WorkerError;
use crate::bucket::{self, Body, BucketError, Created, DynBucket, PutCondition};

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
}

impl Uploader {
    /// [`upload`] with this uploader's bucket and condition.
    pub async fn put(&self, key: &str, body: Body) -> Result<Created, WorkerError> {
        upload(&self.bucket, key, body, &self.cond).await
    }
}
