//! A node's `ReportPosition` stream, once attached to a store hosted here: its reports go to
//! the store's streamed source (each nudging the worker), the store's refresh asks go back as
//! commands. One task of the fleet's tracker per stream.
//!
//! The stream ends `UNAVAILABLE` at shutdown, `UNAVAILABLE` naming the new owner when the
//! store moved (the node reconnects and is relayed there), `NOT_FOUND` when it was
//! deregistered, and `INVALID_ARGUMENT` at a report for another store or a bad position. When
//! it ends the report stops counting, and the worker looks again. Nothing of it outlives the
//! stream: a crash leaves nothing behind.

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
    tasks.spawn(async move {
        let mut attachment = attachment;
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
                                attachment.report(p);
                                // A resting worker and supervisor look at it.
                                _nudge.0.handle.nudge();
                            }
                            Err(e) => {
                                let _ = tx.send(Err(ServiceError::from(e).into())).await;
                                return;
                            }
                        }
                    }
                },
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

/// Nudges the store's worker ([`crate::worker::BackupHandle::nudge`]) when dropped.
struct NudgeOnEnd(Arc<StoreEntry>);

impl Drop for NudgeOnEnd {
    fn drop(&mut self) {
        self.0.handle.nudge();
    }
}
