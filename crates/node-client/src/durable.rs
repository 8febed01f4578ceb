//! Waiting until a commit is in the bucket: the service's `Durable` and `DurabilityLost`
//! commands on the position stream, as a watch ([`NodeClient::durable`]) and a wait
//! ([`NodeClient::wait_durable`]).
//!
//! # What an acknowledgement means
//!
//! The service sends `Durable { commit_seq }` when a restore of the store's prefix, run now,
//! reaches `commit_seq` (the service's `worker/durable.rs`). An engine in `durability = sync`
//! holds a commit's acknowledgement to its own client until `wait_durable(commit_seq)` returns:
//! then losing the node's host loses no acknowledged commit.
//!
//! # Never a fabricated ack
//!
//! The client counts **epochs**: one ends whenever what the service vouched for may no longer
//! hold — a `DurabilityLost` (the service's lease was lost or taken over, another writer, the
//! worker stopped), the stream breaking or ending (the owner moved, the service went down),
//! the client closing or being refused. Each wait belongs to the epoch it started in: when that
//! epoch ends before its commit was acknowledged, the wait fails with
//! [`NodeClientError::DurabilityLost`] naming why, never succeeds on a later epoch's word. A
//! wait started later belongs to the new epoch, and the new stream's first `Durable` (the
//! service sends its position when a stream attaches) resumes acknowledgements. The position
//! within an epoch never goes down. Nothing of this is stored: a crashed node has no pending
//! waits to answer.
//!
//! # Waiting makes reports urgent
//!
//! While anyone listens for acknowledgements — a `wait_durable` pending, or a receiver from
//! `durable()` alive (both are receivers of one watch, so its receiver count says it) — the
//! client sends each report at once instead of waiting out `min_report_interval`: a wait
//! would otherwise pay the spacing on top of the service's PUT. Starting to listen wakes a
//! spacing already under way. With nobody listening, reports coalesce as before.

use std::time::Duration;

use tokio::sync::watch;

use crate::{ConnectionState, NodeClient, NodeClientError, Shared};

/// A commit the service says a restore reaches now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableAck {
    pub commit_seq: u64,
    /// The generation of the restore point a restore starts from.
    pub generation: u64,
    /// Whether the restore point LATEST names holds exactly this far.
    pub named_by_restore_point: bool,
}

/// The durable position as this client knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurableView {
    /// Counts the ends of epochs (see the module docs).
    pub epoch: u64,
    /// The highest acknowledgement of this epoch; `None` until its first.
    pub ack: Option<DurableAck>,
    /// Why the last epoch ended.
    pub lost: Option<String>,
}

/// The client's side of the watch.
pub(crate) type DurableTx = watch::Sender<DurableView>;

/// Whether anyone listens for acknowledgements (see the module docs): one atomic load.
pub(crate) fn awaited(shared: &Shared) -> bool {
    shared.durable.receiver_count() > 0
}

/// A `Durable` command: raises the position of this epoch, never lowers it.
pub(crate) fn acknowledged(tx: &DurableTx, ack: DurableAck) {
    tx.send_if_modified(|v| {
        if v.ack.is_some_and(|a| a.commit_seq > ack.commit_seq) {
            return false;
        }
        let changed = v.ack != Some(ack);
        v.ack = Some(ack);
        changed
    });
}

/// The epoch ends (see the module docs): pending waits fail with `reason`.
pub(crate) fn lost(tx: &DurableTx, reason: String) {
    tx.send_modify(|v| {
        v.epoch += 1;
        v.ack = None;
        v.lost = Some(reason);
    });
}

impl NodeClient {
    /// The durable position as the service last acknowledged it, changing whenever it does.
    /// While a receiver is alive, reports go at once (see the module docs): drop it when
    /// acknowledgements no longer matter.
    pub fn durable(&self) -> watch::Receiver<DurableView> {
        let rx = self.shared.durable.subscribe();
        self.shared.urgent.notify_one();
        rx
    }

    /// Waits until the service says a restore reaches `commit_seq` (the commit is in the
    /// bucket). Fails with [`NodeClientError::DurabilityLost`] when the epoch it started in ends
    /// first (see the module docs), [`NodeClientError::NotDurable`] after `timeout`, and the
    /// client's error when it is closed or refused. Returns the acknowledgement that covered it.
    pub async fn wait_durable(
        &self,
        commit_seq: u64,
        timeout: Duration,
    ) -> Result<DurableAck, NodeClientError> {
        let mut rx = self.durable();
        let mut progress = self.shared.progress.subscribe();
        let epoch = rx.borrow().epoch;
        let wait = async {
            loop {
                {
                    let v = rx.borrow_and_update();
                    if v.epoch != epoch {
                        return Err(NodeClientError::DurabilityLost(
                            v.lost.clone().unwrap_or_default(),
                        ));
                    }
                    if let Some(ack) = v.ack.filter(|a| a.commit_seq >= commit_seq) {
                        return Ok(ack);
                    }
                }
                let state = progress.borrow_and_update().state;
                match state {
                    ConnectionState::Failed => {
                        return Err(self.last_error().unwrap_or(NodeClientError::Closed));
                    }
                    ConnectionState::Closed => return Err(NodeClientError::Closed),
                    _ => {}
                }
                tokio::select! {
                    r = rx.changed() => if r.is_err() { return Err(NodeClientError::Closed) },
                    r = progress.changed() => if r.is_err() { return Err(NodeClientError::Closed) },
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(NodeClientError::NotDurable {
                commit_seq,
                waited: timeout,
            }),
        }
    }
}
