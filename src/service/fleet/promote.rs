//! `Promote`: a standby store (`standby.rs`) becomes the primary of its destination.
//!
//! # The steps
//! 1. Refuse what is not a standby here (a primary: [`PromoteError::NotStandby`]; a store of
//!    another instance: forwarded to its owner by the edge), and a promotion of the same store
//!    already under way ([`PromoteError::InProgress`]).
//! 2. Stop the follower and wait for it to end (its `store.lock` released).
//!
//! Steps 3 to 5 are the sequence the CLI's `promote` runs too, written once in the library
//! (`crate::standby::promotion::promote_fenced`):
//!
//! 3. A prefix whose LATEST names an adopter already (another promotion won) is refused,
//!    naming the winner's lineage, before the lease is touched.
//! 4. **Take over** from the old writer (`standby::takeover`: take the lease over at once and
//!    wait out the old holder's window or deadline, or with `wait_for_lease` wait until the
//!    lease is stale, else refuse naming why).
//! 5. Catch up, adopt and claim LATEST (`crate::standby::promote`). Of two racing promotions
//!    one wins; the other is refused at its claim, naming the winner. A failure releases the
//!    lease.
//! 6. The registry row's options lose `standby` (a restart of `serve` runs the store as a
//!    primary), the lease is handed over, unreleased, to the store's backup worker, started
//!    as any primary's (`Fleet::spawn`: the service's lease machinery, under its instance
//!    lease; the lease is its holder id's, so taken at once: `standby/takeover.rs`).
//!
//! The steps run in a task of the fleet's tracker, not in the caller's future: a client that
//! goes away, or the call's timeout, does not cut a promotion half way.
//!
//! # A promotion that fails
//! After step 5 (adopted and claimed), a worker that does not start is an error naming it
//! ([`PromoteError::WorkerNotStarted`]): the store is no standby any more, and the next start
//! of the service starts its worker from the row. Before step 5 wrote anything (refused, fenced out, the bucket down): the lease (if taken)
//! is released and the follower started again: the store is a standby as before, its health
//! naming nothing new (the call's error says why). A failure in step 5 leaves what
//! `standby::promote` leaves (see its docs); the follower is started again too, and stops
//! naming why if the prefix went to another lineage.
//!
//! # What a crash leaves
//! Before step 6's row update: a standby row; the next start follows the prefix again, and a
//! prefix promoted meanwhile (LATEST claimed for this directory's new lineage) makes it stop,
//! unhealthy, naming the lineage (the directory holds the promoted store: deregister it and
//! register it as a primary, which backs it up). After the row update: a primary row, whose
//! worker backs the promoted directory up.

use std::sync::Arc;

use super::standby::StandbyEntry;
use super::{Done, Fleet, FleetError};
use crate::lease::LeaseConfig;
use crate::standby::promotion::{self, Promotion, PromotionError};
use crate::standby::takeover::TakeoverError;
use crate::standby::{StandbyError, StandbyOptions};

/// Why a promotion was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error(
        "store {0} is a primary, not a standby: there is nothing to promote (a standby is \
         registered with `ctl standby`, StoreOptions.standby)"
    )]
    NotStandby(String),
    #[error("a promotion of store {0} is under way already")]
    InProgress(String),
    #[error(
        "another promotion of store {0} ended meanwhile (see its answer): call again if the \
         store is still a standby"
    )]
    Raced(String),
    #[error(
        "refused, nothing changed: the prefix was promoted already: LATEST gives restore point \
         {manifest} to lineage {winner}; this standby stays a standby (deregister it, or \
         follow the new primary with a new standby)"
    )]
    AlreadyPromoted { manifest: String, winner: String },
    #[error("refused, nothing changed: {0}")]
    Takeover(#[from] TakeoverError),
    #[error("{0}")]
    Standby(#[from] StandbyError),
    #[error("the destination: {0}")]
    Bucket(#[from] crate::bucket::BucketError),
    /// Promoted (LATEST claimed, the registry row a primary's), but the worker did not start.
    #[error(
        "promoted to lineage {lineage} at commit {commit_seq}, but its backup worker could not \
         start: {why}; restart the service to start it (the registry records it as a primary)"
    )]
    WorkerNotStarted {
        lineage: String,
        commit_seq: u64,
        why: String,
    },
}

