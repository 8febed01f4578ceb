//! [`InstanceLeases`]: one bucket lease per instance and lease root, fencing every store the
//! instance backs up there. What makes an idle store cost no requests.
//!
//! # Why
//!
//! A per-store lease is renewed every third of a TTL: about 360 PUTs an hour for each store,
//! changing or not. A fleet of 10,000 idle stores would send 3.6 million an hour. The instance
//! lease moves the renewals from the store to the process: one object per lease root, renewed
//! every third of a TTL whatever the number of stores under it, and each store's `lease`
//! object names it and is written only when the store's lease is acquired or taken over.
//! (This deviates from DESIGN.md section 7, which has each store renew its own lease; the
//! standalone `backup` command still does, one store in one process.)
//!
//! # Objects
//!
//! - The **lease root** of a destination ([`lease_root`]): `s3://BUCKET/.mushroom-backup` for
//!   any `s3://BUCKET/...` destination (its query, naming endpoint, region or profile, parsed
//!   and written back in one canonical order and form, [`S3Settings::query`](crate::bucket::url::S3Settings::query):
//!   `s3://BUCKET/.mushroom-backup?QUERY`; so two spellings of one query are one root, and
//!   the instance's stores there share one instance lease rather than two roots renewing one
//!   object and each taking it from the other), `file:///PARENT/.mushroom-backup` for a
//!   `file:///PARENT/NAME` destination, `PARENT` resolved (links, `..`) when the destination
//!   exists. So the stores of one bucket (or one directory of destinations) share one
//!   instance lease. A `file://` lease root is opened refusing a link as its last component
//!   ([`crate::bucket::fs::RootLink::Refuse`]: `O_NOFOLLOW`, at the open and at every request):
//!   whoever can write `PARENT` could otherwise plant `.mushroom-backup` as a link and have
//!   the instance's leases, `.tmp/` and `.lock` written where it points. Such a root fails
//!   the store's lease with an error naming it; nothing is created through the link.
//! - The **instance lease** `instances/<instance id>.lease` under it ([`key_for`]): an ordinary
//!   [`LeaseRecord`](super::LeaseRecord) (`store` is `instance <id>`), acquired, renewed,
//!   taken over and released by the rules of the [parent module](super), its holder id
//!   `<instance id>/<nonce of this process>`.
//! - Each **store lease** (`lease` under the store's prefix) records the holder id and a
//!   [`FenceRef`](super::FenceRef): the instance lease's key and holder.
//!
//! # The guarantees of a per-store lease, kept
//!
//! - **A single holder, named.** A store lease is acquired like any other (`If-None-Match`, or
//!   `If-Match` on the version seen); a waiter names the holder (`<instance>/<nonce>`).
//! - **Takeover within about a TTL of the holder's death** ([`super::fence_watch`]): a waiter
//!   watches the fence instead of the store lease, and takes the store lease once it has seen
//!   the fence unchanged for a TTL on its own clock, or at once when the fence is gone or names
//!   another holder. A store can move on its own (`Deregister`, a planned move): its holder
//!   deletes its store lease (release), and the next one acquires it at once, while the
//!   holder's other stores stay.
//! - **A holder that cannot renew stops writing before its deadline.** A store lease under a
//!   fence holds only while the fence does ([`super::BucketLease`]: its token is a child of the
//!   fence's, its deadline is the fence's), so when renewals of the instance lease fail, every
//!   store under it stops writing at the instance lease's deadline, and in-flight requests run
//!   through [`LeaseHandle::guard`] are cancelled.
//! - **The fence** remains the conditional writes on `GENERATION`, manifests and `LATEST`.
//!
//! What changes: a holder no longer learns from a store-lease renewal that someone replaced
//! that store's lease object (by hand, or a waiter misjudging the fence); it learns it from the
//! first refused conditional write, which drops the lease as any concurrent writer does. That
//! is the price of not spending requests on idle stores.
//!
//! # Restarts
//!
//! A restarted process has a new nonce, so a new holder id. It takes its instance lease over at
//! once when the previous holder id is in [`InstanceLeaseConfig::proven_dead`] (the registry's
//! instance claim, or a local lock, proves that process dead), otherwise by the ordinary rules.
//! Holding it, it takes at once every store lease that names it as fence under an older holder
//! id: taking an instance lease over means its former holder stopped.
//!
//! # What a crash leaves
//!
//! The instance lease object and the store lease objects naming it; a successor takes them as
//! above. A clean stop releases every store lease (each worker's shutdown) and then, in
//! [`InstanceLeases::release_all`], the instance leases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::{
    Acquisition, BucketLease, DEFAULT_TTL, LeaseAcquirer, LeaseConfig, LeaseError, LeaseHandle,
    LeaseStatus,
};
use crate::bucket::{self, DynBucket};

