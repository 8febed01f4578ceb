//! The runner while paused, holding the lease: it waits for Resume, shutdown or the lease to
//! stop holding, and uploads, writes and deletes nothing (`pause.rs`).
//!
//! # What the bucket holds, read while paused
//!
//! A pause stops writes, not reads (`pause.rs`: "no segment, archive, snapshot, side file,
//! manifest, LATEST or retention delete"). A runner that never learnt the bucket's state —
//! a service restarted with the store paused spawns it paused, so its first step never runs —
//! would otherwise report shipped 0 and restore point 0 until Resume, as if nothing were backed
//! up. So on entering the pause without a view of the bucket it reads **LATEST** (one GET, and
//! the store's `backup.lineage`, a local read): when LATEST is this store's lineage, its commit
//! is what the bucket holds — a restore point, and shipped at least that far — and the ledger
//! raises the shipped and restore-point positions to it (never lowers them: a worker paused
//! mid-run knows segments shipped past LATEST). Segments shipped past LATEST before the
//! restart are counted at Resume, whose step resumes from the bucket's state in full. LATEST of
//! another lineage (an adopted parent's), or none, books nothing.
//!
//! A restore reaches that restore point, so it is also the worker's **durable position**: the
//! manifest LATEST names is read (one more GET) for its generation, and the position is offered
//! as a step's would be (in `durability = sync`, released within the acknowledgement window of
//! a confirming read of the lease, `ack/window.rs`). Health's figures are published after it
//! (`worker::figures`), so a paused store never shows a restore point beside a restore that
//! reaches 0. A LATEST some other lineage adopted (`adopted_by`) is booked as before but
//! offers no position: this writer would be refused at Resume.
//!
//! A read that fails is retried with the worker's backoff while the pause lasts, each failure
//! counted as a failed step with its error: an unreachable bucket is as unhealthy paused as
//! not. The read never holds up a shutdown, a Resume or a lost lease: those drop it.
//!
//! What a crash leaves: nothing; the read writes nothing anywhere.

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

use super::{Holding, Runner};
use crate::backoff::Backoff;
use crate::bucket::DynBucket;
use crate::health::Activity;
use crate::lease::BucketLease;
use crate::manifest::Manifest;
use crate::store::dir::StoreDir;
use crate::worker::WorkerError;
use crate::worker::ack::{DurablePosition, Settled};

type Reading = Pin<Box<dyn Future<Output = Result<Option<OwnLatest>, WorkerError>> + Send>>;

/// What LATEST says when it is the store's lineage's.
struct OwnLatest {
    commit_seq: u64,
    /// The restore point as a durable position; `None` when another lineage adopted it.
    durable: Option<DurablePosition>,
}

/// LATEST's commit when LATEST is the store's lineage's (`None`: no LATEST, or another
/// lineage's, or the store has no lineage yet), with the generation of the manifest it names.
async fn latest_commit(
    bucket: DynBucket,
    store: StoreDir,
) -> Result<Option<OwnLatest>, WorkerError> {
    let Some(found) = crate::latest::read(bucket.as_ref()).await? else {
        return Ok(None);
    };
    let latest = found.latest.map_err(|e| WorkerError::BadBucket {
        key: found.key,
        detail: e.to_string(),
    })?;
    let dir = store.path().to_path_buf();
    let own = tokio::task::spawn_blocking(move || crate::store::disk::read_lineage_in(&store))
        .await
        .map_err(|e| WorkerError::Store {
            dir,
            detail: e.to_string(),
        })??;
    if own != Some(latest.lineage) {
        return Ok(None);
    }
    let durable = match latest.adopted_by {
        Some(_) => None,
        None => Some(restore_point(bucket.as_ref(), &latest.manifest).await?),
    };
    Ok(Some(OwnLatest {
        commit_seq: latest.commit_seq,
        durable,
    }))
}

/// The restore point the manifest `key` describes, as a durable position.
async fn restore_point(
    bucket: &dyn crate::bucket::Bucket,
    key: &str,
) -> Result<DurablePosition, WorkerError> {
    let bad = |detail: String| WorkerError::BadBucket {
        key: key.to_string(),
        detail,
    };
    let object = match bucket.get(key).await {
        Ok(o) => o,
        Err(crate::bucket::BucketError::NotFound { .. }) => {
            return Err(bad("LATEST names it, and it does not exist".into()));
        }
        Err(e) => return Err(e.into()),
    };
    let m = Manifest::decode(key, &object.data)
        .map_err(|e| bad(format!("LATEST names an invalid manifest: {e}")))?;
    Ok(DurablePosition {
        generation: m.generation,
        commit_seq: m.commit_seq,
        in_restore_point: true,
    })
}

impl Runner {
    /// Paused, holding the lease: waits for Resume (`None`: step on, from the bucket's state),
    /// shutdown or the lease to stop holding. Writes nothing; reads LATEST when the worker has
    /// no view of the bucket (module docs).
    pub(super) async fn hold_paused(&mut self, lease: &BucketLease) -> Option<Holding> {
        let mut gate = self.gate.subscribe();
        let lost = lease.token();
        let reason = gate.borrow_and_update().pause.as_ref()?.reason.clone();
        tracing::info!(store_id = %self.store_id, %reason, "paused: uploading nothing until Resume");
        self.record(|s| s.activity = Activity::Paused);
        let (bucket, store) = (self.worker.bucket.clone(), self.worker.store.clone());
        let read = move || -> Reading { Box::pin(latest_commit(bucket.clone(), store.clone())) };
        let mut reading = self.worker.view.is_none().then(&read);
        let mut retry_at: Option<Instant> = None;
        let mut backoff = Backoff::new(
            self.worker.config.first_backoff,
            self.worker.config.max_backoff,
        );
        loop {
            tokio::select! {
                _ = self.token.cancelled() => return Some(Holding::Shutdown),
                _ = lost.cancelled() => return Some(Holding::Lost),
                // The sender lives in `self.gate`: this wait ends only on a change.
                _ = gate.changed() => {}
                r = async { reading.as_mut().expect("guarded").await }, if reading.is_some() => {
                    reading = None;
                    match r {
                        Ok(found) => {
                            backoff.reset();
                            if let Some(found) = found {
                                self.worker.ledger.bucket_position(found.commit_seq);
                                if let Some(pos) = found.durable {
                                    self.worker.durable.offer(pos);
                                }
                                match self.ack.after_step(lease, &self.worker.durable, &self.token).await {
                                    Settled::Done => {}
                                    Settled::Lost => return Some(Holding::Lost),
                                    Settled::Shutdown => return Some(Holding::Shutdown),
                                }
                                self.worker.ledger.publish_figures(&self.worker.durable);
                            }
                            // The bucket answered: whatever failed before is over.
                            self.record(|s| s.consecutive_failures = 0);
                        }
                        Err(e) => {
                            tracing::warn!(store_id = %self.store_id, error = %e, "paused: reading LATEST failed");
                            self.record(|s| {
                                s.consecutive_failures += 1;
                                s.last_error = Some(format!("reading LATEST while paused: {e}"));
                            });
                            retry_at = Some(Instant::now() + backoff.next_delay());
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => {
                    retry_at = None;
                    reading = Some(read());
                    continue;
                }
            }
            if gate.borrow_and_update().pause.is_none() {
                drop(reading);
                tracing::info!(store_id = %self.store_id, "resumed: shipping what is durable");
                self.record(|s| s.activity = Activity::Idle);
                self.worker.forget_view();
                return None;
            }
        }
    }
}
