//! Holding what a write-once restore point reuses (issue 29): before its manifest is written,
//! every object the manifest names is held under Object Lock at least until the restore point
//! must be kept.
//!
//! When the manifest names encrypted objects, the wrappers of their generations' data keys
//! (`gen/<g>/keys/`) are held too: without one the restore point cannot be decrypted. They
//! are listed once per generation while the worker's view of the prefix lives (a LIST).
//!
//! # Why
//! Each object is locked when it is created, for the lock period from then
//! (`crate::bucket::write_once`). A later restore point that names it (the generation's
//! snapshot, its archives, the first segments of `wal.bin`) must be kept until its own write
//! plus the longest the policy keeps a restore point: past the object's date once the object
//! is older than [`CLOCK_SLACK`]. So the object's lock is extended (`PutObjectRetention`, only
//! ever later) before the manifest naming it is written.
//!
//! # The dates
//! One retention `R` (now plus the lock period) is taken for the restore point: its manifest
//! is created with `R`, and every object it names is held until `R` less [`CLOCK_SLACK`],
//! which is the keep date `verify --immutable` reads back from the manifest
//! (`crate::verify::immutable`). An object found short is extended to a full period from
//! then, so it is extended again only about once per [`CLOCK_SLACK`] while it is reused.
//!
//! # Cost
//! Nothing for objects the [`WriteOnce`](crate::bucket::write_once::WriteOnce) bucket
//! remembers as late enough (everything this process created or extended in the last
//! [`CLOCK_SLACK`]); a `PutObjectRetention` for each reused object about once per
//! [`CLOCK_SLACK`]; and a HEAD first for an object this process never wrote (after a restart
//! or a lease takeover), once. The mutable layout never comes here.
//!
//! # Failures
//! A transient failure fails the step (the restore point is written by a later one, holding
//! again). An object the bucket refuses to extend (a permanent error: access denied, no
//! Object Lock) is counted as short in [`HoldCounts::short`], which health reports, and the
//! restore point is still written: one whose objects may expire early beats none, and health
//! says so.
//!
//! # Crash behaviour
//! Extensions are idempotent: a crash before the manifest leaves objects locked longer than
//! needed, which costs nothing but storage until the later date.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use futures::StreamExt;

use super::WorkerError;
use super::ctx::Ctx;
use crate::bucket::BucketError;
use crate::bucket::write_once::{CLOCK_SLACK, HoldCounts, Retention};
use crate::crypto::key_objects;
use crate::manifest::Manifest;

/// Extensions in flight at once.
const PARALLELISM: usize = 8;

/// Holds every object `m` names until the keep date of a restore point created with the
/// returned retention (module docs); `None` for the mutable layout (nothing sent).
pub(super) async fn hold(
    cx: &Ctx<'_>,
    wrappers: &mut HashMap<u64, Vec<String>>,
    m: &Manifest,
) -> Result<Option<Retention>, WorkerError> {
    let Some(lock) = cx.lock else {
        return Ok(None);
    };
    let mut keys: BTreeSet<String> = m.objects().map(|o| o.key.clone()).collect();
    for (g, _) in key_objects::generations_to_open(m.objects()) {
        if let Entry::Vacant(e) = wrappers.entry(g) {
            let prefix = key_objects::keys_prefix(g);
            let listed = crate::bucket::list_all(cx.bucket.as_ref(), &prefix).await?;
            e.insert(
                listed
                    .into_iter()
                    .map(|o| o.key)
                    .filter(|k| key_objects::is_wrapper_key(k))
                    .collect(),
            );
        }
        keys.extend(wrappers[&g].iter().cloned());
    }
    let retain = lock.retention_now();
    let slack = i64::try_from(CLOCK_SLACK.as_millis()).unwrap_or(i64::MAX);
    let until = Retention {
        mode: retain.mode,
        until_ms: retain.until_ms.saturating_sub(slack),
    };
    let bucket = cx.bucket.clone();
    let results: Vec<(String, Result<(), BucketError>)> = futures::stream::iter(keys)
        .map(move |key| {
            let bucket = bucket.clone();
            async move {
                let r = bucket.put_retention(&key, until).await;
                (key, r)
            }
        })
        .buffer_unordered(PARALLELISM)
        .collect()
        .await;
    let mut short = 0;
    for (key, r) in results {
        match r {
            Ok(()) => {}
            Err(e) if e.is_retryable() || matches!(e, BucketError::Cancelled) => {
                return Err(e.into());
            }
            Err(e) => {
                short += 1;
                tracing::warn!(%key, error = %e, "cannot hold a reused object until its restore point's keep date");
            }
        }
    }
    record(cx.holds, short);
    Ok(Some(retain))
}

fn record(holds: &HoldCounts, short: u64) {
    holds
        .checked_at_ms
        .store(crate::units::unix_now_ms(), Ordering::Relaxed);
    holds.short.store(short, Ordering::Relaxed);
}