/// The directory (file://) or key prefix (s3://) of a lease root.
pub const LEASE_DIR: &str = ".mushroom-backup";
/// Where instance leases are under a lease root.
pub const INSTANCES_PREFIX: &str = "instances/";

/// The lease root of a destination: see the module docs. `None` for a URL that is neither
/// `s3://` nor an absolute `file://` path below `/`.
pub fn lease_root(destination: &str) -> Option<String> {
    if destination.starts_with("s3://") {
        // The query (endpoint, region, profile: `bucket::url`) names where the bucket is: the
        // lease root is in the same bucket on the same endpoint. Parsed and written back in
        // one canonical form, so that two spellings of one query are one root: two roots
        // would renew one instance lease object under one holder id, each taking it from the
        // other in turn.
        return match crate::bucket::url::parse(destination).ok()? {
            crate::bucket::url::DestinationUrl::S3 {
                bucket, settings, ..
            } => Some(format!("s3://{bucket}/{LEASE_DIR}{}", settings.query())),
            crate::bucket::url::DestinationUrl::File(_) => None,
        };
    }
    let path = destination.strip_prefix("file://")?;
    let path = path.trim_end_matches('/');
    let (parent, name) = path.rsplit_once('/')?;
    if name.is_empty() || !path.starts_with('/') {
        return None;
    }
    Some(format!("file://{parent}/{LEASE_DIR}"))
}

/// `destination` with a `file://` path resolved (symbolic links, `..`) when it exists, so that
/// two spellings of one directory share one lease root: two roots holding one lease object
/// under one holder id would take it from each other in turn.
fn resolved(destination: &str) -> String {
    match destination.strip_prefix("file://") {
        Some(path) => match std::fs::canonicalize(path) {
            Ok(p) => format!("file://{}", p.display()),
            Err(_) => destination.to_string(),
        },
        None => destination.to_string(),
    }
}

/// The key of an instance lease under its lease root: `instances/<id>.lease`, every byte of the
/// id but ASCII letters, digits, `-` and `_` escaped as `%XX`.
pub fn key_for(instance_id: &str) -> String {
    let mut name = String::with_capacity(instance_id.len());
    for b in instance_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            name.push(char::from(b));
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{INSTANCES_PREFIX}{name}.lease")
}

/// How this process's instance leases are taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceLeaseConfig {
    pub instance_id: String,
    /// This process's holder id: `<instance id>/<nonce>`.
    pub holder: String,
    pub host: String,
    pub ttl: Duration,
    pub conditional: bool,
    /// Renewals on the process's tick grid ([`LeaseConfig::coalesce`]).
    pub coalesce: bool,
    /// Holder ids proven to have stopped: an instance lease naming one is taken at once.
    pub proven_dead: Vec<String>,
}

impl InstanceLeaseConfig {
    /// The defaults for `instance_id` in a process whose nonce is `nonce`.
    pub fn new(instance_id: &str, nonce: &str) -> InstanceLeaseConfig {
        InstanceLeaseConfig {
            instance_id: instance_id.to_string(),
            holder: holder_id(instance_id, nonce),
            host: super::host_name(),
            ttl: DEFAULT_TTL,
            conditional: true,
            coalesce: true,
            proven_dead: Vec::new(),
        }
    }
}

