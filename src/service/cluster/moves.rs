//! Planned moves (issue 15 part 5): `Move` gives one store to another live instance of its
//! owner's failover group, `Drain` every store of an instance (before maintenance), with no
//! commit lost and never two writers.
//!
//! # A move, at the owner (the call is forwarded there like any store call)
//!
//! 1. **Checks, which change nothing when they refuse** ([`MoveError`], `FAILED_PRECONDITION`
//!    naming why): the store runs here; the target is another instance the registry knows,
//!    in this instance's failover group (both have one), heard from within
//!    `--owner-silent-after-ms`; and the target sees the store's directory: the owner asks it
//!    (`CanHost`, an instance-to-instance call with the admin token, answered by
//!    [`super::failover::sees`] on the target).
//! 2. **Flush and stop**: the worker ships everything durable, writes a restore point, stops,
//!    and releases its bucket lease (a clean [`crate::worker::BackupHandle::shutdown`]). From
//!    here the store is written by nobody until the target starts; the node goes on
//!    committing into the shared directory, and its commits are shipped by the target.
//!    **A paused store is not flushed**: a pause stops every upload, the last flush included
//!    (`crate::service::ops::pause`), and a move does not end it. Its worker stops without uploading
//!    anything and releases the lease; its pause row, keyed by the store, follows it, so the
//!    target starts it paused ([`Fleet::host`] reads the row) and uploads nothing until
//!    `Resume`, which ships everything durable since the pause from the target (the
//!    directory is shared). Moving is how an operator empties an instance for maintenance,
//!    which says nothing about the bucket's pause: so it neither refuses a paused store
//!    (a drain would then leave it behind, on the instance going down) nor resumes it. The
//!    answer's restore point is then the bucket's, as health shows it while paused.
//! 3. **The row** is compare-and-set from this instance to the target
//!    ([`crate::registry::Registry::change_owner`]), then the store is taken out of this
//!    fleet; its position streams end `UNAVAILABLE` naming the target, so the node reconnects
//!    and is relayed there. Audited (`move`) and published (`owner_changed`).
//! 4. **The target is told** to start it (`Host`); should that call fail, the target's
//!    reconcile (`super::failover`) starts it within a round anyway.
//!
//! Never two writers: the old worker has stopped and released the lease before the row
//! changes, and the target starts only after; the lease would keep one writer even if not.
//!
//! # Drain
//!
//! Moves every store of the instance, each to the live member of its group that
//! [`super::failover::preferred`] picks for it among the live members but this one, up to
//! `DrainRequest.parallel` at once ([`drain_parallel`]: 0 means [`DEFAULT_DRAIN_PARALLEL`],
//! at most [`MAX_DRAIN_PARALLEL`]). Each store's move is the move above, unchanged, and
//! concerns that store only: a store that cannot move stays where it was (a refusal changes
//! nothing; a failure after the stop runs it here again, as for one `Move`) and is listed
//! with why, and the other moves go on. The answer lists every store, moved or not, in the
//! order the fleet lists them; a failure line is cut at [`MAX_FAILED_LINE`] bytes, which
//! bounds the answer of a drain of 10,000 stores (`forward.rs`, "How large a forwarded
//! message may be"). Parallel moves overlap what one move waits for (the flush's uploads,
//! the registry, the target's answers); the bound keeps a drain from flushing the whole
//! instance's stores into the bucket and the target at once.
//!
//! # What a crash leaves
//!
//! - During the checks: nothing changed.
//! - After the stop, before the compare-and-set: the row still names the owner. A restart of
//!   the owner respawns the store; an owner that died for good is silent, and its group
//!   claims the store as after any death.
//! - After the compare-and-set, before the target started: the row names the target, whose
//!   reconcile starts it (or which loads it on its next start).
//! - A compare-and-set whose answer was lost: the owner re-reads the row and restarts its
//!   worker if the row still names it.

