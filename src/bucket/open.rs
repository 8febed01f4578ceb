//! The one way to open a destination: [`Open`], on its own (a command opening one bucket) or
//! from an [`Opener`] (an instance opening many, sharing S3 clients and a cancellation token).
//!
//! Every bucket opened is the same stack, outermost first:
//! - [`ReadOnly`](super::read_only::ReadOnly), in [`OpenMode::ReadOnly`] only, once one listing
//!   of the root proved the destination is there and readable (a HEAD of a missing S3 bucket
//!   would only say "no such object");
//! - [`Retrying`](super::retry::Retrying), the one retry layer, with the caller's policy and
//!   cancellation token: cancelling it fails the request in flight and every retry sleep with
//!   [`BucketError::Cancelled`];
//! - [`Throttled`](super::throttle::Throttled), when a lane is given ([`Open::lane`]; an
//!   [`Opener`] gives every bucket one, on the instance's [`Throttle`]), under the retry layer:
//!   every attempt is paced as it is sent;
//! - [`UsageBucket`](super::usage::UsageBucket), when usage is asked for, *under* the retry
//!   layer, so every attempt is one request counted;
//! - the backend: [`FsBucket`](super::fs::FsBucket) for `file:///abs/path`,
//!   [`S3Bucket`](super::s3::S3Bucket) for `s3://bucket/prefix[?endpoint=…&region=…&profile=…]`
//!   (the query: [`super::url`]), on a client of the caller's [`Clients`] (one per
//!   configuration, shared by every bucket of an instance) or of its own;
//!   read as the prefix was at an instant when [`Open::as_of`] asks (S3 only, read-only only:
//!   `--bucket-as-of`).
//!
//! The token is the caller's, never a fresh one nothing cancels: a worker's is the fleet's,
//! cancelled once the last flushes are done; a command's is its own. Cancelling it only ever
//! fails bucket requests: a restore that loses its bucket stops before it renames anything
//! into place (restore is all or nothing), a write in flight is indeterminate as any lost
//! answer is.
//!
//! # What a crash leaves
//! Opening writes nothing but, in [`OpenMode::ReadWrite`], a `file://` destination's directory,
//! `.lock` and `.tmp/` (see [`super::fs`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::retry::{RetryPolicy, Retrying};
use super::s3::Clients;
use super::throttle::{Lane, StoreScope, Throttle, Throttled, TrafficClass};
use super::usage::{Usage, UsageBucket};
use super::{BucketError, DynBucket, ListQuery, fs, read_only, s3};

/// What an instance opens every bucket with: its shared S3 clients and its cancellation token
/// (cancelled when the instance is done with its buckets: after the last flushes and lease
/// releases, never at the signal that starts them). Cheap to clone.
#[derive(Clone)]
pub struct Opener {
    clients: Clients,
    cancel: CancellationToken,
    throttle: Arc<Throttle>,
}

impl Opener {
    /// Buckets whose requests `cancel` ends, sharing one set of S3 clients, unthrottled
    /// (every request only counted).
    pub fn new(cancel: CancellationToken) -> Opener {
        Opener::throttled(cancel, Throttle::unlimited())
    }

    /// [`Opener::new`], every bucket paced by `throttle`.
    pub fn throttled(cancel: CancellationToken, throttle: Arc<Throttle>) -> Opener {
        Opener {
            clients: Clients::default(),
            cancel,
            throttle,
        }
    }