impl PromoteError {
    /// Whether the bucket failed (the caller may retry), rather than a refusal.
    pub fn is_unavailable(&self) -> bool {
        match self {
            PromoteError::Bucket(_) => true,
            PromoteError::Takeover(TakeoverError::Lease(_)) => true,
            PromoteError::Standby(e) => e.is_transient(),
            _ => false,
        }
    }
}

/// What a promotion did.
#[derive(Debug, Clone)]
pub struct Promoted {
    pub store_id: String,
    pub lineage: String,
    pub commit_seq: u64,
    pub parent_manifest: String,
    pub fenced: Option<String>,
}

impl Fleet {
    /// Promotes the standby `store_id` (see the module docs).
    pub async fn promote(
        self: &Arc<Self>,
        store_id: &str,
        wait_for_lease: bool,
        peer: Option<String>,
    ) -> Result<Promoted, FleetError> {
        super::admission::limits::check_store_id(store_id)?;
        let Some(entry) = self.standby(store_id) else {
            return Err(match self.get(store_id) {
                Ok(_) => PromoteError::NotStandby(store_id.to_string()).into(),
                Err(FleetError::NotHere(_)) => {
                    // Registered elsewhere, or not at all.
                    self.get_owned(store_id)
                        .await
                        .err()
                        .unwrap_or_else(|| FleetError::NotHere(store_id.to_string()))
                }
                Err(e) => e,
            });
        };
        let fleet = self.clone();
        let id = store_id.to_string();
        let task = self
            .tasks
            .spawn(async move { fleet.promote_standby(entry, wait_for_lease).await });
        let done = task
            .await
            .map_err(|e| FleetError::Internal(format!("the promotion's task: {e}")))?;
        let dir = self
            .get(&id)
            .map(|e| e.record.store_dir.clone())
            .unwrap_or_default();
        match done {
            Ok(p) => {
                let detail = format!(
                    "promoted at commit {} to lineage {} (parent {}){}",
                    p.commit_seq,
                    p.lineage,
                    p.parent_manifest,
                    p.fenced
                        .as_ref()
                        .map(|f| format!("; took the lease over from {f}"))
                        .unwrap_or_default()
                );
                let mut event = crate::events::NewEvent::new(
                    crate::events::EventKind::Promoted,
                    &id,
                    detail.clone(),
                );
                event.facts.commit_seq = Some(p.commit_seq);
                let done = Done {
                    action: "promote",
                    store_id: &id,
                    store_dir: &dir,
                    detail,
                    peer,
                };
                self.record(done, Some(event)).await;
                Ok(p)
            }
            Err(e) => {
                let why = e.to_string();
                self.audit("promote", Some(&id), None, "refused", why, peer)
                    .await;
                Err(e)
            }
        }
    }

    async fn promote_standby(
        self: Arc<Self>,
        entry: Arc<StandbyEntry>,
        wait_for_lease: bool,
    ) -> Result<Promoted, FleetError> {
        let id = entry.record.store_id.clone();
        let Ok(_promoting) = entry.promoting.try_lock() else {
            return Err(PromoteError::InProgress(id).into());
        };
        match self.standby(&id) {
            Some(now) if Arc::ptr_eq(&now, &entry) => {}
            // Promoted, deregistered, or following again after a failed promotion, by the call
            // that held the lock before.
            Some(_) => return Err(PromoteError::Raced(id).into()),
            None => return Err(PromoteError::NotStandby(id).into()),
        }
        entry.stop().await;
        match self.fence_and_adopt(&entry, wait_for_lease).await {
            Ok(promoted) => Ok(promoted),
            Err(e @ FleetError::Promote(PromoteError::WorkerNotStarted { .. })) => {
                // Adopted and claimed: no standby any more, whatever the worker does.
                self.hosted.remove_standby(&id);
                Err(e)
            }
            Err(e) => {
                // Still a standby: follow again (see the module docs).
                tracing::warn!(store_id = %id, error = %e, "the promotion failed; the store follows its destination again");
                self.hosted.remove_standby(&id);
                let again = self
                    .spawn_standby(entry.record.clone(), entry.options.clone())
                    .await;
                if let Err(s) = again {
                    tracing::error!(store_id = %id, error = %s, "cannot follow the destination again");
                }
                Err(e)
            }
        }
    }

