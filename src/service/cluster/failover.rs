//! Failover groups (issue 15 part 4): when an instance goes silent, a live instance of its
//! failover group claims each of its stores and runs it; an instance whose stores were
//! claimed (or moved, `super::moves`) while it ran stops their workers.
//!
//! One task of the fleet's tracker ([`run`]), ending on the fleet's cancellation token. Every
//! [`round_period`] (a quarter of `--owner-silent-after-ms`, between 100 ms and 5 s) it does,
//! in order:
//!
//! 1. **Reconcile** (every instance, grouped or not): one registry query of the stores this
//!    instance owns ([`crate::registry::Registry::owned_stores`]). A worker running here for a
//!    store the registry gives to another instance is stopped without a flush and taken out
//!    of the fleet ([`Fleet::unhost`]); nothing is deleted, and its position streams end with
//!    `UNAVAILABLE` naming the new owner (the node reconnects and is relayed there). A store
//!    the registry gives to this instance that has no worker here and that was *given* to it
//!    (owned since after its registration: a planned move whose target was not told, a claim
//!    whose start failed once) is started, once per change of owner ([`Fleet::host`]). A
//!    store owned since its registration is never started here: a registration starts its
//!    own worker just after writing its row, and a respawn that failed at start stays failed
//!    (as before) until the next start.
//! 2. **Claims** (only with `--failover-group`, and only while this instance's own heartbeat is
//!    fresh: an instance cut off from the registry claims nothing): every instance of the
//!    group whose heartbeat is older than `--owner-silent-after-ms` is silent ([`live_member`],
//!    the one test of liveness that claims, moves and drains use). When one is, the stores are
//!    listed once for the round (whatever the number of silent members). For each store of a
//!    silent member: this instance claims it at once when it is the store's preferred claimant (the
//!    store id hashed, FNV-1a, onto the group's live members sorted by id: so the stores of a
//!    dead instance spread over the survivors), and any live member claims it once the owner
//!    has been silent for twice the limit (the preferred one may be unable to see it). A claim:
//!    - checks that this instance sees the store's directory ([`sees`]): inside its allowed
//!      roots, a real directory, and the store the prefix backs up as the worker's own lineage
//!      rule decides it ([`crate::worker::lineage::decide`], against the restore point LATEST
//!      names: the same lineage and at least its commits, or an adopted store whose
//!      `backup.parent` LATEST still names); a store that never backed up has no LATEST to
//!      compare and only needs a `store.meta` or `wal.bin`. Read through [`StoreDir`] like
//!      every read of a store: links, FIFOs and oversized files refused. A store it cannot
//!      see stays with its owner (and unhealthy there, as the owner's silence makes it); the
//!      verdict is remembered (`failover/unseen.rs`) until the store's row changes or
//!      [`unseen::RECHECK_AFTER_ROUNDS`] rounds pass, then it is checked again;
//!    - compare-and-sets the row ([`crate::registry::Registry::change_owner`]): exactly one
//!      claimant wins;
//!    - the winner audits it (`failover`), publishes `owner_changed` ("claimed from A (silent
//!      N s)") and starts the worker ([`Fleet::host`]).
//!
//! # A single writer through the handover
//!
//! The registry decides who *should* run a store; the bucket lease still decides who *writes*
//! (`crate::lease`). The claimant's worker finds the store lease naming the silent owner's
//! instance lease, and waits as any standby does until it has seen that instance lease
//! unchanged for a lease TTL on its own clock (or the lease is gone); only then does it take
//! the store lease. A silent owner that is still alive (cut off from the registry but not from
//! the bucket) keeps renewing its instance lease and so keeps the only right to write; the
//! claimant stays standby until that owner's reconcile (once it reaches the registry again)
//! stops the worker and releases the store lease, or the owner dies.
//!
//! Timeline after an owner's death at t = 0, with S = `--owner-silent-after-ms`, H =
//! `--health-report-interval-ms` (the heartbeat) and T = `--lease-ttl-ms`: its last heartbeat
//! is at most H old at 0; it counts as silent from about S − H to S; the preferred claimant
//! claims at its next round (S/4 later at most), and the others after 2S; the new worker takes
//! the lease once it has watched the dead instance lease for T (or at once when the bucket's
//! own clock says it is unwritten for T), looking again every T/3. So the store is written
//! again by about S + S/4 + T + T/3. S must be longer than a restart takes (a rolling
//! upgrade restarts an instance with the same id, which loads only the rows it still owns),
//! and much longer than H.
//!
//! # What a crash leaves
//!
//! - Before the compare-and-set: nothing changed; the next claimant (or this one restarted)
//!   claims.
//! - After it, before the worker started: the row names this instance, which on restart
//!   loads it like any of its stores; had it died for good, it is silent in turn and another
//!   member claims the store from it.
//! - The old owner coming back: a restart loads only the rows naming it; a process that ran
//!   on (a partition) stops the claimed stores' workers at its next reconcile.
//! - The audit row or the event may be missing (the row is the truth).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::events::{EventKind, NewEvent};
use crate::registry::{Claimed, InstanceInfo, StoreRecord};
use crate::service::fleet::paths;
use crate::service::fleet::{Done, Fleet, FleetError};
use crate::store::dir::StoreDir;
use crate::worker::lineage::{self, Decision, NewestRestorePoint};

