//! A node's `ReportPosition` stream, once attached to a store hosted here: its reports go to
//! the store's streamed source (each nudging the worker), the store's refresh asks go back as
//! commands. One task of the fleet's tracker per stream.
//!
//! The stream ends `UNAVAILABLE` at shutdown, `UNAVAILABLE` naming the new owner when the
//! store moved (the node reconnects and is relayed there), `NOT_FOUND` when it was
//! deregistered, and `INVALID_ARGUMENT` at a report for another store or a bad position. When
//! it ends the report stops counting, and the worker looks again. Nothing of it outlives the
//! stream: a crash leaves nothing behind.
//!
//! Durable acknowledgements (issue 27, `crate::worker::durable`): the stream also carries the
//! worker's durable position — how far a restore of the prefix reaches now — as a `Durable`
//! command when the stream attaches (if one is known) and whenever it advances, never lower
//! than the last one sent. When the worker's chain breaks (a lost or taken-over lease, another
//! writer, the worker stopping) the stream says `DurabilityLost` with the reason before any
//! later `Durable`, even if the break and the new chain's first position came between two
//! looks (the chain counter says so). The stream ending says nothing durable either: a node
//! fails its pending waits then.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::error::ServiceError;
use super::request::{self, position};
use crate::service::fleet::{Fleet, StoreEntry};
use crate::service::proto;
use crate::wal_source::StreamAttachment;
use crate::worker::durable::{Durability, DurablePosition};

/// The commands a node's position stream answers with.
pub(crate) type CommandStream =
    Pin<Box<dyn Stream<Item = Result<proto::NodeCommand, Status>> + Send>>;

/// Serves `inbound` (its first report already recorded by `attachment`) until it, the store
/// or the service ends.
pub(super) fn pump(
    fleet: &Arc<Fleet>,
    attachment: StreamAttachment,
    entry: Arc<StoreEntry>,
    mut inbound: Streaming<proto::PositionReport>,
    shutdown: CancellationToken,
) -> CommandStream {
    let store_id = entry.record.store_id.clone();
    let fleet = fleet.clone();
    let tasks = fleet.tasks.clone();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut durable = entry.handle.watch_durable();
    tasks.spawn(async move {
        let mut attachment = attachment;
        // What this stream was told last: the chain, and the position in it.
        let mut told = Told::default();
        durable.mark_changed();
        // The stream's report stops counting when it ends: the worker looks again then.
        let _nudge = NudgeOnEnd(entry);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = tx.send(Err(ServiceError::ShuttingDown.into())).await;
                    return;
                }
                _ = attachment.closed() => {
                    // UNAVAILABLE naming the new owner (the node reconnects and is
                    // relayed there), else NOT_FOUND (deregistered).
                    let end = match crate::service::cluster::failover::moved_to(&fleet, &store_id).await {
                        Some(owner) => ServiceError::Moved { store: store_id.clone(), owner },
                        None => ServiceError::Deregistered(store_id.clone()),
                    };
                    let _ = tx.send(Err(end.into())).await;
                    return;
                }
                msg = inbound.next() => match msg {
                    None => return,
                    Some(Err(e)) => {
                        tracing::debug!(%store_id, error = %e, "a position stream ended");
                        return;
                    }
                    Some(Ok(r)) => {
                        match request::same_store(&store_id, &r).and_then(|()| position(&r)) {
                            Ok(p) => {
                                tracing::trace!(%store_id, commit_seq = p.commit_seq, "position report");
                                attachment.report(p);
                                // A resting worker and supervisor look at it.
                                _nudge.0.nudge();
                            }
                            Err(e) => {
                                let _ = tx.send(Err(ServiceError::from(e).into())).await;
                                return;
                            }
                        }
                    }
                },
                changed = durable.changed() => {
                    if changed.is_err() {
                        // The worker is gone: the stream ends with the store below.
                        continue;
                    }
                    let now = durable.borrow_and_update().clone();
                    tracing::trace!(%store_id, position = ?now.position, "durable position to the node");
                    for cmd in told.commands(&now) {
                        if tx.send(Ok(cmd)).await.is_err() {
                            return;
                        }
                    }
                }
                refresh = attachment.refresh.recv() => match refresh {
                    Ok(reason) => {
                        let cmd = proto::NodeCommand {
                            command: Some(proto::node_command::Command::Refresh(proto::Refresh { reason })),
                        };
                        if tx.send(Ok(cmd)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// What one stream was told of the durable position.
#[derive(Default)]
struct Told {
    chain: u64,
    position: Option<DurablePosition>,
}

impl Told {
    /// The commands that bring the node from what it was told to `now`.
    fn commands(&mut self, now: &Durability) -> Vec<proto::NodeCommand> {
        use proto::node_command::Command;
        let mut out = Vec::new();
        if now.chain != self.chain {
            // Only a stream that was told something has something to lose.
            if self.position.is_some() {
                out.push(Command::DurabilityLost(proto::DurabilityLost {
                    reason: now.broken.clone().unwrap_or_default(),
                }));
            }
            self.chain = now.chain;
            self.position = None;
        }
        if let Some(p) = now.position
            && self.position != Some(p)
        {
            self.position = Some(p);
            out.push(Command::Durable(proto::Durable {
                commit_seq: p.commit_seq,
                generation: p.generation,
                named_by_restore_point: p.in_restore_point,
            }));
        }
        out.into_iter()
            .map(|c| proto::NodeCommand { command: Some(c) })
            .collect()
    }
}

/// Nudges the store's worker ([`crate::worker::BackupHandle::nudge`]) when dropped.
struct NudgeOnEnd(Arc<StoreEntry>);

impl Drop for NudgeOnEnd {
    fn drop(&mut self) {
        self.0.nudge();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::node_command::Command;

    fn at(generation: u64, commit_seq: u64) -> Option<DurablePosition> {
        Some(DurablePosition {
            generation,
            commit_seq,
            in_restore_point: false,
        })
    }

    fn kinds(cmds: Vec<proto::NodeCommand>) -> Vec<String> {
        cmds.into_iter()
            .map(|c| match c.command {
                Some(Command::Durable(d)) => format!("durable {}", d.commit_seq),
                Some(Command::DurabilityLost(l)) => format!("lost: {}", l.reason),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// A break (a lost lease) between two looks still says `DurabilityLost` before the new
    /// chain's first position, even when that position is higher: the node fails the waits
    /// pending at the break instead of acknowledging them on the new chain's word.
    #[test]
    fn a_chain_break_is_told_before_any_later_position() {
        let mut told = Told::default();
        let d = |chain, position, broken: Option<&str>| Durability {
            chain,
            position,
            broken: broken.map(str::to_string),
        };
        assert!(kinds(told.commands(&d(0, None, None))).is_empty());
        assert_eq!(kinds(told.commands(&d(0, at(1, 5), None))), ["durable 5"]);
        assert!(kinds(told.commands(&d(0, at(1, 5), None))).is_empty());
        assert_eq!(
            kinds(told.commands(&d(1, at(2, 9), Some("the bucket lease expired")))),
            ["lost: the bucket lease expired", "durable 9"]
        );
        // A break with nothing published since: the node, told nothing on this chain, has
        // nothing more to lose.
        assert_eq!(
            kinds(told.commands(&d(2, None, Some("stopped")))),
            ["lost: stopped"]
        );
        assert!(kinds(told.commands(&d(3, None, Some("again")))).is_empty());
    }
}
