//! The pins of a prefix: which of its objects branches name (`crate::manifest::Pin`), read the
//! one way every retention reads them (the worker's pass, `retention --from URL` and its dry
//! run), so that no pass deletes an object a live branch still names.
//!
//! # Which pins hold
//! A pin `pins/<branch lineage>.json` is **live**, and every key it lists is kept as if a
//! manifest of the prefix named it, unless:
//! - its release `pins/<branch lineage>.released` exists (`branch delete` wrote it); or
//! - it is older than the grace (the retention's `orphan_grace`, an hour by default: a branch is
//!   a handful of requests, so an hour is a crashed one) and its branch manifest is not there (HEAD through the
//!   bucket's sibling of the branch prefix): the branch was never completed (a crash between
//!   the pin and the manifest), or its prefix was removed by hand.
//!
//! Either way it is **reclaimable**: a deleting pass removes the pin, then its release (in that
//! order: a crash between the two leaves a release alone, which means nothing and goes next
//! time, never a pin that holds again). A pin that does not decode was written by no branch
//! (a branch creates its pin whole, once): it is named in a warning, never deleted, and holds
//! nothing. A pin whose branch cannot be looked at (a prefix of another bucket, a bucket that
//! reaches no other prefix) is kept live, with a warning: a pin is only ever dropped on proof.
//!
//! # What a branch is charged ([`Pins::charges`])
//! The stored bytes of the objects it keeps alive only through its pin: named by no remaining
//! manifest of the prefix (each retention computes them after deleting manifests), an object
//! held by several live pins shared equally among them. A pin lists each key's length
//! (`Pin::lens`); one written without them is charged nothing.
//!
//! # Cost
//! A LIST of `pins/` (one page per 1,000) on every retention pass, a GET per pin the first time
//! it is listed (a pin is written once: the caller keeps what was read in a [`Cache`]), a HEAD
//! per pin past its grace without a release. A prefix no branch was ever cut from pays the LIST.
//!
//! # What a crash leaves
//! Nothing of its own: it reads; the deletions are the caller's, pin before release.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use uuid::Uuid;

use crate::bucket::{self, Bucket, BucketError};
use crate::manifest::{self, PINS_PREFIX, Pin};

/// The pins read so far, by key (`None`: one that does not decode); pins are created once, so
/// what was read stays true while the key is listed.
pub type Cache = HashMap<String, Option<Pin>>;

/// A live pin.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: String,
    pub pin: Pin,
}

/// A pin that holds no more, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaimable {
    pub branch: Uuid,
    /// The pin's key, when there is one (a release may be alone).
    pub pin: Option<String>,
    /// The release's key, when there is one.
    pub release: Option<String>,
    pub why: String,
}

/// What a prefix's pins say.
#[derive(Debug, Clone, Default)]
pub struct Pins {
    pub held: Vec<Held>,
    pub reclaimable: Vec<Reclaimable>,
    /// The keys of pins that do not decode (they hold nothing and are not deleted).
    pub junk: Vec<String>,
}

/// What a live branch is charged for in the prefix holding its objects: the stored bytes of
/// the objects it keeps alive only through its pin (named by no remaining manifest of the
/// prefix), each object's bytes shared equally among the live pins holding it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Charge {
    /// The branch prefix's URL.
    pub branch: String,
    pub lineage: Uuid,
    pub bytes: u64,
    /// Objects it keeps alive only through pins (its own or shared).
    pub objects: u64,
}

impl Pins {
    /// What each live pin is charged for, given every key a remaining manifest of the prefix
    /// names (see [`Charge`]); a pin written without lengths is charged 0 bytes.
    pub fn charges(&self, named: &HashSet<String>) -> Vec<Charge> {
        let mut holders: BTreeMap<&str, (u64, Vec<usize>)> = BTreeMap::new();
        for (i, h) in self.held.iter().enumerate() {
            for (j, key) in h.pin.keys.iter().enumerate() {
                if named.contains(key) {
                    continue;
                }
                let len = h.pin.lens.get(j).copied().unwrap_or(0);
                let e = holders.entry(key).or_default();
                e.0 = e.0.max(len);
                e.1.push(i);
            }
        }
        let mut out: Vec<Charge> = self
            .held
            .iter()
            .map(|h| Charge {
                branch: h.pin.branch.clone(),
                lineage: h.pin.lineage,
                bytes: 0,
                objects: 0,
            })
            .collect();
        for (len, pins) in holders.into_values() {
            let n = pins.len() as u64;
            for (k, i) in pins.into_iter().enumerate() {
                // A hostile pin's lengths may be anything: saturate, never wrap.
                let share = len / n + u64::from((k as u64) < len % n);
                out[i].bytes = out[i].bytes.saturating_add(share);
                out[i].objects += 1;
            }
        }
        out
    }

    /// Every key a live pin holds.
    pub fn keys(&self) -> HashSet<String> {
        self.held
            .iter()
            .flat_map(|h| h.pin.keys.iter().cloned())
            .collect()
    }
}