use std::sync::Arc;

use futures::StreamExt as _;
use tonic::metadata::MetadataMap;

use super::forward::{ForwardError, Peers};
use super::{ClusterError, failover};
use crate::events::{EventKind, NewEvent};
use crate::registry::Claimed;
use crate::service::fleet::limits::{self, FieldError};
use crate::service::fleet::{Done, Fleet, FleetError};
use crate::service::proto;

/// Why a move was refused (nothing changed), or what went wrong after it began.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("the store already runs on instance {0}: nothing to move")]
    ToSelf(String),
    #[error(
        "instance {me} has no failover group: a store moves only within one (serve --failover-group)"
    )]
    NoGroup { me: String },
    #[error(
        "instance {to} is in failover group {theirs:?}, not {ours:?}: a store moves only within its group"
    )]
    OtherGroup {
        to: String,
        ours: String,
        theirs: String,
    },
    #[error(
        "instance {to} has not been heard from for {quiet_ms} ms: a store moves only to a live instance"
    )]
    TargetSilent { to: String, quiet_ms: i64 },
    #[error("instance {to} cannot take store {store}: {why}")]
    TargetRefused {
        to: String,
        store: String,
        why: String,
    },
    #[error("no other live instance in failover group {group:?} to drain {me} to")]
    NowhereToDrain { me: String, group: String },
    #[error("store {store} was claimed by instance {owner} while it was being moved")]
    Raced { store: String, owner: String },
}

/// Moves `store_id`, which runs here, to `to` (see the module docs).
pub async fn move_store(
    fleet: &Arc<Fleet>,
    peers: &Peers,
    meta: &MetadataMap,
    store_id: &str,
    to: &str,
    peer: Option<String>,
) -> Result<proto::MoveResponse, ClusterError> {
    limits::check_store_id(store_id).map_err(FleetError::from)?;
    limits::check_text("to_instance_id", to, limits::MAX_INSTANCE_ID_BYTES)
        .map_err(FleetError::from)?;
    let entry = fleet.get_owned(store_id).await?;
    let me = fleet.config().instance_id.clone();
    let refused = |e: MoveError| async {
        fleet
            .audit(
                "move",
                Some(store_id),
                Some(&entry.record.store_dir),
                "refused",
                e.to_string(),
                peer.clone(),
            )
            .await;
        Err(ClusterError::from(e))
    };
    if to == me {
        return refused(MoveError::ToSelf(me)).await;
    }
    if let Err(e) = check_target(fleet, to).await? {
        return refused(e).await;
    }
    let asked = peers
        .hop_to(fleet, to, store_id, meta)
        .await?
        .try_call(
            proto::CanHostRequest {
                store_id: store_id.to_string(),
            },
            |mut c, r| async move { c.can_host(r).await },
        )
        .await?;
    if let Err(s) = asked {
        let why = s.message().to_string();
        let (to, store) = (to.to_string(), store_id.to_string());
        return refused(MoveError::TargetRefused { to, store, why }).await;
    }

    // From here the store changes hands: flush (unless paused: the pause gate skips the
    // flush, and the pause row follows the store to the target), stop, release the lease.
    entry.shutdown(true).await;
    let restore_point = entry.handle.health().restore_point_commit_seq;
    let paused = entry.handle.paused().is_some();
    let now = crate::units::unix_now_ms().max(entry.record.registered_at_ms + 1);
    let changed = fleet.registry().change_owner(store_id, &me, to, now).await;
    let outcome = match changed {
        Ok(c) => c,
        Err(e) => {
            // Indeterminate: run the store again unless the row is known to have moved (a
            // failed re-read runs it again too: the reconcile stops it if the row did move;
            // leaving it stopped would leave it unprotected until a restart).
            fleet.unhost(store_id).await;
            let owner = fleet.registry().store_owner(store_id).await;
            let moved =
                matches!(&owner, Ok(None)) || matches!(&owner, Ok(Some((o, _))) if *o != me);
            if !moved && let Err(e) = fleet.host(entry.record.clone()).await {
                tracing::error!(store_id, error = %e, "a move failed and the store cannot start again here");
            }
            return Err(FleetError::from(e).into());
        }
    };
    fleet.unhost(store_id).await;
    match outcome {
        Claimed::Won => {}
        Claimed::Lost { owner } => {
            return Err(MoveError::Raced {
                store: store_id.to_string(),
                owner,
            }
            .into());
        }
        Claimed::Gone => return Err(FleetError::UnknownStore(store_id.to_string()).into()),
    }
    let detail = format!(
        "moved from {me} to {to} (restore point {restore_point}){}",
        if paused {
            "; paused: moved without a flush, it stays paused on the target until Resume"
        } else {
            ""
        }
    );
    tracing::info!(store_id, "{detail}");
    let event = NewEvent::new(EventKind::OwnerChanged, store_id, detail.clone());
    let done = Done::on("move", &entry.record, detail, peer);
    fleet.record(done, Some(event)).await;
    tell_target_to_host(fleet, peers, meta, store_id, to).await;
    Ok(proto::MoveResponse {
        store_id: store_id.to_string(),
        from_instance_id: me,
        to_instance_id: to.to_string(),
        restore_point_commit_seq: restore_point,
    })
}