mod unseen;
use unseen::Unseen;

/// How long `i` has not been heard from at `now` (milliseconds since its last heartbeat).
pub fn quiet_ms(i: &InstanceInfo, now: i64) -> i64 {
    now.saturating_sub(i.heartbeat_ms)
}

/// Whether `i` is a live member of `group` at `now`: in the group, and heard from within
/// `silent_ms`. The one test of claims, moves and drains.
pub fn live_member(i: &InstanceInfo, group: &str, now: i64, silent_ms: i64) -> bool {
    i.failover_group == group && quiet_ms(i, now) <= silent_ms
}

/// How often the task looks: a quarter of the silence limit, within 100 ms..=5 s.
pub fn round_period(owner_silent_after: Duration) -> Duration {
    (owner_silent_after / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// The stable hash that spreads stores over a group's members (FNV-1a, 64 bits): the same on
/// every instance and every build.
pub fn spread_hash(store_id: &str) -> u64 {
    store_id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The member of `live` (sorted ids) that claims `store_id` first.
pub fn preferred<'a>(store_id: &str, live: &[&'a str]) -> Option<&'a str> {
    let n = u64::try_from(live.len()).ok().filter(|n| *n > 0)?;
    let i = usize::try_from(spread_hash(store_id) % n).ok()?;
    live.get(i).copied()
}