/// Reads the pins of `bucket`'s prefix at `now_ms`, each through `cache`; a pin past `grace`
/// holds only while its branch manifest is there.
pub async fn read(
    bucket: &dyn Bucket,
    now_ms: i64,
    grace: Duration,
    cache: &mut Cache,
) -> Result<Pins, BucketError> {
    let listed = bucket::list_all(bucket, PINS_PREFIX).await?;
    let keys: HashSet<&str> = listed.iter().map(|o| o.key.as_str()).collect();
    cache.retain(|k, _| keys.contains(k.as_str()));
    let mut found: BTreeMap<Uuid, (Option<String>, Option<String>)> = BTreeMap::new();
    for o in listed {
        match manifest::parse_pin_key(&o.key) {
            Some((id, false)) => found.entry(id).or_default().0 = Some(o.key),
            Some((id, true)) => found.entry(id).or_default().1 = Some(o.key),
            None => {}
        }
    }
    let mut pins = Pins::default();
    for (branch, (pin_key, release)) in found {
        let Some(key) = pin_key else {
            pins.reclaimable.push(Reclaimable {
                branch,
                pin: None,
                release,
                why: "a release without its pin".into(),
            });
            continue;
        };
        if release.is_some() {
            pins.reclaimable.push(Reclaimable {
                branch,
                pin: Some(key),
                release,
                why: "released by `branch delete`".into(),
            });
            continue;
        }
        if !cache.contains_key(&key) {
            let read = match bucket.get(&key).await {
                Ok(o) => Pin::decode(&key, &o.data).map_err(|e| {
                    tracing::warn!(%key, error = %e, "a pin that does not decode holds nothing");
                }),
                Err(BucketError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            cache.insert(key.clone(), read.ok());
        }
        let Some(Some(pin)) = cache.get(&key).cloned() else {
            pins.junk.push(key);
            continue;
        };
        match gone_why(bucket, &pin, now_ms, grace).await? {
            Some(why) => pins.reclaimable.push(Reclaimable {
                branch,
                pin: Some(key),
                release: None,
                why,
            }),
            None => pins.held.push(Held { key, pin }),
        }
    }
    Ok(pins)
}

/// Why `pin` holds no more although not released, if it does not: past the grace, its branch
/// manifest is missing.
async fn gone_why(
    bucket: &dyn Bucket,
    pin: &Pin,
    now_ms: i64,
    grace: Duration,
) -> Result<Option<String>, BucketError> {
    let age = manifest::parse_time_ms(&pin.created_at).map(|t| now_ms.saturating_sub(t));
    // A time that does not parse is young: kept.
    if age.is_none_or(|a| a < crate::units::millis_i64(grace)) {
        return Ok(None);
    }
    let branch = match bucket.sibling(&pin.branch) {
        Ok(b) => b,
        Err(BucketError::NotFound { .. }) => {
            return Ok(Some(format!(
                "its branch prefix {} is not there",
                pin.branch
            )));
        }
        Err(e) => {
            tracing::warn!(branch = %pin.branch, error = %e, "cannot look at a pinning branch: its pin holds");
            return Ok(None);
        }
    };
    match branch.head(&pin.manifest).await {
        Ok(Some(_)) => Ok(None),
        Ok(None) => Ok(Some(format!(
            "its branch manifest {} of {} is not there, {} s after the pin",
            pin.manifest,
            pin.branch,
            age.unwrap_or(0) / 1000
        ))),
        // A branch prefix that is gone whole (a directory removed) is a missing manifest too.
        Err(BucketError::NotFound { .. }) => Ok(Some(format!(
            "its branch prefix {} is not there",
            pin.branch
        ))),
        Err(e) => Err(e),
    }
}

/// Deletes what `reclaimable` names, pin before release; returns how many objects went.
pub async fn reclaim(bucket: &dyn Bucket, reclaimable: &[Reclaimable]) -> Result<u64, BucketError> {
    let mut deleted = 0;
    for r in reclaimable {
        for key in r.pin.iter().chain(&r.release) {
            bucket.delete(key, None).await?;
            deleted += 1;
        }
        tracing::info!(branch = %r.branch, why = %r.why, "reclaimed a pin");
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: u64, keys: &[(&str, u64)], sized: bool) -> Held {
        let lineage = Uuid::from_u128(u128::from(n));
        Held {
            key: manifest::pin_key(lineage),
            pin: Pin {
                branch: format!("s3://b/branch-{n}"),
                lineage,
                manifest: manifest::manifest_key(n),
                commit_seq: n,
                created_at: "2026-12-07T00:00:00Z".into(),
                keys: keys.iter().map(|(k, _)| k.to_string()).collect(),
                lens: if sized {
                    keys.iter().map(|(_, l)| *l).collect()
                } else {
                    Vec::new()
                },
            },
        }
    }

    #[test]
    fn a_branch_is_charged_what_it_alone_keeps_and_a_share_of_what_it_keeps_with_others() {
        let pins = Pins {
            held: vec![
                held(1, &[("named", 100), ("alone", 10), ("shared", 7)], true),
                held(2, &[("named", 100), ("shared", 7)], true),
                held(3, &[("shared", 7), ("old", 50)], false),
            ],
            ..Pins::default()
        };
        let named: HashSet<String> = ["named".to_string()].into();
        let c = pins.charges(&named);
        let got: Vec<(u64, u64)> = c.iter().map(|c| (c.bytes, c.objects)).collect();
        // `shared` (7 bytes) split three ways: 3, 2, 2; a pin without lengths is charged
        // nothing for its own object.
        assert_eq!(got, vec![(10 + 3, 2), (2, 1), (2, 2)]);
        assert_eq!(c.iter().map(|c| c.bytes).sum::<u64>(), 10 + 7);
        assert_eq!(c[0].branch, "s3://b/branch-1");
        assert!(Pins::default().charges(&named).is_empty());
    }
}
