//! [`ReadOnly`]: a bucket that refuses every write and delete, for the commands that only read
//! a destination (`ls`, `verify`, `restore`, the service's `ListRestorePoints` and Adopt's read
//! phase; see [`super::open_read_only`]).
//!
//! Reads pass through unchanged. A `put` or `delete` is refused as `Permanent` before the inner
//! bucket sees it, so nothing a read-only caller does can create, replace or remove an object,
//! whatever the backend, and a bug that tried would fail loudly instead of writing.

use std::ops::Range;

use bytes::Bytes;

use super::{Body, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, Part, PutOpts};

/// What a refused request says.
const REFUSED: &str = "the destination was opened read-only";

/// A read-only view of a bucket; see the module docs.
pub struct ReadOnly {
    inner: DynBucket,
}

impl ReadOnly {
    pub fn new(inner: DynBucket) -> Self {
        ReadOnly { inner }
    }
}

fn refused(op: &'static str, key: &str) -> BucketError {
    BucketError::Permanent {
        op,
        key: key.to_string(),
        message: REFUSED.to_string(),
    }
}

#[async_trait::async_trait]
impl super::Bucket for ReadOnly {
    fn url(&self) -> String {
        self.inner.url()
    }

    fn sibling(&self, url: &str) -> Result<DynBucket, BucketError> {
        Ok(std::sync::Arc::new(ReadOnly::new(self.inner.sibling(url)?)))
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

    async fn put_with(&self, key: &str, _body: Body, _: PutOpts) -> Result<String, BucketError> {
        Err(refused("put", key))
    }

    async fn delete(&self, key: &str, _if_match: Option<&str>) -> Result<(), BucketError> {
        Err(refused("delete", key))
    }

    async fn put_retention(
        &self,
        key: &str,
        _retain: crate::bucket::write_once::Retention,
    ) -> Result<(), BucketError> {
        Err(refused("put_retention", key))
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.inner.list(query).await
    }
}
