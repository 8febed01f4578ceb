//! [`FenceWatch`]: how a waiter judges the instance lease a store lease names.
//!
//! A store lease under an instance lease ([`super::instance`]) is written once, when acquired,
//! and never renewed: whether its holder is alive is the question of whether the instance
//! lease it names ([`FenceRef`]) is still being renewed by that holder. So a waiter watches
//! that object instead of the store lease, with the same rule as for a lease of its own: it
//! is stale once this process has seen its ETag unchanged for a whole TTL on its own clock.
//! Besides, the fenced holder has certainly stopped writing when
//! - the instance lease object is gone (its holder released it after stopping every store
//!   under it, or it was deleted: its holder's next renewal fails and it stops), or
//! - it names another holder (it was taken over, so its former holder lost it), or
//! - the bucket's own clock shows it unwritten for a TTL ([`super::stale_by_bucket_clock`]).
//!
//! In both cases the waiter may take the store lease at once; the conditional writes on
//! `GENERATION`, manifests and `LATEST` remain the fence against a holder paused past its
//! deadline, as for every lease.
//!
//! What the watch remembers is one observation (which fence, which ETag, since when), kept
//! across attempts like [`super::LeaseAcquirer`]'s own.
//!
//! A promotion ([`super::TakeOver`]) also asks it how long ago the fence was last renewed by
//! the bucket's clock ([`FenceWatch::renewed_ago`]): a `serve`'s deadline follows its
//! instance lease, not its store lease, which it wrote only when it acquired it.
//!
//! A `file://` lease root is opened refusing a link as its last component
//! ([`crate::bucket::fs::RootLink::Refuse`]): a planted link is an error naming it, never
//! followed to read a fence elsewhere.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{FenceRef, LeaseError, LeaseRecord};
use crate::bucket::{self, BucketError, DynBucket, OpenError};

/// What the watch concluded about a store lease's fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The fenced holder has stopped (the fence is gone, names another holder, or this process
    /// has seen it unchanged for `wait`): take the store lease.
    Stopped { why: &'static str },
    /// The fence is being renewed, or not yet seen unchanged for `wait`.
    Alive {
        host: String,
        seen: Duration,
        wait: Duration,
    },
}

/// Where the watch reads fences: given, or opened from the store's destination on first use.
enum Root {
    Unresolved,
    Open(DynBucket),
    /// The destination has no lease root this process can read (not `file://` or `s3://`).
    Unreadable,
}

pub(super) struct FenceWatch {
    root: Root,
    observed: Option<Observed>,
}

struct Observed {
    key: String,
    etag: String,
    since: Instant,
}

impl FenceWatch {
    pub(super) fn new() -> FenceWatch {
        FenceWatch {
            root: Root::Unresolved,
            observed: None,
        }
    }

    /// Reads fences from `root` (the lease root of the store's destination).
    pub(super) fn at(root: DynBucket) -> FenceWatch {
        FenceWatch {
            root: Root::Open(root),
            observed: None,
        }
    }

    /// Judges `fence`, named by a store lease of the prefix at `store_url`; `ttl` is this
    /// process's TTL (the longer of it and the fence's own is waited).
    pub(super) async fn judge(
        &mut self,
        store_url: &str,
        fence: &FenceRef,
        ttl: Duration,
    ) -> Result<Verdict, LeaseError> {
        let root = match self.root(store_url).await? {
            Resolved::Open(root) => root,
            Resolved::Missing => {
                // No lease root at all: no instance lease can be renewed there.
                self.observed = None;
                return Ok(Verdict::Stopped {
                    why: "its lease root is gone",
                });
            }
            Resolved::Unreadable => {
                // Nothing to watch: the holder might be alive. Never take it on a guess.
                return Ok(Verdict::Alive {
                    host: "?".into(),
                    seen: Duration::ZERO,
                    wait: ttl,
                });
            }
        };
        let asked = Instant::now();
        let object = match root.get(&fence.key).await {
            Ok(object) => object,
            Err(BucketError::NotFound { .. }) => {
                self.observed = None;
                return Ok(Verdict::Stopped {
                    why: "its instance lease is gone",
                });
            }
            Err(e) => return Err(e.into()),
        };
        let answered = Instant::now();
        let record = LeaseRecord::from_json(&object.data).ok();
        if let Some(r) = &record
            && r.holder != fence.holder
        {
            self.observed = None;
            return Ok(Verdict::Stopped {
                why: "its instance lease has another holder",
            });
        }
        let seen = match &self.observed {
            Some(o) if o.key == fence.key && o.etag == object.etag => {
                asked.saturating_duration_since(o.since)
            }
            _ => {
                self.observed = Some(Observed {
                    key: fence.key.clone(),
                    etag: object.etag.clone(),
                    since: answered,
                });
                Duration::ZERO
            }
        };
        let wait = record.as_ref().map_or(ttl, |r| ttl.max(r.ttl()));
        if seen >= wait {
            return Ok(Verdict::Stopped {
                why: "its instance lease was not renewed for a TTL",
            });
        }
        if super::stale_by_bucket_clock(object.age, wait) {
            return Ok(Verdict::Stopped {
                why: "the bucket's clock shows its instance lease unrenewed for a TTL",
            });
        }
        Ok(Verdict::Alive {
            host: record.map_or_else(|| "?".into(), |r| r.host),
            seen,
            wait,
        })
    }

    /// How long ago, by the bucket's clock, the instance lease `fence` names was last written
    /// (renewed) by the holder it names, and that lease's TTL: what a taker of the store lease
    /// judges a live `serve`'s deadline by ([`super::TakeOver`]), since such a holder never
    /// rewrites its store lease. `None` when that cannot be read as such a renewal: the lease
    /// root or the object is missing or unreadable, it names another holder, or the bucket gave
    /// no age; the taker then proves nothing by the deadline.
    pub(super) async fn renewed_ago(
        &mut self,
        store_url: &str,
        fence: &FenceRef,
    ) -> Result<Option<(Duration, Duration)>, LeaseError> {
        let Resolved::Open(root) = self.root(store_url).await? else {
            return Ok(None);
        };
        let object = match root.get(&fence.key).await {
            Ok(object) => object,
            Err(BucketError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(match LeaseRecord::from_json(&object.data) {
            Ok(r) if r.holder == fence.holder => object.age.map(|age| (age, r.ttl())),
            _ => None,
        })
    }

    async fn root(&mut self, store_url: &str) -> Result<Resolved, LeaseError> {
        if let Root::Unresolved = self.root {
            match super::instance::lease_root(store_url) {
                None => self.root = Root::Unreadable,
                // No caller's token reaches an attempt (the acquisition loop races its token
                // around attempts, never inside one): the open's retries bound it instead.
                Some(url) => match bucket::Open::read_only(&url, &CancellationToken::new())
                    .refusing_root_link()
                    .open()
                    .await
                {
                    Ok(b) => self.root = Root::Open(b),
                    // Looked for again next time: it may be created meanwhile.
                    Err(OpenError::Missing { .. }) => return Ok(Resolved::Missing),
                    Err(e) => {
                        return Err(LeaseError::FenceRoot {
                            url,
                            reason: e.to_string(),
                        });
                    }
                },
            }
        }
        Ok(match &self.root {
            Root::Open(b) => Resolved::Open(b.clone()),
            _ => Resolved::Unreadable,
        })
    }
}

enum Resolved {
    Open(DynBucket),
    Missing,
    Unreadable,
}