/// Asks the move's target to start the store at once (its reconcile would, within its
/// period, if it cannot be told).
async fn tell_target_to_host(
    fleet: &Arc<Fleet>,
    peers: &Peers,
    meta: &MetadataMap,
    store_id: &str,
    to: &str,
) {
    match peers.hop_to(fleet, to, store_id, meta).await {
        Ok(hop) => {
            let started = hop
                .try_call(
                    proto::HostRequest {
                        store_id: store_id.to_string(),
                    },
                    |mut c, r| async move { c.host(r).await },
                )
                .await;
            if !matches!(started, Ok(Ok(_))) {
                tracing::warn!(store_id, %to, "the move's target did not start the store at once; its reconcile will");
            }
        }
        Err(e) => {
            tracing::warn!(store_id, %to, error = %e, "cannot tell the move's target to start the store; its reconcile will")
        }
    }
}

/// The target is another live member of this instance's group: `Ok(Err(why))` when not.
async fn check_target(fleet: &Fleet, to: &str) -> Result<Result<(), MoveError>, ClusterError> {
    let me = &fleet.config().instance_id;
    let Some(ours) = fleet.config().peers.failover_group.clone() else {
        return Ok(Err(MoveError::NoGroup { me: me.clone() }));
    };
    let info = fleet
        .registry()
        .instance(to)
        .await
        .map_err(FleetError::from)?
        .ok_or_else(|| ForwardError::UnknownInstance(to.to_string()))?;
    if info.failover_group != ours {
        return Ok(Err(MoveError::OtherGroup {
            to: to.to_string(),
            ours,
            theirs: info.failover_group,
        }));
    }
    let now = crate::units::unix_now_ms();
    let silent_ms = crate::units::millis_i64(fleet.config().owner_silent_after);
    if !failover::live_member(&info, &ours, now, silent_ms) {
        return Ok(Err(MoveError::TargetSilent {
            to: to.to_string(),
            quiet_ms: failover::quiet_ms(&info, now),
        }));
    }
    Ok(Ok(()))
}

/// How many stores a drain moves at once when the request says 0.
pub const DEFAULT_DRAIN_PARALLEL: u32 = 4;

/// The most stores a drain moves at once.
pub const MAX_DRAIN_PARALLEL: u32 = 16;

/// The longest line of `DrainResponse.failed` ("STORE_ID: why"), in bytes.
pub const MAX_FAILED_LINE: usize = 1024;

