//! `verify --immutable`: proof that a write-once prefix (issue 29, `src/latest.rs`) holds what
//! its restore points need for as long as they must be kept.
//!
//! # Until when a restore point must be kept
//! The writer locks every object until its write plus the lock period, which is the longest the
//! retention policy keeps a restore point plus [`CLOCK_SLACK`]
//! (`crate::worker::retention::lock_period`). A restore point is kept from the moment its
//! manifest is written, so it must be kept until the manifest's own retain-until date less
//! [`CLOCK_SLACK`]: the policy as the writer applied it, read from the bucket, with no policy
//! to pass here and no trust in this host's clock against the writer's. A restore point whose
//! date has passed is no longer kept (the bucket may expire it) and is not checked.
//!
//! # What is checked
//! Every object a kept restore point names (its snapshot, archives, segments and side files),
//! its manifest, and, when it names encrypted objects, every wrapper of their generations' data
//! keys (`gen/<g>/keys/`: without one the restore point cannot be decrypted) must carry an Object Lock retention whose retain-until date is at least
//! the latest keep date of the kept restore points naming it. Each object that does not (no
//! retention, an earlier date, or missing) is named with the date it has and the date it
//! needs. A manifest with no retention at all (written by a mutable writer, or before the
//! prefix was locked) is named too: no keep date can be read from it.
//!
//! # Cost
//! One LIST per 1,000 manifests, a HEAD and a GET per manifest, a LIST per encrypted
//! generation, and a HEAD per distinct object the kept restore points need; nothing is
//! downloaded but the manifests. Reads only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use futures::StreamExt;
use serde::Serialize;

use super::{VerifyError, bucket_err, load_manifests};
use crate::bucket::write_once::{CLOCK_SLACK, Retention};
use crate::bucket::{Bucket, BucketError};

/// One object short of its date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShortObject {
    pub key: String,
    /// Its retain-until date, unix milliseconds; `None`: no retention (or no such object).
    pub retained_until_ms: Option<i64>,
    /// The date it must be retained until: the latest keep date of the kept restore points
    /// naming it.
    pub needed_until_ms: i64,
    /// The manifest of the restore point that needs it longest.
    pub restore_point: String,
    /// The object is missing altogether.
    pub missing: bool,
}

/// What `verify --immutable` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImmutableCheck {
    /// When the check ran, unix milliseconds (this host's clock).
    pub checked_at_ms: i64,
    /// Restore points still to be kept, checked.
    pub kept: usize,
    /// Restore points whose keep date has passed (not checked).
    pub expired: usize,
    /// Distinct objects checked (manifests included).
    pub objects: usize,
    /// Each object short of its date, in key order.
    pub short: Vec<ShortObject>,
    /// Manifests no keep date can be read from (no retention, unreadable), each named.
    pub problems: Vec<String>,
    /// Requests the check sent.
    pub requests: u64,
    pub ok: bool,
}

fn date(ms: i64) -> String {
    crate::units::rfc3339_ms(ms)
}

impl fmt::Display for ShortObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let has = match (self.missing, self.retained_until_ms) {
            (true, _) => "missing".to_string(),
            (false, None) => "no Object Lock retention".to_string(),
            (false, Some(ms)) => format!("retained only until {}", date(ms)),
        };
        write!(
            f,
            "SHORT {}: {has}, needed until {} by {}",
            self.key,
            date(self.needed_until_ms),
            self.restore_point
        )
    }
}

impl fmt::Display for ImmutableCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.short {
            writeln!(f, "{s}")?;
        }
        for p in &self.problems {
            writeln!(f, "FAIL  {p}")?;
        }
        let what = format!(
            "{} kept restore points ({} expired), {} objects",
            self.kept, self.expired, self.objects
        );
        if self.ok {
            write!(
                f,
                "immutable: every object of {what} is locked as long as it must be"
            )
        } else {
            write!(
                f,
                "immutable FAILS: objects short of their date: {}, problems: {}, of {what}",
                self.short.len(),
                self.problems.len()
            )
        }
    }
}

/// The lock of `key` as a HEAD reads it: `None` for a missing object.
async fn head_lock(
    bucket: &dyn Bucket,
    key: &str,
) -> Result<Option<Option<Retention>>, BucketError> {
    Ok(bucket.head(key).await?.map(|m| m.lock))
}

/// Checks every kept restore point of `bucket`'s prefix (module docs), `now_ms` deciding which
/// are still kept, with at most `parallelism` requests in flight.
pub async fn check_immutable(
    bucket: &dyn Bucket,
    now_ms: i64,
    parallelism: usize,
) -> Result<ImmutableCheck, VerifyError> {
    let parallelism = parallelism.max(1);
    let manifests = load_manifests(bucket, parallelism).await?;
    let mut needs = Needs {
        requests: manifests.len().div_ceil(1000).max(1) as u64 + manifests.len() as u64,
        ..Needs::default()
    };
    let heads: Vec<Result<_, BucketError>> = futures::stream::iter(&manifests)
        .map(|(key, _)| head_lock(bucket, key))
        .buffered(parallelism)
        .collect()
        .await;
    needs.requests += manifests.len() as u64;
    for ((key, manifest), head) in manifests.iter().zip(heads) {
        let head = head.map_err(bucket_err(bucket))?;
        needs.restore_point(key, manifest, head, now_ms);
    }
    needs.wrappers(bucket).await?;
    needs.head_unknown(bucket, parallelism).await?;
    let short = needs.short();
    Ok(ImmutableCheck {
        checked_at_ms: now_ms,
        kept: needs.kept,
        expired: needs.expired,
        objects: needs.needed.len(),
        ok: short.is_empty() && needs.problems.is_empty(),
        short,
        problems: needs.problems,
        requests: needs.requests,
    })
}

