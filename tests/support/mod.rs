//! Test support shared by the integration tests: `mod support;` in a test file.
//!
//! Each test binary uses only part of it.
#![allow(dead_code)]

pub mod binary;
pub mod fault_proxy;
pub mod hooked;
pub mod postgres;
pub mod registry;
pub mod s3;
pub mod serve;
pub mod served;
pub mod service;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::retry::RetryPolicy;
use mushroom_backup::bucket::{Body, BucketError};

/// A body from a string.
pub fn body(s: impl Into<String>) -> Body {
    Body::from(Bytes::from(s.into()))
}

pub fn is_precondition_failed<T: std::fmt::Debug>(r: &Result<T, BucketError>) -> bool {
    matches!(r, Err(BucketError::PreconditionFailed { .. }))
}

/// A local-directory bucket in a fresh temp directory (removed when the guard drops).
pub fn fs_bucket() -> (tempfile::TempDir, Arc<FsBucket>) {
    let dir = tempfile::tempdir().expect("create a temp dir");
    let b = Arc::new(FsBucket::open(dir.path()).expect("open the fs bucket"));
    (dir, b)
}

/// A retry policy with millisecond backoff, for tests that inject many faults.
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        first_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(8),
        max_attempts: 12,
    }
}
