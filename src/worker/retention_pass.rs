//! A retention pass from outside a worker: `mushroom-backup retention --from URL` without
//! `--dry-run`. It runs the worker's own retention (`retention.rs`: the same selection,
//! [`super::retention::keep`], the same safety rule, the same order of deletes), once for each
//! lineage with a restore point in the prefix.
//!
//! # The one writer
//!
//! The caller holds the prefix's bucket lease, taken as a worker takes it, and runs [`pass`]
//! under [`crate::lease::BucketLease::guard`]: no worker writes while it runs, and a lease
//! that stops holding drops the pass mid-request.
//!
//! # What each lineage's run keeps
//!
//! As a worker's pass: LATEST's manifest and the lineage's newest restore point are never
//! deleted; the lineage's newest generation is treated as the one being shipped, so none of its
//! objects is deleted (segments a stopped worker shipped past its newest manifest are continued
//! by its next resume); an object goes only when no remaining manifest of *any* lineage names
//! it, a generation's wrapped data keys only after its last named object, its claim last and
//! never the highest in the prefix; a generation claimed within `orphan_grace` is left alone;
//! while any manifest is unreadable, no object is deleted.
//!
//! # What a crash leaves
//!
//! What retention's does: manifests go first, then the objects no remaining manifest names,
//! then an emptied generation's key wrappers, then its claim. A crash between any two requests
//! leaves every remaining manifest whole (it names nothing deleted) and LATEST naming one of
//! them; what is left over is unnamed objects, which the next pass (or a worker's) deletes.

use std::collections::{BTreeMap, HashMap};

use super::view::{Generation, View};
use super::{RetentionPolicy, StepOutcome, WorkerError};
use crate::bucket::{self, BucketError, DynBucket};
use crate::manifest::{self, Manifest};

/// What a pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    /// Lineages with a restore point in the prefix, each given a run.
    pub lineages: u64,
    /// Objects deleted (manifests, data objects, key wrappers, claims).
    pub deleted: u64,
    /// What each live branch cut from the prefix is charged: the bytes it keeps alive only
    /// through its pin (`crate::pins::Charge`).
    pub branch_charges: Vec<crate::pins::Charge>,
}

/// Every manifest under `manifests/`, read: `None` for one that does not decode (retention
/// then deletes no object); one deleted between the listing and its read is left out. One
/// listing and a GET per manifest; the pass and `retention --dry-run` both start from it.
pub async fn read_manifests(
    bucket: &DynBucket,
) -> Result<HashMap<String, Option<Manifest>>, BucketError> {
    let mut manifests = HashMap::new();
    for o in bucket::list_all(bucket.as_ref(), manifest::MANIFESTS_PREFIX).await? {
        if manifest::parse_manifest_key(&o.key).is_none() {
            continue;
        }
        let m = match bucket.get(&o.key).await {
            Ok(got) => Manifest::decode(&o.key, &got.data).ok(),
            Err(BucketError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        manifests.insert(o.key, m);
    }
    Ok(manifests)
}

/// One retention pass over every lineage of the prefix; see the module docs. The caller holds
/// the bucket lease.
pub async fn pass(bucket: &DynBucket, policy: &RetentionPolicy) -> Result<PassReport, WorkerError> {
    let latest = match crate::latest::read(bucket.as_ref()).await? {
        Some(found) => Some((
            found.latest.map_err(|e| WorkerError::BadBucket {
                key: found.key,
                detail: e.to_string(),
            })?,
            found.version,
        )),
        None => None,
    };
    let mut manifests = read_manifests(bucket).await?;
    // Each lineage's newest restore point: protected, and its generation the "current" one.
    let mut newest: BTreeMap<uuid::Uuid, Manifest> = BTreeMap::new();
    for m in manifests.values().flatten() {
        let slot = newest.entry(m.lineage).or_insert_with(|| m.clone());
        if m.commit_seq > slot.commit_seq {
            *slot = m.clone();
        }
    }
    let activity = crate::health::StepActivity::default();
    let mut report = PassReport::default();
    let mut claims = HashMap::new();
    let mut pins = HashMap::new();
    for (lineage, own_newest) in newest {
        let mut view = View {
            lineage,
            parent: None,
            origin: None,
            latest: latest.clone(),
            max_generation: own_newest.generation,
            current: Some(Generation::from_manifest(&own_newest)),
            newest_own: Some(own_newest),
            skip_restore_point_at: None,
            // What was read is read once: each run lists `manifests/` again and reads only
            // what it has not seen, and drops what is gone.
            manifests: std::mem::take(&mut manifests),
            claims: std::mem::take(&mut claims),
            found_empty_at: None,
            settled: Default::default(),
            keys: HashMap::new(),
            wrappers: HashMap::new(),
            pins: std::mem::take(&mut pins),
            branch_charges: Vec::new(),
        };
        let outcome = super::retention::run(bucket, &activity, &mut view, policy).await?;
        if let StepOutcome::Retention { deleted } = outcome {
            report.deleted += deleted;
        }
        report.lineages += 1;
        // Every run reads every lineage's manifests: the last one's charges are the pass's.
        report.branch_charges = std::mem::take(&mut view.branch_charges);
        manifests = view.manifests;
        claims = view.claims;
        pins = view.pins;
    }
    Ok(report)
}