    /// Steps 3 to 6 of the module docs, the follower stopped.
    async fn fence_and_adopt(
        &self,
        entry: &StandbyEntry,
        wait_for_lease: bool,
    ) -> Result<Promoted, FleetError> {
        let record = &entry.record;
        let dir =
            super::admission::paths::check_store_dir(&record.store_dir, &self.config.allow_roots)?;
        let bucket = self.buckets.read_write(&record.destination).open().await?;
        let instance_fence = self
            .leases
            .fence_for(&record.destination)
            .await
            .map_err(|e| FleetError::LeaseRoot(e.to_string()))?;
        let lease = LeaseConfig {
            ttl: self.config.lease_ttl,
            conditional: self.config.worker.conditional_writes,
            holder: instance_fence.holder().to_string(),
            ..LeaseConfig::new(record.store_id.clone())
        };
        let opts = StandbyOptions {
            keys: self.restore_keys(),
            ..StandbyOptions::default()
        };
        let promotion =
            promotion::promote_fenced(bucket, &dir, lease, wait_for_lease, &opts, &self.shutdown)
                .await
                .map_err(PromoteError::from)?;
        let Promotion { adopted, fenced } = promotion;
        let previous = fenced.previous.clone();
        // A primary from now on, in the registry too.
        let mut options = entry.options.clone();
        options.standby = None;
        if let Err(e) = self
            .registry
            .set_store_options(&record.store_id, &options.to_row())
            .await
        {
            tracing::error!(store_id = %record.store_id, error = %e, "the registry row still says standby: a restart would follow the prefix again (and stop, naming the promotion)");
        }
        let mut primary = record.clone();
        primary.options = options.to_row();
        fenced.hand_over().await;
        // The primary takes the standby's place in the map (`spawn`); if it cannot start, the
        // store is no standby any more either.
        if let Err(e) = self.spawn(primary, options, None).await {
            self.hosted.remove_standby(&record.store_id);
            tracing::error!(store_id = %record.store_id, error = %e, "promoted, but the backup worker could not start");
            return Err(PromoteError::WorkerNotStarted {
                lineage: adopted.new_lineage.to_string(),
                commit_seq: adopted.applied.commit_seq,
                why: e.to_string(),
            }
            .into());
        }
        tracing::info!(store_id = %record.store_id, lineage = %adopted.new_lineage, commit_seq = adopted.applied.commit_seq, "promoted a standby: it is the primary now");
        Ok(Promoted {
            store_id: record.store_id.clone(),
            lineage: adopted.new_lineage.to_string(),
            commit_seq: adopted.applied.commit_seq,
            parent_manifest: adopted.parent.manifest.clone(),
            fenced: previous,
        })
    }
}

impl From<PromotionError> for PromoteError {
    fn from(e: PromotionError) -> PromoteError {
        match e {
            PromotionError::AlreadyPromoted(c) => PromoteError::AlreadyPromoted {
                manifest: c.manifest,
                winner: c.adopter.to_string(),
            },
            PromotionError::Takeover(e) => PromoteError::Takeover(e),
            PromotionError::Promote(e) => PromoteError::Standby(e),
            PromotionError::Bucket(e) => PromoteError::Bucket(e),
        }
    }
}