/// What the kept restore points need, and what the bucket was seen to hold.
#[derive(Default)]
struct Needs {
    /// Each object's needed date, and the manifest needing it longest.
    needed: BTreeMap<String, (i64, String)>,
    /// Each object's lock as read (`None`: no retention).
    known: BTreeMap<String, Option<Retention>>,
    /// Encrypted generations: the latest keep date of a restore point naming them, and by whom.
    sealed: BTreeMap<u64, (i64, String)>,
    /// Needed objects a HEAD found missing.
    missing: BTreeSet<String>,
    problems: Vec<String>,
    kept: usize,
    expired: usize,
    requests: u64,
}

/// Records that `by` needs `key` until `until`, unless another needs it longer.
fn need_longest<K: Ord>(map: &mut BTreeMap<K, (i64, String)>, key: K, until: i64, by: &str) {
    let e = map.entry(key).or_insert((until, by.to_string()));
    if until > e.0 {
        *e = (until, by.to_string());
    }
}

impl Needs {
    /// One manifest `key` and the lock a HEAD read of it (`None`: gone): when its keep date
    /// (its retain-until less [`CLOCK_SLACK`]) is still ahead of `now_ms`, it and every object
    /// it names are needed until then, as are the key wrappers of its encrypted generations.
    fn restore_point(
        &mut self,
        key: &String,
        manifest: &Result<crate::manifest::Manifest, String>,
        head: Option<Option<Retention>>,
        now_ms: i64,
    ) {
        let slack = i64::try_from(CLOCK_SLACK.as_millis()).unwrap_or(i64::MAX);
        let lock = match head {
            None => {
                self.problems.push(format!("{key}: listed, then gone"));
                return;
            }
            Some(None) => {
                self.problems.push(format!(
                    "{key}: no Object Lock retention (not written by a write-once writer), so \
                     no keep date"
                ));
                return;
            }
            Some(Some(lock)) => lock,
        };
        self.known.insert(key.clone(), Some(lock));
        let keep_until = lock.until_ms.saturating_sub(slack);
        if keep_until <= now_ms {
            self.expired += 1;
            return;
        }
        self.kept += 1;
        let m = match manifest {
            Ok(m) => m,
            Err(why) => {
                self.problems.push(format!("{key}: {why}"));
                return;
            }
        };
        need_longest(&mut self.needed, key.clone(), keep_until, key);
        for o in m.objects() {
            need_longest(&mut self.needed, o.key.clone(), keep_until, key);
        }
        for (g, _) in crate::crypto::key_objects::generations_to_open(m.objects()) {
            need_longest(&mut self.sealed, g, keep_until, key);
        }
    }

    /// Lists the key wrappers of each encrypted generation, each needed as long as the
    /// generation; a generation with none is a problem (its restore points cannot be
    /// decrypted).
    async fn wrappers(&mut self, bucket: &dyn Bucket) -> Result<(), VerifyError> {
        for (g, (until, by)) in &self.sealed {
            let prefix = crate::crypto::key_objects::keys_prefix(*g);
            let wrappers = crate::bucket::list_all(bucket, &prefix)
                .await
                .map_err(bucket_err(bucket))?;
            self.requests += wrappers.len().div_ceil(1000).max(1) as u64;
            let mut any = false;
            for w in wrappers
                .iter()
                .filter(|w| crate::crypto::key_objects::is_wrapper_key(&w.key))
            {
                any = true;
                need_longest(&mut self.needed, w.key.clone(), *until, by);
            }
            if !any {
                self.problems.push(format!(
                    "{prefix}: no wrapped data key, which {by} needs to be decrypted"
                ));
            }
        }
        Ok(())
    }

    /// Reads the lock of every needed object not known yet, `parallelism` HEADs at once.
    async fn head_unknown(
        &mut self,
        bucket: &dyn Bucket,
        parallelism: usize,
    ) -> Result<(), VerifyError> {
        let unknown: Vec<&String> = self
            .needed
            .keys()
            .filter(|k| !self.known.contains_key(*k))
            .collect();
        self.requests += unknown.len() as u64;
        let locks: Vec<Result<_, BucketError>> = futures::stream::iter(unknown)
            .map(|key| async move { head_lock(bucket, key).await.map(|l| (key.clone(), l)) })
            .buffered(parallelism)
            .collect()
            .await;
        for r in locks {
            let (key, lock) = r.map_err(bucket_err(bucket))?;
            match lock {
                Some(l) => {
                    self.known.insert(key, l);
                }
                None => {
                    self.missing.insert(key);
                }
            }
        }
        Ok(())
    }

    /// Each needed object retained for less than it is needed (or not at all), in key order.
    fn short(&self) -> Vec<ShortObject> {
        let mut short = Vec::new();
        for (key, (until, by)) in &self.needed {
            let has = self.known.get(key).copied().flatten().map(|l| l.until_ms);
            if has.is_none_or(|h| h < *until) {
                short.push(ShortObject {
                    key: key.clone(),
                    retained_until_ms: has,
                    needed_until_ms: *until,
                    restore_point: by.clone(),
                    missing: self.missing.contains(key),
                });
            }
        }
        short
    }
}