/// `DrainRequest.parallel` as the number of moves at once (see the module docs).
pub fn drain_parallel(asked: u32) -> Result<usize, FieldError> {
    match asked {
        0 => Ok(DEFAULT_DRAIN_PARALLEL as usize),
        n if n <= MAX_DRAIN_PARALLEL => Ok(n as usize),
        n => Err(FieldError(format!(
            "parallel must be 0 (for {DEFAULT_DRAIN_PARALLEL}) to {MAX_DRAIN_PARALLEL} stores \
             moved at once, not {n}"
        ))),
    }
}

/// Moves every store of this instance to live members of its group, up to `parallel` at once
/// (see the module docs).
pub async fn drain(
    fleet: &Arc<Fleet>,
    peers: &Peers,
    meta: &MetadataMap,
    parallel: u32,
    peer: Option<String>,
) -> Result<proto::DrainResponse, ClusterError> {
    let parallel = drain_parallel(parallel).map_err(FleetError::from)?;
    let me = fleet.config().instance_id.clone();
    let Some(group) = fleet.config().peers.failover_group.clone() else {
        return Err(MoveError::NoGroup { me }.into());
    };
    let silent_ms = crate::units::millis_i64(fleet.config().owner_silent_after);
    let now = crate::units::unix_now_ms();
    let instances = fleet
        .registry()
        .instances()
        .await
        .map_err(FleetError::from)?;
    let live: Vec<&str> = instances
        .iter()
        .filter(|i| i.instance_id != me && failover::live_member(i, &group, now, silent_ms))
        .map(|i| i.instance_id.as_str())
        .collect();
    if live.is_empty() {
        return Err(MoveError::NowhereToDrain { me, group }.into());
    }
    let live = &live;
    let moves = fleet.list().into_iter().map(|entry| {
        let peer = peer.clone();
        async move {
            let id = entry.record.store_id.clone();
            let to = failover::preferred(&id, live).unwrap_or(live[0]);
            let moved = move_store(fleet, peers, meta, &id, to, peer).await;
            (id, moved)
        }
    });
    let mut out = proto::DrainResponse::default();
    let mut done = futures::stream::iter(moves).buffered(parallel);
    while let Some((id, moved)) = done.next().await {
        match moved {
            Ok(moved) => out.moved.push(moved),
            Err(e) => out.failed.push(failed_line(&id, &e.to_string())),
        }
    }
    Ok(out)
}

