//! Test support shared by the integration tests: `mod support;` in a test file.
//!
//! Each test binary uses only part of it.
#![allow(dead_code)]

pub mod binary;
pub mod dest;
pub mod fault_proxy;
pub mod hooked;
pub mod hostile;
pub mod instances;
pub mod keks;
pub mod pki;
pub mod postgres;
pub mod primary;
pub mod registry;
pub mod s3;
pub mod s3_servers;
pub mod serve;
pub mod served;
pub mod service;
pub mod soak;
pub mod sources;
pub mod store;
pub mod tcp_meter;
pub mod webhooks;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::retry::RetryPolicy;
use mushroom_backup::bucket::{Body, BucketError};
use mushroom_backup::service::proto;

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

/// A `Register` of the store directory `dir` backing up to `destination`, nothing else set.
pub fn register_req(dir: &Path, destination: &str) -> proto::RegisterRequest {
    proto::RegisterRequest {
        store_dir: dir.to_str().unwrap().to_string(),
        destination: destination.to_string(),
        ..Default::default()
    }
}

/// `msg` as a request carrying `token` as its bearer token (`authorization: Bearer …`), as an
/// admin or a node sends it.
pub fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// The `file://` URL of a local-directory destination.
pub fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// Polls `f` until it returns `Ok`, or panics after `deadline` naming `what` and the last
/// observation.
pub async fn wait_for<T, F, Fut>(deadline: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if start.elapsed() > deadline => {
                panic!("waited {deadline:?} for {what}; last saw: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Every file and directory under `root` (the root included), with its permission bits.
pub fn modes_under(root: &Path) -> Vec<(String, bool, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let shown = path.strip_prefix(root).unwrap().display().to_string();
        out.push((
            shown,
            meta.is_dir(),
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        ));
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
        }
    }
    out.sort();
    out
}
