//! A bucket that calls a hook before each request it passes on, with the operation and the key
//! (the prefix, for a LIST): for tests and benches that count requests, or act on the store at a
//! chosen one.

use std::ops::Range;

use bytes::Bytes;
use mushroom_backup::bucket::faults::Op;
use mushroom_backup::bucket::{
    Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta, PutOpts,
};

pub struct Hooked<F> {
    pub inner: DynBucket,
    pub hook: F,
}

#[async_trait::async_trait]
impl<F: Fn(Op, &str) + Send + Sync + 'static> Bucket for Hooked<F> {
    fn url(&self) -> String {
        self.inner.url()
    }

    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        (self.hook)(Op::Get, key);
        self.inner.get_at_most(key, at_most).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        (self.hook)(Op::GetRange, key);
        self.inner.get_range(key, range).await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        (self.hook)(Op::Head, key);
        self.inner.head(key).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        (self.hook)(Op::Put, key);
        self.inner.put_with(key, body, opts).await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        (self.hook)(Op::Delete, key);
        self.inner.delete(key, if_match).await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        (self.hook)(Op::List, query.prefix);
        self.inner.list(query).await
    }
}