/// `"STORE_ID: why"`, cut at [`MAX_FAILED_LINE`] bytes (at a character, ending with `…`).
fn failed_line(id: &str, why: &str) -> String {
    let line = format!("{id}: {why}");
    if line.len() <= MAX_FAILED_LINE {
        return line;
    }
    let mut end = MAX_FAILED_LINE - '…'.len_utf8();
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// `CanHost` at a move's target: whether this instance sees the store's directory. Audited
/// (`can_host`), with its answer, as asked by `peer`.
pub async fn can_host(
    fleet: &Fleet,
    store_id: &str,
    peer: Option<String>,
) -> Result<(), ClusterError> {
    limits::check_store_id(store_id).map_err(FleetError::from)?;
    let answer: Result<String, ClusterError> = async {
        let record = registered(fleet, store_id).await?;
        failover::sees(fleet, &record).await.map_err(|why| {
            ClusterError::from(MoveError::TargetRefused {
                to: fleet.config().instance_id.clone(),
                store: store_id.to_string(),
                why,
            })
        })?;
        Ok(record.store_dir)
    }
    .await;
    audited(
        fleet,
        "can_host",
        store_id,
        answer,
        "sees the store's directory",
        peer,
    )
    .await
}

/// `Host` at a move's target: starts a store the registry gives to this instance. Audited
/// (`host`), with its outcome, as asked by `peer`.
pub async fn host(fleet: &Fleet, store_id: &str, peer: Option<String>) -> Result<(), ClusterError> {
    limits::check_store_id(store_id).map_err(FleetError::from)?;
    let answer: Result<String, ClusterError> = async {
        let record = registered(fleet, store_id).await?;
        if record.instance_id != fleet.config().instance_id {
            return Err(FleetError::OwnedElsewhere {
                store: store_id.to_string(),
                owner: record.instance_id,
            }
            .into());
        }
        let dir = record.store_dir.clone();
        fleet.host(record).await?;
        Ok(dir)
    }
    .await;
    audited(fleet, "host", store_id, answer, "started here", peer).await
}

/// The registry's record of `store_id`; an unknown store is [`FleetError::UnknownStore`].
async fn registered(
    fleet: &Fleet,
    store_id: &str,
) -> Result<crate::registry::StoreRecord, FleetError> {
    fleet
        .registry()
        .get_store(store_id)
        .await?
        .ok_or_else(|| FleetError::UnknownStore(store_id.to_string()))
}

/// Audits `action` on `store_id` with its answer (`ok` with `done`, else `refused` and why).
async fn audited(
    fleet: &Fleet,
    action: &str,
    store_id: &str,
    answer: Result<String, ClusterError>,
    done: &str,
    peer: Option<String>,
) -> Result<(), ClusterError> {
    let (dir, outcome, detail) = match &answer {
        Ok(dir) => (Some(dir.as_str()), "ok", done.to_string()),
        Err(e) => (None, "refused", e.to_string()),
    };
    fleet
        .audit(action, Some(store_id), dir, outcome, detail, peer)
        .await;
    answer.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_moves_one_to_sixteen_at_once_and_refuses_more() {
        assert_eq!(drain_parallel(0), Ok(4));
        assert_eq!(drain_parallel(1), Ok(1));
        assert_eq!(drain_parallel(16), Ok(16));
        let e = drain_parallel(17).unwrap_err();
        assert!(e.0.contains("parallel") && e.0.contains("17"), "{}", e.0);
    }

    #[test]
    fn a_failure_line_is_cut_at_its_bound_on_a_character() {
        let id = "0".repeat(36);
        assert_eq!(failed_line(&id, "why"), format!("{id}: why"));
        for why in ["é".repeat(2000), "x".repeat(2000)] {
            let line = failed_line(&id, &why);
            assert!(line.len() <= MAX_FAILED_LINE, "{}", line.len());
            assert!(line.len() > MAX_FAILED_LINE - 4, "{}", line.len());
            assert!(line.ends_with('…') && line.starts_with(&id));
        }
    }

    /// `forward.rs`'s bound (its module docs): a drain answer of 10,000 stores, all failed
    /// with the longest failure lines or all moved between instances of the longest ids, fits.
    #[test]
    fn the_largest_forwarded_message_fits() {
        use super::super::forward::FORWARD_MAX_MESSAGE as MAX;
        use prost::Message as _;
        let stores = 10_000;
        let id = "0".repeat(36);
        let instance = "i".repeat(limits::MAX_INSTANCE_ID_BYTES);
        let moved = proto::DrainResponse {
            moved: vec![
                proto::MoveResponse {
                    store_id: id.clone(),
                    from_instance_id: instance.clone(),
                    to_instance_id: instance.clone(),
                    restore_point_commit_seq: u64::MAX,
                };
                stores
            ],
            failed: Vec::new(),
        };
        let line = "x".repeat(MAX_FAILED_LINE);
        let failed = proto::DrainResponse {
            moved: Vec::new(),
            failed: vec![line; stores],
        };
        let (moved, failed) = (moved.encoded_len(), failed.encoded_len());
        eprintln!(
            "FIGURE drain answer of {stores} stores: all moved {moved} bytes, all failed {failed} bytes"
        );
        assert!(moved < MAX && failed < MAX, "{moved} {failed}");
        // Not so loose that it would hide a bound gone wrong.
        assert!(failed > MAX / 2, "{failed}");
    }
}
