//! Restoring to an instant: `restore --at-time 2026-12-02T10:00:00Z` and `AdoptRequest.at_time`
//! restore the newest commit shipped at or before that instant.
//!
//! # Whose clock
//! The bucket's own record, never a writer's: every time here is an object's modification time
//! as the bucket lists it (S3 `LastModified` from `ListObjectsV2`, a `file://` object's mtime;
//! [`crate::bucket::ObjectMeta::modified_ms`]). Manifests carry a `created_at`, but that is the
//! writing worker's clock, which may be off, and segments carry no time at all; the bucket's
//! time is one clock for every writer of a prefix (several instances, lineages after an
//! adoption), and it is the time at which the bytes were in fact durable there. S3 gives it
//! to the second, so commits shipped within one second share an instant (the newest of them
//! is restored).
//!
//! # The timeline
//! Two kinds of object make a commit restorable, and each is an *event* at its time:
//! - a manifest: its `commit_seq` is restorable from its `LastModified` on;
//! - a segment of generation `g`, listed under `gen/<g>/wal/`: the commit at its end is
//!   restorable once a manifest of `g` can reach it, that is, one that names it or whose
//!   segments end at or before the segment's start (the segment then extends it, as in every
//!   restore). Its event time is the later of the segment's time and the earliest such
//!   manifest's time; a segment no manifest of its generation can reach is no event.
//!
//! Events are ordered by (time, generation, WAL offset reached): generation numbers grow over
//! a prefix's history (across lineages too), and within a generation a later offset holds more
//! commits. The instant `T` restores the greatest event at or before `T`; the *earliest
//! restorable instant* is the first event's time, the *latest* the last one's
//! (`ListRestorePoints` reports both from a cheaper reading, [`restorable_span`]: exact for
//! the earliest, the newest manifest's generation for the latest). A segment event is only checked when it is restored: the
//! chain of segments up to it must download and check like every extension
//! ([`super::plan::extend`]); one that does not (a gap, a corrupt segment) is passed over with
//! a warning for the next older event, so the answer is never newer than `T`.
//!
//! # What is downloaded
//! A manifest event restores that manifest alone (no extension). A segment event restores the
//! manifest of its generation that names it, cut after the commit at the segment's end, or
//! else the one whose segments end nearest below it, extended by the segments up to it and
//! cut there. Either way the restore is an ordinary `--at N` restore of that commit from that
//! restore point (`Plan::cut`), with every check of [`super::stage`]; the report names the
//! commit and the event's time.
//!
//! # Input
//! An RFC 3339 time with a UTC offset (`Z` or `+hh:mm`); one without is refused (a local time
//! means a different instant on every machine), and so is a time after now (by this machine's
//! clock: a typo in the year, most likely) and one before the earliest restorable instant
//! (naming it). Reads only.

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::plan::{Plan, extend, load_manifest};
use super::{RestoreError, RestoreOptions};
use crate::bucket::{Bucket, ObjectMeta, list_all};
use crate::manifest::{MANIFESTS_PREFIX, Manifest, parse_segment_key, segments_prefix};
use crate::units::rfc3339_ms;

/// Parses an instant given as RFC 3339 with a UTC offset into unix milliseconds. `now_ms`
/// (this machine's clock) bounds it from above.
pub fn parse_instant(s: &str, now_ms: i64) -> Result<i64, RestoreError> {
    let bad = |detail: String| RestoreError::BadTime {
        given: s.to_string(),
        detail,
    };
    let t = match OffsetDateTime::parse(s.trim(), &Rfc3339) {
        Ok(t) => t,
        Err(e) => {
            let naive = OffsetDateTime::parse(&format!("{}Z", s.trim()), &Rfc3339).is_ok();
            return Err(bad(if naive {
                "has no UTC offset: add `Z` for UTC or `+hh:mm` (a local time names a \
                 different instant on every machine)"
                    .into()
            } else {
                format!("is not an RFC 3339 time such as 2026-12-02T10:00:00Z ({e})")
            }));
        }
    };
    let ms = i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| bad("is out of range".into()))?;
    if ms > now_ms {
        return Err(bad(format!(
            "is in the future (now is {}); nothing was shipped after now",
            rfc3339_ms(now_ms)
        )));
    }
    Ok(ms)
}

/// What makes a commit restorable, and when (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    time_ms: i64,
    generation: u64,
    /// The WAL offset of the generation reached.
    offset: u64,
    kind: EventKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum EventKind {
    /// Index into [`Timeline::manifests`].
    Manifest(usize),
    /// A segment `[start, end)` of the generation.
    Segment { key: String, start: u64 },
}

impl Event {
    fn order(&self) -> (i64, u64, u64) {
        (self.time_ms, self.generation, self.offset)
    }
}

/// A manifest, its key and the bucket's time for it.
struct Loaded {
    key: String,
    manifest: Manifest,
    time_ms: i64,
}

