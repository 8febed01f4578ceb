//! Each S3 server the tests run against, and [`on_each_s3_server!`], which makes one test of
//! a body per server.
//!
//! - **moto** ([`super::s3::endpoint`]): fast and lenient. It stores an object whose
//!   `x-amz-checksum-crc32` is wrong and, as `scripts/test.sh` runs it, accepts any
//!   credentials.
//! - **SeaweedFS** (`weed mini`, started by `scripts/seaweedfs.sh`, found through
//!   [`SEAWEEDFS_ENV`]): it refuses a body whose CRC does not match (`400 BadDigest`), knows
//!   one identity (`test` / `test`) and answers any other key `403 InvalidAccessKeyId`. Its
//!   listings deviate from S3's promise of UTF-8 binary key order: it walks keys as a
//!   directory tree, so `p/sub/x` comes before `p/sub-a` (see [`ListOrder`]).
//!
//! A missing server skips its tests with a line saying so, except under `CI=true`, where it
//! panics: a missing server must fail CI, never skip.

use std::sync::Arc;

use aws_sdk_s3::Client;
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};

/// The variable naming the SeaweedFS S3 endpoint (`scripts/test.sh` sets it).
pub const SEAWEEDFS_ENV: &str = "MUSHROOM_TEST_SEAWEEDFS_ENDPOINT";

/// Which implementation a server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Moto,
    SeaweedFs,
}

/// The order a server lists keys in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListOrder {
    /// S3's promise: ascending UTF-8 binary order of the whole key (moto, AWS).
    Binary,
    /// SeaweedFS's: key by key along `/`-separated components, as if `/` sorted below every
    /// other byte (`p/sub/x` < `p/sub-a` < `p/sub0`). The same as binary order whenever no
    /// key has a sibling that differs from it first by a byte below `/` (`!"#$%&'()*+,-.`)
    /// where it has a `/`: true of every key this project writes (fixed-width digits,
    /// letters and `/` only).
    Directory,
}

impl ListOrder {
    /// `keys` sorted in this order.
    pub fn sorted(self, mut keys: Vec<String>) -> Vec<String> {
        match self {
            ListOrder::Binary => keys.sort(),
            ListOrder::Directory => keys.sort_by(|a, b| a.split('/').cmp(b.split('/'))),
        }
        keys
    }
}

/// One running S3 server.
#[derive(Debug, Clone)]
pub struct S3Server {
    pub kind: Kind,
    pub endpoint: String,
}

impl S3Server {
    /// The moto of the run, or `None` (after saying why) when there is none.
    pub fn moto() -> Option<S3Server> {
        Some(S3Server {
            kind: Kind::Moto,
            endpoint: super::s3::endpoint()?,
        })
    }

    /// The SeaweedFS of the run, or `None` (after saying why) when there is none; under
    /// `CI=true` a missing one panics.
    pub fn seaweedfs() -> Option<S3Server> {
        if let Ok(endpoint) = std::env::var(SEAWEEDFS_ENV) {
            return Some(S3Server {
                kind: Kind::SeaweedFs,
                endpoint,
            });
        }
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("S3 tests need SeaweedFS: run scripts/test.sh (or set {SEAWEEDFS_ENV})");
        }
        eprintln!("SKIP: no SeaweedFS (run scripts/test.sh, or set {SEAWEEDFS_ENV})");
        None
    }

    /// The server of this kind, as [`S3Server::moto`] or [`S3Server::seaweedfs`].
    pub fn of(kind: Kind) -> Option<S3Server> {
        match kind {
            Kind::Moto => S3Server::moto(),
            Kind::SeaweedFs => S3Server::seaweedfs(),
        }
    }

    /// How the server lists keys.
    pub fn list_order(&self) -> ListOrder {
        match self.kind {
            Kind::Moto => ListOrder::Binary,
            Kind::SeaweedFs => ListOrder::Directory,
        }
    }

    /// A client with the credentials the server knows (`test` / `test`).
    pub fn client(&self) -> Client {
        super::s3::client(&self.endpoint)
    }

    /// Creates a fresh, uniquely named bucket; returns its name.
    pub async fn create_bucket(&self, name_hint: &str) -> String {
        super::s3::create_bucket(&self.endpoint, name_hint).await
    }

    /// A fresh bucket as an [`S3Bucket`] rooted at the prefix `root`.
    pub async fn s3_bucket(&self, name_hint: &str, options: S3Options) -> S3Bucket {
        let name = self.create_bucket(name_hint).await;
        S3Bucket::new(self.client(), &name, "root", options).endpoint_named(&self.endpoint)
    }

    /// A fresh bucket (default options) rooted at a prefix.
    pub async fn bucket(&self, name_hint: &str) -> DynBucket {
        Arc::new(self.s3_bucket(name_hint, S3Options::default()).await)
    }

    /// Like [`S3Server::bucket`], with the given part size (at least 5 MiB) for multipart
    /// uploads.
    pub async fn bucket_with_part_size(&self, name_hint: &str, part_size: u64) -> DynBucket {
        let options = S3Options {
            part_size,
            multipart_threshold: part_size,
            ..S3Options::default()
        };
        Arc::new(self.s3_bucket(name_hint, options).await)
    }
}

/// Makes, of a function that takes a `&S3Server`, one test per server: a module named after
/// the function (modules and functions live in different namespaces) with the tests `moto`
/// and `seaweedfs`, each carrying the given test attribute and calling the function with its
/// server (a missing server skips, or fails under `CI=true`, as [`S3Server::of`] says):
///
/// ```ignore
/// on_each_s3_server!(#[tokio::test] async fn round_trips);
/// async fn round_trips(server: &S3Server) { let b = server.bucket("rt").await; … }
/// on_each_s3_server!(#[test] fn follows);
/// fn follows(server: &S3Server) { … }
/// ```
#[macro_export]
macro_rules! on_each_s3_server {
    ($(#[$attr:meta])* async fn $name:ident) => {
        mod $name {
            $(#[$attr])*
            async fn moto() {
                let kind = $crate::support::s3_servers::Kind::Moto;
                if let Some(s) = $crate::support::s3_servers::S3Server::of(kind) {
                    super::$name(&s).await
                }
            }
            $(#[$attr])*
            async fn seaweedfs() {
                let kind = $crate::support::s3_servers::Kind::SeaweedFs;
                if let Some(s) = $crate::support::s3_servers::S3Server::of(kind) {
                    super::$name(&s).await
                }
            }
        }
    };
    ($(#[$attr:meta])* fn $name:ident) => {
        mod $name {
            $(#[$attr])*
            fn moto() {
                let kind = $crate::support::s3_servers::Kind::Moto;
                if let Some(s) = $crate::support::s3_servers::S3Server::of(kind) {
                    super::$name(&s)
                }
            }
            $(#[$attr])*
            fn seaweedfs() {
                let kind = $crate::support::s3_servers::Kind::SeaweedFs;
                if let Some(s) = $crate::support::s3_servers::S3Server::of(kind) {
                    super::$name(&s)
                }
            }
        }
    };
}