/// The failover task (see the module docs): until the fleet's shutdown.
pub async fn run(fleet: Arc<Fleet>) {
    let mut tick = tokio::time::interval(round_period(fleet.config().owner_silent_after));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    // Stores given to this instance that it tried to start, by the owner_since_ms it tried.
    let mut tried: HashMap<String, i64> = HashMap::new();
    // Stores of silent members this instance cannot see (`failover/unseen.rs`).
    let mut unseen = Unseen::default();
    loop {
        tokio::select! {
            _ = fleet.shutdown_token().cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = reconcile(&fleet, &mut tried).await {
            tracing::warn!(error = %e, "failover: cannot reconcile this instance's stores with the registry");
            continue;
        }
        if let Some(group) = fleet.config().peers.failover_group.clone()
            && let Err(e) = claim_round(&fleet, &group, &mut unseen).await
        {
            tracing::warn!(error = %e, "failover: cannot look for silent members of the group");
        }
    }
}

/// Step 1: stops what was taken from this instance, starts what was given to it.
async fn reconcile(fleet: &Arc<Fleet>, tried: &mut HashMap<String, i64>) -> Result<(), FleetError> {
    let owned = fleet
        .registry()
        .owned_stores(&fleet.config().instance_id)
        .await?;
    for entry in fleet.list() {
        let id = &entry.record.store_id;
        if owned.contains_key(id) || fleet.shutdown_token().is_cancelled() {
            continue;
        }
        // A store registered now writes its row before its worker starts, so a worker without
        // a row naming this instance was claimed away, moved, or is being deregistered.
        let Some(owner) = fleet.registry().store_owner(id).await?.map(|(o, _)| o) else {
            continue; // deregistered: Deregister stops it itself.
        };
        if owner == fleet.config().instance_id {
            continue;
        }
        tracing::warn!(store_id = %id, %owner, "the registry gives this store to another instance: stopping its worker here (no flush, nothing deleted)");
        if fleet.unhost(id).await.is_some() {
            let detail = format!("stopped here: instance {owner} owns the store now");
            let event = NewEvent::new(EventKind::OwnerChanged, id, detail.clone());
            let done = Done::on("release", &entry.record, detail, None);
            fleet.record(done, Some(event)).await;
        }
    }
    tried.retain(|id, _| owned.contains_key(id));
    for (id, since) in owned {
        if fleet.get(&id).is_ok() || tried.get(&id) == Some(&since) {
            continue;
        }
        tried.insert(id.clone(), since);
        // Only a store *given* to this instance (a claim, a move: owned since after it was
        // registered); a registration starts its own worker just after writing its row.
        let Some(record) = fleet.registry().get_store(&id).await? else {
            continue;
        };
        if record.registered_at_ms >= since {
            continue;
        }
        match fleet.host(record).await {
            Ok(_) => tracing::info!(store_id = %id, "started a store given to this instance"),
            Err(e) => {
                tracing::error!(store_id = %id, error = %e, "cannot start a store given to this instance")
            }
        }
    }
    Ok(())
}

/// Step 2: claims the stores of the group's silent members (see the module docs).
async fn claim_round(
    fleet: &Arc<Fleet>,
    group: &str,
    unseen: &mut Unseen,
) -> Result<(), FleetError> {
    let me = fleet.config().instance_id.clone();
    let silent_ms = crate::units::millis_i64(fleet.config().owner_silent_after);
    let instances = fleet.registry().instances().await?;
    let now = crate::units::unix_now_ms();
    let live_here = |i: &&InstanceInfo| live_member(i, group, now, silent_ms);
    // Cut off from the registry (or reporting late): this instance may be the silent one.
    if !instances
        .iter()
        .any(|i| i.instance_id == me && live_here(&i))
    {
        return Ok(());
    }
    let live: Vec<&str> = instances
        .iter()
        .filter(live_here)
        .map(|i| i.instance_id.as_str())
        .collect();
    // Each silent member, and for how long it has been.
    let silent: BTreeMap<&str, i64> = instances
        .iter()
        .filter(|i| i.failover_group == group && !live_here(i))
        .map(|i| (i.instance_id.as_str(), quiet_ms(i, now)))
        .collect();
    let stores = match silent.is_empty() {
        true => Vec::new(),
        // One listing a round, however many members are silent.
        false => fleet.registry().list_stores(None).await?,
    };
    let stores: Vec<(StoreRecord, i64)> = stores
        .into_iter()
        .filter_map(|r| {
            let quiet = *silent.get(r.instance_id.as_str())?;
            Some((r, quiet))
        })
        .collect();
    unseen.start_round(stores.iter().map(|(r, _)| r));
    for (record, quiet) in &stores {
        if fleet.shutdown_token().is_cancelled() {
            return Ok(());
        }
        let anyone = *quiet > silent_ms.saturating_mul(2);
        if !anyone && preferred(&record.store_id, &live) != Some(me.as_str()) {
            continue;
        }
        if unseen.stands(record) {
            continue;
        }
        if let Err(why) = sees(fleet, record).await {
            if unseen.remember(record, &why) {
                tracing::warn!(store_id = %record.store_id, owner = %record.instance_id, "failover: not claiming a silent owner's store: {why}");
            }
            continue;
        }
        unseen.forget(&record.store_id);
        claim(fleet, record, &record.instance_id, *quiet).await?;
    }
    Ok(())
}

/// Compare-and-sets one store's row from `from` to this instance; the winner starts it.
async fn claim(
    fleet: &Arc<Fleet>,
    record: &StoreRecord,
    from: &str,
    quiet: i64,
) -> Result<(), FleetError> {
    let me = &fleet.config().instance_id;
    let id = &record.store_id;
    // Strictly after the registration: how the reconcile tells a given store from a new one.
    let now = crate::units::unix_now_ms().max(record.registered_at_ms + 1);
    match fleet.registry().change_owner(id, from, me, now).await? {
        Claimed::Won => {}
        Claimed::Lost { owner } => {
            tracing::info!(store_id = %id, %owner, "failover: another instance claimed the store first");
            return Ok(());
        }
        Claimed::Gone => return Ok(()),
    }
    let detail = format!("claimed from {from} (silent {} s)", quiet / 1000);
    tracing::warn!(store_id = %id, %from, "failover: {detail}");
    let event = NewEvent::new(EventKind::OwnerChanged, id, detail.clone());
    let done = Done {
        action: "failover",
        store_id: id,
        store_dir: &record.store_dir,
        detail,
        peer: None,
    };
    fleet.record(done, Some(event)).await;
    let mut record = record.clone();
    record.instance_id = me.clone();
    record.owner_since_ms = now;
    if let Err(e) = fleet.host(record).await {
        // The row stays this instance's: the next start (or an operator's move) retries.
        tracing::error!(store_id = %id, error = %e, "failover: claimed a store but cannot start its worker");
    }
    Ok(())
}

/// Where a store whose position stream's source closed here went: the instance that owns it
/// now when that is another one (the node reconnects and is relayed there), `None` when none
/// does (deregistered, or the registry cannot say).
pub async fn moved_to(fleet: &Fleet, store_id: &str) -> Option<String> {
    match fleet.registry().store_owner(store_id).await {
        Ok(Some((owner, _))) if owner != fleet.config().instance_id => Some(owner),
        _ => None,
    }
}

/// Whether this instance sees `record`'s store directory (see the module docs): `Err` says why
/// not.
pub async fn sees(fleet: &Fleet, record: &StoreRecord) -> Result<(), String> {
    let roots = fleet.config().allow_roots.clone();
    let dir = paths::check_store_dir(&record.store_dir, &roots).map_err(|e| e.to_string())?;
    let store = StoreDir::confined(dir, roots);
    let local = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || read_identity(&store))
            .await
            .map_err(|e| format!("the directory check failed: {e}"))??
    };
    let bucket = fleet
        .buckets()
        .read_only(&record.destination)
        .open()
        .await
        .map_err(|e| format!("destination {}: {e}", record.destination))?;
    let latest = match crate::latest::read(bucket.as_ref()).await {
        Ok(Some(found)) => found
            .latest
            .map_err(|e| format!("the prefix's {}: {e}", found.key))?,
        Ok(None) if local.has_store => return Ok(()),
        Ok(None) => {
            return Err(format!(
                "{} holds no store (no store.meta or wal.bin)",
                record.store_dir
            ));
        }
        Err(e) => return Err(format!("reading the prefix's LATEST: {e}")),
    };
    // The worker's own rule, as its resume applies it: a store it would refuse is not claimed.
    let commit_seq = durable_commits(&store, local.locked)
        .await
        .map_err(|e| format!("{}: its durable commits: {e}", record.store_dir))?;
    let newest = NewestRestorePoint::named_by(&latest);
    match lineage::decide(
        local.lineage,
        local.parent.as_ref(),
        commit_seq,
        Some(newest),
        uuid::Uuid::nil, // never asked for: the prefix has a restore point
    ) {
        Decision::Proceed { .. } => Ok(()),
        Decision::Refuse(why) => Err(format!(
            "{}: its worker would refuse it: {why}",
            record.store_dir
        )),
    }
}