/// The holder id of the process with `nonce` running `instance_id`.
pub fn holder_id(instance_id: &str, nonce: &str) -> String {
    format!("{instance_id}/{nonce}")
}

/// This process's instance leases, one per lease root, acquired on first use.
#[derive(Clone)]
pub struct InstanceLeases {
    inner: Arc<Inner>,
}

struct Inner {
    config: InstanceLeaseConfig,
    tasks: TaskTracker,
    /// Opens each lease root: the instance's S3 clients and bucket token.
    opener: bucket::Opener,
    roots: Mutex<HashMap<String, Arc<Root>>>,
    /// Set by [`InstanceLeases::release_all`]: nothing is acquired after it.
    closed: AtomicBool,
}

/// One lease root and its instance lease.
struct Root {
    url: String,
    key: String,
    bucket: DynBucket,
    state: tokio::sync::Mutex<RootState>,
}

struct RootState {
    acquirer: LeaseAcquirer,
    lease: Option<BucketLease>,
    /// The last "held elsewhere" answer and until when it stands (so that a thousand stores
    /// waiting on it do not each ask the bucket).
    elsewhere: Option<(Instant, Elsewhere)>,
}

#[derive(Clone)]
struct Elsewhere {
    holder: String,
    host: String,
    store: String,
    seen_unchanged_for: Duration,
}

/// What holding a fence gave.
pub(super) enum FenceHold {
    Held(LeaseHandle),
    /// Another process holds the instance lease (an [`Acquisition::HeldElsewhere`]).
    Elsewhere(Acquisition),
}

/// The instance lease of one lease root, for the stores under it: see
/// [`LeaseAcquirer::fenced`].
#[derive(Clone)]
pub struct Fence {
    inner: Arc<Inner>,
    root: Arc<Root>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("root", &self.root.url)
            .field("key", &self.root.key)
            .finish_non_exhaustive()
    }
}

impl InstanceLeases {
    /// Renewal tasks are spawned through `tasks`; lease roots are opened by `opener`.
    pub fn new(
        config: InstanceLeaseConfig,
        tasks: &TaskTracker,
        opener: bucket::Opener,
    ) -> InstanceLeases {
        InstanceLeases {
            inner: Arc::new(Inner {
                config,
                tasks: tasks.clone(),
                opener,
                roots: Mutex::new(HashMap::new()),
                closed: AtomicBool::new(false),
            }),
        }
    }

    pub fn config(&self) -> &InstanceLeaseConfig {
        &self.inner.config
    }

