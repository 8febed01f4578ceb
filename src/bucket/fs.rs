//! A local directory acting as a bucket (to be written).
use std::path::Path;

use super::OpenError;

pub struct FsBucket;

impl FsBucket {
    pub fn open(root: &Path) -> Result<Self, OpenError> {
        Err(OpenError::Unavailable {
            url: format!("file://{}", root.display()),
            reason: "not implemented yet".into(),
        })
    }
}

#[async_trait::async_trait]
impl super::Bucket for FsBucket {
    fn url(&self) -> String {
        todo!()
    }
    async fn get(&self, _: &str) -> Result<super::Object, super::BucketError> {
        todo!()
    }
    async fn get_range(
        &self,
        _: &str,
        _: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes, super::BucketError> {
        todo!()
    }
    async fn head(&self, _: &str) -> Result<Option<super::ObjectMeta>, super::BucketError> {
        todo!()
    }
    async fn put(
        &self,
        _: &str,
        _: super::Body,
        _: super::PutCondition,
    ) -> Result<String, super::BucketError> {
        todo!()
    }
    async fn delete(&self, _: &str, _: Option<&str>) -> Result<(), super::BucketError> {
        todo!()
    }
    async fn list(
        &self,
        _: &str,
        _: Option<String>,
        _: usize,
    ) -> Result<super::ListPage, super::BucketError> {
        todo!()
    }
}