    /// `url` for backups, on the shared clients and token, paced at the instance's scope.
    pub fn read_write<'a>(&self, url: &'a str) -> Open<'a> {
        Open::read_write(url, &self.cancel)
            .clients(&self.clients)
            .lane(self.lane(url, None))
    }

    /// `url` to read it, creating nothing, on the shared clients and token, paced at the
    /// instance's scope.
    pub fn read_only<'a>(&self, url: &'a str) -> Open<'a> {
        Open::read_only(url, &self.cancel)
            .clients(&self.clients)
            .lane(self.lane(url, None))
    }

    /// The lane of a bucket at `url` (its endpoint's scope) for `store`, if any: what
    /// [`Open::lane`] is given to pace a store's requests, classed as the caller says.
    pub fn lane(&self, url: &str, store: Option<Arc<StoreScope>>) -> Lane {
        Lane::new(&self.throttle, store, Some(&super::url::endpoint_of(url)))
    }

    /// The instance's throttle.
    pub fn throttle(&self) -> &Arc<Throttle> {
        &self.throttle
    }

    /// The token every bucket opened so is cancelled by.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// What an opened destination may be used for; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Backups: a `file://` directory (with its `.lock` and `.tmp/`) is created as needed.
    ReadWrite,
    /// `ls`, `verify`, `restore`, `ListRestorePoints`, drills, Adopt's read phase: nothing is
    /// created, writes and deletes are refused, and a missing destination is an error.
    ReadOnly,
}

/// How to open one destination: its URL, mode and the caller's cancellation token, then what
/// the caller adds ([`Open::usage`], [`Open::policy`], [`Open::clients`]); [`Open::open`]
/// opens it.
#[must_use = "nothing is opened until `open` is called"]
pub struct Open<'a> {
    url: &'a str,
    mode: OpenMode,
    cancel: CancellationToken,
    usage: Option<Arc<Usage>>,
    policy: RetryPolicy,
    clients: Option<Clients>,
    lane: Option<Lane>,
    as_of_ms: Option<i64>,
    /// A `file://` root whose path ends in a link is refused ([`fs::RootLink::Refuse`]).
    refuse_root_link: bool,
}

impl<'a> Open<'a> {
    /// `url` in `mode`, every request and retry sleep ended by `cancel`.
    pub fn new(url: &'a str, mode: OpenMode, cancel: &CancellationToken) -> Open<'a> {
        Open {
            url,
            mode,
            cancel: cancel.clone(),
            usage: None,
            policy: RetryPolicy::default(),
            clients: None,
            lane: None,
            as_of_ms: None,
            refuse_root_link: false,
        }
    }

    /// `url` for backups ([`OpenMode::ReadWrite`]).
    pub fn read_write(url: &'a str, cancel: &CancellationToken) -> Open<'a> {
        Open::new(url, OpenMode::ReadWrite, cancel)
    }

    /// `url` to read it, creating nothing ([`OpenMode::ReadOnly`]).
    pub fn read_only(url: &'a str, cancel: &CancellationToken) -> Open<'a> {
        Open::new(url, OpenMode::ReadOnly, cancel)
    }

    /// Records every request (each retry too) into `usage`: a store's cost accounting.
    pub fn usage(mut self, usage: Arc<Usage>) -> Open<'a> {
        self.usage = Some(usage);
        self
    }

    /// Retries with `policy` rather than [`RetryPolicy::default`].
    pub fn policy(mut self, policy: RetryPolicy) -> Open<'a> {
        self.policy = policy;
        self
    }

    /// Takes an S3 client from `clients` (shared with every bucket opened through them)
    /// rather than loading a configuration of its own.
    pub fn clients(mut self, clients: &Clients) -> Open<'a> {
        self.clients = Some(clients.clone());
        self
    }