    /// The fence of a store backed up to `destination`: its lease root's instance lease (the
    /// root is opened once, on first use).
    pub async fn fence_for(&self, destination: &str) -> Result<Fence, LeaseError> {
        let url = lease_root(&resolved(destination)).ok_or_else(|| LeaseError::FenceRoot {
            url: destination.to_string(),
            reason: "only s3:// and file:///PARENT/NAME destinations have a lease root".into(),
        })?;
        if let Some(root) = self.root(&url) {
            return Ok(self.fence(root));
        }
        let bucket = self
            .inner
            .opener
            .read_write(&url)
            .refusing_root_link()
            .open()
            .await
            .map_err(|e| LeaseError::FenceRoot {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        Ok(self.fence_at(&url, bucket))
    }

    /// The fence at the lease root `bucket`, known as `url` (tests; a root opened elsewhere).
    /// The first bucket given for a `url` is the one used.
    pub fn fence_at(&self, url: &str, bucket: DynBucket) -> Fence {
        let mut roots = self.inner.roots.lock().unwrap_or_else(|e| e.into_inner());
        let root = roots
            .entry(url.to_string())
            .or_insert_with(|| {
                let c = &self.inner.config;
                let config = LeaseConfig {
                    ttl: c.ttl,
                    holder: c.holder.clone(),
                    host: c.host.clone(),
                    store: format!("instance {}", c.instance_id),
                    conditional: c.conditional,
                    coalesce: c.coalesce,
                };
                let key = key_for(&c.instance_id);
                let acquirer = LeaseAcquirer::new(bucket.clone(), config)
                    .at_key(&key)
                    .tracked(self.inner.tasks.clone())
                    .proven_dead(c.proven_dead.clone());
                Arc::new(Root {
                    url: url.to_string(),
                    key,
                    bucket,
                    state: tokio::sync::Mutex::new(RootState {
                        acquirer,
                        lease: None,
                        elsewhere: None,
                    }),
                })
            })
            .clone();
        drop(roots);
        self.fence(root)
    }

    fn root(&self, url: &str) -> Option<Arc<Root>> {
        let roots = self.inner.roots.lock().unwrap_or_else(|e| e.into_inner());
        roots.get(url).cloned()
    }

    fn fence(&self, root: Arc<Root>) -> Fence {
        Fence {
            inner: self.inner.clone(),
            root,
        }
    }

    /// At start (`service::fleet`): when another live process holds the instance lease of
    /// `destination`'s lease root under this very instance id (a holder id
    /// `<instance id>/<another nonce>` the bucket's clock shows renewed within its TTL: a
    /// dead one's is taken), that holder and its host. Holding the lease otherwise (one
    /// request, which the first store's worker would send anyway).
    pub async fn shared_with(
        &self,
        destination: &str,
    ) -> Result<Option<(String, String, String)>, LeaseError> {
        let fence = self.fence_for(destination).await?;
        let prefix = format!("{}/", self.inner.config.instance_id);
        Ok(match fence.hold().await? {
            FenceHold::Elsewhere(Acquisition::HeldElsewhere { holder, host, .. })
                if holder.starts_with(&prefix) =>
            {
                Some((fence.root.url.clone(), holder, host))
            }
            _ => None,
        })
    }

    /// Each lease root and the status of its instance lease, while held.
    pub async fn status(&self) -> Vec<(String, LeaseStatus)> {
        let roots: Vec<Arc<Root>> = {
            let roots = self.inner.roots.lock().unwrap_or_else(|e| e.into_inner());
            roots.values().cloned().collect()
        };
        let mut out = Vec::new();
        for root in roots {
            if let Some(lease) = &root.state.lock().await.lease {
                out.push((root.url.clone(), lease.status()));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Releases every instance lease (deleting its object, so a successor acquires at once),
    /// and acquires none after. Call it once every store under them has stopped.
    pub async fn release_all(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let roots: Vec<Arc<Root>> = {
            let roots = self.inner.roots.lock().unwrap_or_else(|e| e.into_inner());
            roots.values().cloned().collect()
        };
        for root in roots {
            let lease = root.state.lock().await.lease.take();
            if let Some(lease) = lease {
                match lease.release().await {
                    Ok(outcome) => {
                        tracing::info!(root = %root.url, ?outcome, "released the instance lease")
                    }
                    Err(e) => {
                        tracing::warn!(root = %root.url, error = %e, "cannot release the instance lease; a successor takes it over after a TTL")
                    }
                }
            }
        }
    }
}

impl Fence {
    /// The instance lease, acquired first if this process does not hold it (again).
    pub(super) async fn hold(&self) -> Result<FenceHold, LeaseError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(LeaseError::Cancelled);
        }
        let mut state = self.root.state.lock().await;
        if let Some(lease) = &state.lease {
            if lease.may_write() {
                return Ok(FenceHold::Held(lease.handle()));
            }
            // Lost: a new acquisition, and a new lease.
            state.lease = None;
        }
        let now = Instant::now();
        if let Some((until, e)) = &state.elsewhere
            && now < *until
        {
            return Ok(FenceHold::Elsewhere(Acquisition::HeldElsewhere {
                holder: e.holder.clone(),
                host: e.host.clone(),
                store: e.store.clone(),
                seen_unchanged_for: e.seen_unchanged_for,
                retry_in: *until - now,
            }));
        }
        // Boxed: the instance lease's acquirer is not fenced, but its type is the one that
        // calls this.
        match Box::pin(state.acquirer.try_acquire()).await? {
            Acquisition::Acquired(lease) => {
                let handle = lease.handle();
                state.lease = Some(lease);
                state.elsewhere = None;
                Ok(FenceHold::Held(handle))
            }
            Acquisition::HeldElsewhere {
                holder,
                host,
                store,
                seen_unchanged_for,
                retry_in,
            } => {
                let c = &self.inner.config;
                tracing::warn!(
                    root = %self.root.url, key = %self.root.key, %holder, %host,
                    ours = %c.holder, our_host = %c.host,
                    "the instance lease is held by another process with this instance id: \
                     give each `serve` sharing a bucket its own instance id"
                );
                let e = Elsewhere {
                    holder,
                    host,
                    store,
                    seen_unchanged_for,
                };
                state.elsewhere = Some((Instant::now() + retry_in, e.clone()));
                Ok(FenceHold::Elsewhere(Acquisition::HeldElsewhere {
                    holder: e.holder,
                    host: e.host,
                    store: e.store,
                    seen_unchanged_for: e.seen_unchanged_for,
                    retry_in,
                }))
            }
        }
    }

    /// The instance lease's key under its lease root.
    pub fn key(&self) -> &str {
        &self.root.key
    }

    /// This process's holder id.
    pub fn holder(&self) -> &str {
        &self.inner.config.holder
    }

    pub fn ttl(&self) -> Duration {
        self.inner.config.ttl
    }

    /// The lease root's bucket.
    pub fn bucket(&self) -> DynBucket {
        self.root.bucket.clone()
    }

    /// The lease root's URL.
    pub fn url(&self) -> &str {
        &self.root.url
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_roots() {
        assert_eq!(
            lease_root("s3://b/fleet/store-1").as_deref(),
            Some("s3://b/.mushroom-backup")
        );
        assert_eq!(
            lease_root("s3://b").as_deref(),
            Some("s3://b/.mushroom-backup")
        );
        assert_eq!(
            lease_root("s3://b?region=r").as_deref(),
            Some("s3://b/.mushroom-backup?region=r")
        );
        assert_eq!(
            lease_root("s3://b/p/q?endpoint=http://h:1").as_deref(),
            Some("s3://b/.mushroom-backup?endpoint=http%3A%2F%2Fh%3A1")
        );
        // Issue 40, finding 3: two spellings of one query are one root.
        let one = lease_root("s3://b/x?endpoint=http://h:1&region=r");
        for other in [
            "s3://b/y?region=r&endpoint=http://h:1",
            "s3://b/y?region=r&endpoint=http%3A%2F%2Fh%3A1%2F",
            "s3://b?endpoint=HTTP://H:1/&region=r",
        ] {
            assert_eq!(lease_root(other), one, "{other}");
        }
        assert_ne!(lease_root("s3://b/y?region=q&endpoint=http://h:1"), one);
        assert_eq!(
            lease_root("file:///backups/store-1/").as_deref(),
            Some("file:///backups/.mushroom-backup")
        );
        assert_eq!(
            lease_root("file:///store-1").as_deref(),
            Some("file:///.mushroom-backup")
        );
        for bad in [
            "file:///",
            "file://relative/x",
            "s3://",
            "s3://b/p?regoin=r",
            "mem://x",
            "/tmp/x",
        ] {
            assert_eq!(lease_root(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_escape_all_but_plain_characters() {
        assert_eq!(key_for("host-1_a"), "instances/host-1_a.lease");
        assert_eq!(key_for("a.b/../c"), "instances/a%2Eb%2F%2E%2E%2Fc.lease");
        let named = super::super::FenceRef {
            key: key_for("a.b/../c"),
            holder: "h".into(),
        };
        assert!(named.is_plausible());
        for bad in [
            "lease",
            "instances/../x.lease",
            "instances/.lease",
            "x/instances/a.lease",
        ] {
            let f = super::super::FenceRef {
                key: bad.into(),
                holder: "h".into(),
            };
            assert!(!f.is_plausible(), "{bad}");
        }
    }
}