/// Every event of a prefix, oldest first.
struct Timeline {
    manifests: Vec<Loaded>,
    events: Vec<Event>,
    warnings: Vec<String>,
}

/// The earliest and latest restorable instants of a prefix (unix ms), if it has any, as
/// `ListRestorePoints` reports them on its first page, which must cost about a page and not a
/// GET of every manifest (`tests/listing.rs` counts): a LIST of `manifests/`, a GET of the
/// oldest and of the newest manifest by the bucket's time (more only where one is not valid),
/// and a LIST of the newest one's generation's segments.
///
/// The earliest is exact: every segment event is at or after a manifest of its generation
/// (module docs), so the first event of the timeline is the oldest valid manifest. The latest
/// is the newest valid manifest's time, or later the newest segment of its generation past its
/// segments (which extends it); segment events of other generations or beside its segments are
/// not looked at, and, as in the timeline, segment events are not checked here. `--at-time`
/// itself always builds the whole timeline.
pub async fn restorable_span(bucket: &dyn Bucket) -> Result<Option<(i64, i64)>, RestoreError> {
    let mut listed = list_all(bucket, MANIFESTS_PREFIX).await?;
    listed.sort_by(|a, b| (a.modified_ms, &a.key).cmp(&(b.modified_ms, &b.key)));
    // The oldest valid manifest: its index, time, and the manifest (kept, in case it is also
    // the newest: one GET, not two).
    let mut oldest = None;
    for (i, meta) in listed.iter().enumerate() {
        if let Ok(m) = load_manifest(bucket, &meta.key).await? {
            oldest = Some((i, time_of(meta)?, m));
            break;
        }
    }
    let Some((first, earliest, oldest)) = oldest else {
        return Ok(None);
    };
    let mut newest = None;
    // Those after the oldest valid one, newest first; it is the newest if none of them is.
    for meta in listed[first + 1..].iter().rev() {
        if let Ok(m) = load_manifest(bucket, &meta.key).await? {
            newest = Some((time_of(meta)?, m));
            break;
        }
    }
    let newest = newest.unwrap_or((earliest, oldest));
    let (mut latest, m) = newest;
    for obj in list_all(bucket, &segments_prefix(m.generation)).await? {
        if parse_segment_key(m.generation, &obj.key)
            .is_some_and(|(start, _)| start >= m.segments_end())
        {
            latest = latest.max(time_of(&obj)?);
        }
    }
    Ok(Some((earliest, latest.max(earliest))))
}

fn time_of(meta: &ObjectMeta) -> Result<i64, RestoreError> {
    meta.modified_ms.ok_or_else(|| RestoreError::BadObject {
        key: meta.key.clone(),
        detail: "the bucket lists it without a modification time, which --at-time needs".into(),
    })
}

async fn timeline(bucket: &dyn Bucket, parallelism: usize) -> Result<Timeline, RestoreError> {
    let listed = list_all(bucket, MANIFESTS_PREFIX).await?;
    let loaded: Vec<_> = futures::stream::iter(listed)
        .map(|meta| async move { (load_manifest(bucket, &meta.key).await, meta) })
        .buffered(parallelism.max(1))
        .collect()
        .await;
    let mut warnings = Vec::new();
    let mut manifests = Vec::new();
    for (result, meta) in loaded {
        match result? {
            Ok(manifest) => manifests.push(Loaded {
                time_ms: time_of(&meta)?,
                key: meta.key,
                manifest,
            }),
            Err(why) => {
                let w = format!("skipping a manifest that is not valid: {why}");
                tracing::warn!("{w}");
                warnings.push(w);
            }
        }
    }
    let mut by_generation: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut events = Vec::new();
    for (i, l) in manifests.iter().enumerate() {
        by_generation
            .entry(l.manifest.generation)
            .or_default()
            .push(i);
        events.push(Event {
            time_ms: l.time_ms,
            generation: l.manifest.generation,
            offset: l.manifest.segments_end(),
            kind: EventKind::Manifest(i),
        });
    }
    for (&generation, members) in &by_generation {
        // Manifests of the generation by where their segments end, with the earliest time
        // of any ending at or before each.
        let mut by_end: Vec<(u64, i64)> = members
            .iter()
            .map(|&i| (manifests[i].manifest.segments_end(), manifests[i].time_ms))
            .collect();
        by_end.sort();
        let mut earliest = i64::MAX;
        for e in &mut by_end {
            earliest = earliest.min(e.1);
            e.1 = earliest;
        }
        // The earliest time of a manifest naming each segment key.
        let mut named: HashMap<&str, i64> = HashMap::new();
        for &i in members {
            for s in &manifests[i].manifest.segments {
                let t = named.entry(s.object.key.as_str()).or_insert(i64::MAX);
                *t = (*t).min(manifests[i].time_ms);
            }
        }
        for obj in list_all(bucket, &segments_prefix(generation)).await? {
            let Some((start, end)) = parse_segment_key(generation, &obj.key) else {
                continue;
            };
            let extending = by_end
                .partition_point(|e| e.0 <= start)
                .checked_sub(1)
                .map(|i| by_end[i].1);
            let naming = named.get(obj.key.as_str()).copied();
            let Some(reachable) = [extending, naming].into_iter().flatten().min() else {
                continue;
            };
            events.push(Event {
                time_ms: time_of(&obj)?.max(reachable),
                generation,
                offset: end,
                kind: EventKind::Segment {
                    key: obj.key,
                    start,
                },
            });
        }
    }
    events.sort_by_key(Event::order);
    Ok(Timeline {
        manifests,
        events,
        warnings,
    })
}