/// How many commits the store holds durably: `wal.position` while a node holds `store.lock`,
/// else `wal.bin`'s valid frames (the sources a worker without a node stream reads).
async fn durable_commits(store: &StoreDir, locked: bool) -> Result<u64, String> {
    use crate::wal_source::{FileSource, OfflineSource, WalSource};
    let pos = match locked {
        true => FileSource::new(store.clone()).durable_wal_position().await,
        false => {
            OfflineSource::new(store.clone())
                .durable_wal_position()
                .await
        }
    };
    pos.map(|p| p.commit_seq).map_err(|e| e.to_string())
}

/// What a directory says of the store in it.
struct Identity {
    lineage: Option<uuid::Uuid>,
    parent: Option<crate::store::format::ParentRecord>,
    /// A `store.meta` or `wal.bin` (regular files).
    has_store: bool,
    /// A node holds `store.lock`.
    locked: bool,
}

fn read_identity(store: &StoreDir) -> Result<Identity, String> {
    use crate::store::dir::FileKind;
    use crate::store::disk::{
        META_FILE, WAL_FILE, lock_is_held_in, read_lineage_in, read_parent_in,
    };
    match store.check() {
        Ok(true) => {}
        Ok(false) => return Err(format!("{} does not exist here", store.path().display())),
        Err(e) => return Err(e.to_string()),
    }
    let has = |name: &str, kind: FileKind| {
        store
            .stat(name, kind)
            .map(|s| s.is_some())
            .map_err(|e| e.to_string())
    };
    Ok(Identity {
        lineage: read_lineage_in(store).map_err(|e| e.to_string())?,
        parent: read_parent_in(store).map_err(|e| e.to_string())?,
        has_store: has(META_FILE, FileKind::Side)? || has(WAL_FILE, FileKind::Store)?,
        locked: lock_is_held_in(store).map_err(|e| e.to_string())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn stores_spread_over_the_live_members_and_always_to_one() {
        let live = ["a", "b", "c"];
        let mut counts = BTreeMap::new();
        for i in 0..300 {
            let id = format!("00000000-0000-4000-8000-{i:012}");
            let p = preferred(&id, &live).unwrap();
            assert_eq!(preferred(&id, &live), Some(p));
            *counts.entry(p).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.values().all(|n| *n > 50), "{counts:?}");
        assert_eq!(preferred("x", &[]), None);
    }

    #[test]
    fn the_round_is_a_quarter_of_the_silence_limit_within_bounds() {
        assert_eq!(
            round_period(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            round_period(Duration::from_millis(10)),
            Duration::from_millis(100)
        );
        assert_eq!(
            round_period(Duration::from_secs(600)),
            Duration::from_secs(5)
        );
    }
}
