//! One S3 client per configuration, shared by every bucket an instance opens.
//!
//! Loading the AWS configuration (the credentials chain, the region, the endpoint) and building
//! a client from it (its own HTTP connection pool, its own credentials cache, its own copy of
//! the SDK's runtime plugins) once per opened bucket made every store of a fleet pay for them:
//! 10,000 stores on S3 held 10,000 clients and resolved credentials 10,000 times. A [`Clients`]
//! holds one [`Configured`] client per configuration instead, and every bucket opened through it
//! with that configuration shares it (an `aws_sdk_s3::Client` is a handle: clones share one
//! pool and one credentials cache).
//!
//! What makes two clients differ is the environment the SDK's configuration is read from:
//! every `AWS_*` variable (credentials, profile, region, endpoint, container and instance
//! metadata settings) and this crate's [`PATH_STYLE_ENV`] and [`CHECKSUMS_ENV`]. That
//! environment, with what a destination URL's query names (endpoint, region, profile:
//! [`S3Settings`]), is the cache's key, so a process whose environment changed between two opens
//! (tests) gets a second client, never a stale one, and a replica on another endpoint or
//! profile gets its own. A destination's bucket and prefix do not change the client (both are
//! per request), so every store of an instance on one configuration shares one.
//!
//! Invariants: a configuration is loaded at most once per key and [`Clients`] (two opens racing
//! for one key wait for the same load); a failed load (no region) is not kept, so the next open
//! tries again. The key holds the variables' values (secrets among them) in memory only, as the
//! environment does, and is never printed.
//!
//! A [`Clients`] belongs to whoever opens buckets for one instance (the service's fleet); a
//! command that opens one bucket uses a fresh one. Clients are not shared across processes,
//! nor across tokio runtimes (a pooled connection is served by its runtime's tasks), which is
//! why this is a value to hold rather than a process-wide static.
//!
//! # What a crash leaves
//! Nothing: all of it is memory.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, RequestChecksumCalculation};
use tokio::sync::{Mutex, OnceCell};

use super::{CHECKSUMS_ENV, MIN_PART_SIZE, PATH_STYLE_ENV, S3Options};
use crate::bucket::url::S3Settings;

/// A client with this crate's settings applied (retries off, timeouts, checksums), the
/// options its buckets upload with, and the endpoint its errors name.
#[derive(Clone)]
pub struct Configured {
    pub(super) client: Client,
    pub(super) options: S3Options,
    pub(super) endpoint: String,
}

impl Configured {
    /// Overrides `client`'s retry (off), timeout and checksum settings from `options`.
    pub(super) fn new(client: Client, options: S3Options) -> Configured {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            .operation_attempt_timeout(options.attempt_timeout)
            .build();
        let mut conf = client
            .config()
            .to_builder()
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts);
        if options.checksums_when_required {
            conf = conf.request_checksum_calculation(RequestChecksumCalculation::WhenRequired);
        }
        let part_size = options.part_size.max(MIN_PART_SIZE);
        Configured {
            client: Client::from_conf(conf.build()),
            options: S3Options {
                part_size,
                multipart_threshold: options.multipart_threshold.max(part_size),
                upload_concurrency: options.upload_concurrency.max(1),
                ..options
            },
            endpoint: "of the S3 client".to_string(),
        }
    }

    /// The client the standard AWS environment describes, overridden by what `settings` name
    /// (see [`super::S3Bucket::open`]), or why there is none.
    async fn load(settings: S3Settings) -> Result<Configured, String> {
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).retry_config(RetryConfig::disabled());
        if let Some(profile) = &settings.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(region) = &settings.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(endpoint) = &settings.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let sdk = loader.load().await;
        if sdk.region().is_none() {
            return Err(
                "no AWS region configured: set AWS_REGION, or region= in the destination's query"
                    .into(),
            );
        }
        let path_style = sdk.endpoint_url().is_some()
            && !std::env::var(PATH_STYLE_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("false"));
        let options = S3Options {
            checksums_when_required: std::env::var(CHECKSUMS_ENV)
                .is_ok_and(|v| v.eq_ignore_ascii_case("when_required")),
            ..S3Options::default()
        };
        let endpoint = match (sdk.endpoint_url(), sdk.region()) {
            (Some(url), _) => url.to_string(),
            (None, Some(region)) => format!("https://s3.{region}.amazonaws.com"),
            (None, None) => "of AWS S3".to_string(),
        };
        let conf = aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(path_style)
            .build();
        let mut configured = Configured::new(Client::from_conf(conf), options);
        configured.endpoint = endpoint;
        Ok(configured)
    }
}

/// The environment a configuration is read from, and the destination's own settings: see the
/// module docs.
#[derive(PartialEq, Eq, Hash)]
struct Key(Vec<(String, String)>, S3Settings);

impl Key {
    fn of(settings: &S3Settings) -> Key {
        let mut vars: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
            .filter(|(k, _)| k.starts_with("AWS_") || k == PATH_STYLE_ENV || k == CHECKSUMS_ENV)
            .collect();
        vars.sort();
        Key(vars, settings.clone())
    }
}

/// The S3 clients of one instance, one per configuration; cheap to clone (clones share them).
#[derive(Clone, Default)]
pub struct Clients {
    by_key: Arc<Mutex<HashMap<Key, Arc<OnceCell<Configured>>>>>,
}

impl Clients {
    /// The client of the current environment: loaded on the first call for it, shared after.
    pub async fn from_env(&self) -> Result<Configured, String> {
        self.configured(&S3Settings::default()).await
    }

    /// The client of the current environment overridden by `settings` (a destination URL's
    /// query): loaded on the first call for the two, shared after.
    pub async fn configured(&self, settings: &S3Settings) -> Result<Configured, String> {
        let cell = self
            .by_key
            .lock()
            .await
            .entry(Key::of(settings))
            .or_default()
            .clone();
        cell.get_or_try_init(|| Configured::load(settings.clone()))
            .await
            .cloned()
    }

    /// How many distinct clients these are (for tests and benchmarks).
    pub async fn len(&self) -> usize {
        let cells: Vec<_> = self.by_key.lock().await.values().cloned().collect();
        cells.iter().filter(|c| c.initialized()).count()
    }

    /// Whether no client was built yet.
    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }
}