/// The plan for `--at-time t_ms` (see the module docs).
pub(crate) async fn choose_at_time(
    bucket: &dyn Bucket,
    t_ms: i64,
    opts: &RestoreOptions,
) -> Result<Plan, RestoreError> {
    let parallelism = opts.parallelism.max(1);
    let Timeline {
        manifests,
        events,
        mut warnings,
    } = timeline(bucket, parallelism).await?;
    let Some(first) = events.first() else {
        return Err(RestoreError::NoRestorePoint {
            url: bucket.url(),
            detail: "there is no valid manifest".into(),
        });
    };
    if t_ms < first.time_ms {
        return Err(RestoreError::BeforeEarliest {
            at: rfc3339_ms(t_ms),
            earliest: rfc3339_ms(first.time_ms),
        });
    }
    let upto = events.partition_point(|e| e.time_ms <= t_ms);
    for event in events[..upto].iter().rev() {
        match &event.kind {
            EventKind::Manifest(i) => {
                let l = &manifests[*i];
                return Ok(Plan {
                    manifest: l.manifest.clone(),
                    manifest_key: l.key.clone(),
                    extension: Vec::new(),
                    cached: HashMap::new(),
                    commit_seq: l.manifest.commit_seq,
                    // A branch manifest's WAL runs past its fork: cut there.
                    cut: l.manifest.cut(),
                    commit_time_ms: Some(event.time_ms),
                    warnings,
                    left_out: Vec::new(),
                });
            }
            EventKind::Segment { key, start } => {
                if opts.restore_point_only {
                    continue;
                }
                match segment_plan(
                    bucket,
                    &manifests,
                    event,
                    key,
                    *start,
                    parallelism,
                    &opts.keys,
                )
                .await?
                {
                    Ok(mut plan) => {
                        warnings.append(&mut plan.warnings);
                        plan.warnings = warnings;
                        plan.commit_time_ms = Some(event.time_ms);
                        return Ok(plan);
                    }
                    Err(why) => {
                        let w = format!("{key}: {why}; restoring an older commit");
                        tracing::warn!("{w}");
                        warnings.push(w);
                    }
                }
            }
        }
    }
    Err(RestoreError::BeforeEarliest {
        at: rfc3339_ms(t_ms),
        earliest: rfc3339_ms(first.time_ms),
    })
}

/// The plan restoring the commit at the end of segment `key` (`[start, event.offset)`): from
/// the manifest of its generation naming it, else the one ending nearest below it, extended.
/// `Ok(Err(why))` when the segments up to it do not chain.
async fn segment_plan(
    bucket: &dyn Bucket,
    manifests: &[Loaded],
    event: &Event,
    key: &str,
    start: u64,
    parallelism: usize,
    keys: &super::keys::RestoreKeys,
) -> Result<Result<Plan, String>, RestoreError> {
    let of_generation = || {
        manifests
            .iter()
            .filter(|l| l.manifest.generation == event.generation)
    };
    let plan = |l: &Loaded, ext: super::plan::Extension, commit_seq: u64| Plan {
        manifest: l.manifest.clone(),
        manifest_key: l.key.clone(),
        extension: ext.segments,
        cached: ext.cached,
        commit_seq,
        cut: Some(commit_seq),
        commit_time_ms: None,
        warnings: ext.warnings,
        left_out: Vec::new(),
    };
    // A manifest naming it: the commit at its end, counted from the manifest's entries.
    for l in of_generation() {
        if let Some(seq) = l.manifest.commit_at_segment_end(key) {
            return Ok(Ok(plan(l, super::plan::Extension::default(), seq)));
        }
    }
    let Some(base) = of_generation()
        .filter(|l| l.manifest.segments_end() <= start)
        .max_by_key(|l| (l.manifest.segments_end(), l.time_ms))
    else {
        return Ok(Err("no manifest of its generation reaches it".into()));
    };
    let ext = extend(
        bucket,
        &base.manifest,
        None,
        Some(event.offset),
        parallelism,
        keys,
    )
    .await?;
    if ext.end != event.offset {
        return Ok(Err(format!(
            "the segments of generation {} after {} stop at offset {}",
            event.generation, base.key, ext.end
        )));
    }
    let reach = ext.reach;
    Ok(Ok(plan(base, ext, reach)))
}