    /// Paces every request through `lane` ([`Throttled`]).
    pub fn lane(mut self, lane: Lane) -> Open<'a> {
        self.lane = Some(lane);
        self
    }

    /// Counts every request as `class` (a restore's, a drill's), in the lane given or, without
    /// one, in an unlimited one of its own.
    pub fn class(mut self, class: TrafficClass) -> Open<'a> {
        let lane = self
            .lane
            .take()
            .unwrap_or_else(|| Lane::new(&Throttle::unlimited(), None, None));
        self.lane = Some(lane.classed(class));
        self
    }

    /// Reads the destination as it was at `at_ms` (unix ms), from S3 object versions
    /// ([`s3::S3Bucket::as_of`]); only read-only, only S3. `None`: as it is now.
    pub fn as_of(mut self, at_ms: Option<i64>) -> Open<'a> {
        self.as_of_ms = at_ms;
        self
    }

    /// Refuses a `file://` root whose path ends in a symbolic link, naming it: for a root the
    /// service places itself (a lease root), never one the operator names.
    pub fn refusing_root_link(mut self) -> Open<'a> {
        self.refuse_root_link = true;
        self
    }

    /// Opens the destination: the stack of the module docs.
    pub async fn open(self) -> Result<DynBucket, OpenError> {
        let mut bucket = self.backend().await?;
        if let Some(usage) = self.usage {
            bucket = Arc::new(UsageBucket::new(bucket, usage));
        }
        if let Some(lane) = self.lane {
            bucket = Arc::new(Throttled::new(bucket, lane));
        }
        let retrying: DynBucket = Arc::new(Retrying::new(bucket, self.policy, self.cancel));
        match self.mode {
            OpenMode::ReadWrite => Ok(retrying),
            OpenMode::ReadOnly => {
                let bucket: DynBucket = Arc::new(read_only::ReadOnly::new(retrying));
                match bucket.list(ListQuery::new("", None, 1)).await {
                    Ok(_) => Ok(bucket),
                    Err(e) => Err(OpenError::unreadable(self.url, e)),
                }
            }
        }
    }

    /// The destination's backend, with no layer over it. In [`OpenMode::ReadOnly`] nothing is
    /// created, but writes are not refused: that is [`read_only::ReadOnly`]'s part.
    async fn backend(&self) -> Result<DynBucket, OpenError> {
        let url = self.url;
        if self.as_of_ms.is_some() && (self.mode != OpenMode::ReadOnly || !url.starts_with("s3://"))
        {
            return Err(OpenError::BadUrl {
                url: super::url::without_query(url).to_string(),
                reason: "a bucket is read as of an instant only from S3 object versions, and \
                         only to read it (restore, verify, ls)"
                    .into(),
            });
        }
        match super::url::parse(url)? {
            super::url::DestinationUrl::File(path) => {
                let path = std::path::Path::new(&path);
                let link = match self.refuse_root_link {
                    true => fs::RootLink::Refuse,
                    false => fs::RootLink::Follow,
                };
                let existing = self.mode == OpenMode::ReadOnly;
                Ok(Arc::new(fs::FsBucket::open_as(path, existing, link)?))
            }
            super::url::DestinationUrl::S3 {
                bucket,
                prefix,
                settings,
            } => {
                let clients = self.clients.clone().unwrap_or_default();
                let s3 = s3::S3Bucket::open(&clients, &bucket, &prefix, &settings).await?;
                Ok(Arc::new(match self.as_of_ms {
                    Some(ms) => s3.as_of(ms),
                    None => s3,
                }))
            }
        }
    }
}

/// A destination that could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("bad destination {url}: {reason}")]
    BadUrl { url: String, reason: String },
    /// Opened read-only, the destination is not there: `what` is the `file://` URL of the
    /// missing directory, or `bucket NAME`.
    #[error("{what} does not exist")]
    Missing { what: String },
    #[error("cannot open {url}: {reason}")]
    Unavailable { url: String, reason: String },
    /// Opened read-only, the destination refused the first listing: access denied, no
    /// credentials, or the endpoint cannot be reached (the error names the destination or the
    /// endpoint).
    #[error(transparent)]
    Refused(BucketError),
}

impl OpenError {
    /// Why a read-only open's first listing of `url` failed.
    fn unreadable(url: &str, e: BucketError) -> OpenError {
        match e {
            BucketError::NoSuchBucket { bucket } => OpenError::Missing {
                what: format!("bucket {bucket}"),
            },
            e @ (BucketError::AccessDenied { .. }
            | BucketError::NoCredentials { .. }
            | BucketError::Unreachable { .. }) => OpenError::Refused(e),
            // The listing of the root has no key worth naming: the message says it all.
            BucketError::Transient { message, .. } | BucketError::Permanent { message, .. } => {
                OpenError::Unavailable {
                    url: url.to_string(),
                    reason: message,
                }
            }
            e => OpenError::Unavailable {
                url: url.to_string(),
                reason: e.to_string(),
            },
        }
    }
}
