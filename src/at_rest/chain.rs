//! The chain of segments past a restore point: which listed objects can be segments of a
//! generation's `wal.bin`, and which chain of them reaches furthest.
//!
//! One choice for every reader of a prefix: restore (`restore::plan`), the standby and its
//! promotion (which follow `restore::plan::extend_listed`), and the worker's resume
//! (`worker::view`). The worker acknowledges (`durability = sync`) only what it shipped in
//! its own chain, every object of which passes [`Candidates::of`] by construction (and is
//! checked with [`segment_stored_problem`] before it counts), so what a node is told is durable
//! is what a restore reaches.
//!
//! # Candidates ([`Candidates::of`]), from the listing alone, before any object is read
//! - A key that is not a segment of the generation, or that starts before the chain's start,
//!   is no candidate and not reported (it is behind what the chain already holds).
//! - Left out, never read, with the reason ([`LeftOut`]):
//!   - a range longer than a writer ships ([`super::bounds::SEGMENT_MAX`]);
//!   - more stored bytes than any encoding of its range makes ([`segment_stored_max`]): raw
//!     is the range itself, zstd is kept only when it came out smaller
//!     ([`super::encode`]), and a sealed object adds its header and a tag per chunk
//!     ([`crate::crypto::stream::sealed_len`]), so at most `sealed_len(range)`. (Before issue
//!     40 the bound was the range itself, which every sealed segment zstd did not shrink by 51
//!     bytes exceeds: an encrypted store's segments past its restore point were never
//!     restored while sync mode acknowledged them.)
//!   - ending past `until` (a promotion's claim on LATEST; the worker's durable length).
//!
//! # Choosing ([`Candidates::path`])
//! The path from an offset, over the candidates not rejected, that reaches the furthest
//! offset; where several reach equally far, the one whose first step is longest (fewer GETs).
//! It is computed over the keys alone (one pass over the starts, furthest first), so it costs
//! no request. A reader fetches and checks the path's segments in order; one that fails its
//! check is rejected and the path is chosen again from where the chain stands. So a dead end
//! (a longer segment that ends where nothing starts: a fenced former holder's delayed PUT, or
//! a planted object) never hides a chain that reaches further, as the earlier greedy walk
//! (longest segment first, no backtracking) did.
//!
//! What a reader did not take is reported by [`Candidates::not_taken`]; a restore names each
//! such object that ends past what it restored (it could hold commits that were not
//! restored), and exits non-zero for it unless told to accept a partial restore.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::manifest::parse_segment_key;

/// A listed object the chain did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub key: String,
    /// The WAL range its key claims.
    pub start: u64,
    pub end: u64,
    pub kind: LeftOutKind,
    pub why: String,
}

/// Why an object was left out, in kinds a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeftOutKind {
    /// Its key or stored length is nothing a writer makes ([`segment_stored_problem`]): not
    /// a writer's object, never read.
    NotAWriters,
    /// It ends past where the chain must stop (a promotion's claim, a durable length).
    PastEnd,
    /// It was read and failed its check (missing, not decoding, frames not continuing).
    Rejected,
    /// It is on another chain of segments, which checks out no further than the one taken.
    OtherChain,
    /// It starts past a gap where the chain taken stops.
    PastGap,
}

impl LeftOut {
    /// Whether a writer of the prefix could have written it: a left-out object that is may
    /// hold acknowledged commits (one that is not was never a writer's).
    pub fn could_be_a_writers(&self) -> bool {
        self.kind != LeftOutKind::NotAWriters
    }
}

impl std::fmt::Display for LeftOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.why)
    }
}

/// One segment of a path: `wal.bin` bytes `start..end` in the object `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub start: u64,
    pub end: u64,
    pub key: String,
}

/// The most stored bytes a segment of `range` plain bytes can have, whatever its codec and
/// whether it is sealed (see the module docs).
pub fn segment_stored_max(range: u64) -> u64 {
    crate::crypto::stream::sealed_len(range).unwrap_or(u64::MAX)
}

/// Why a segment of `range` plain bytes stored in `stored` bytes was not made by a writer, if
/// it was not (the detail, without the key). The one bound restore, standby, the worker's
/// resume and its acknowledgements share.
pub fn segment_stored_problem(range: u64, stored: u64) -> Option<String> {
    if let Some(p) = super::bounds::segment_len_problem(range) {
        return Some(p);
    }
    let max = segment_stored_max(range);
    (stored > max).then(|| {
        format!(
            "{stored} stored bytes, and its key's range of {range} bytes encodes (raw, zstd or \
             sealed) to at most {max}"
        )
    })
}

/// The segments of one generation listed at or past a chain's start.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    /// `(end, key)` by start.
    by_start: BTreeMap<u64, Vec<(u64, String)>>,
    /// Listed segments past the start that no chain may take (see the module docs).
    pub left_out: Vec<LeftOut>,
}

impl Candidates {
    /// The candidates among `listed` (`(key, stored length)`, any keys) for a chain of
    /// `generation` from offset `from`, none ending past `until`.
    pub fn of(
        generation: u64,
        from: u64,
        until: Option<u64>,
        listed: impl IntoIterator<Item = (String, u64)>,
    ) -> Candidates {
        let mut c = Candidates::default();
        for (key, len) in listed {
            let Some((start, end)) = parse_segment_key(generation, &key) else {
                continue;
            };
            if start < from {
                continue;
            }
            let why = if let Some(u) = until.filter(|u| end > *u) {
                Some((
                    LeftOutKind::PastEnd,
                    format!(
                        "ends at offset {end}, past {u} where the chain must stop (a promotion's \
                         claim, or the store's durable length)"
                    ),
                ))
            } else {
                segment_stored_problem(end - start, len).map(|w| (LeftOutKind::NotAWriters, w))
            };
            match why {
                Some((kind, why)) => c.left_out.push(LeftOut {
                    key,
                    start,
                    end,
                    kind,
                    why,
                }),
                None => c.by_start.entry(start).or_default().push((end, key)),
            }
        }
        for list in c.by_start.values_mut() {
            list.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        }
        c
    }

    /// Whether there is no candidate.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// The path from `at` over the candidates not `rejected` that reaches the furthest
    /// offset (see the module docs); empty when none starts at `at`.
    pub fn path(&self, at: u64, rejected: impl Fn(&str) -> bool) -> Vec<Step> {
        // furthest[s]: the furthest offset a path from start s reaches. Starts are visited
        // furthest first, and every end is past its start, so each end's value is known.
        let mut furthest: HashMap<u64, u64> = HashMap::new();
        for (&start, list) in self.by_start.range(at..).rev() {
            let best = list
                .iter()
                .filter(|(_, k)| !rejected(k))
                .map(|(end, _)| furthest.get(end).copied().unwrap_or(*end))
                .max()
                .unwrap_or(start);
            furthest.insert(start, best);
        }
        let mut path = Vec::new();
        let mut pos = at;
        while let Some(list) = self.by_start.get(&pos) {
            // Longest first within a list, so `max_by_key` keeping the first of equals picks
            // the longest step among those reaching furthest.
            let next = list
                .iter()
                .filter(|(_, k)| !rejected(k))
                .map(|(end, key)| (furthest.get(end).copied().unwrap_or(*end), *end, key))
                .fold(None::<(u64, u64, &String)>, |best, c| match best {
                    Some(b) if b.0 >= c.0 => Some(b),
                    _ => Some(c),
                });
            let Some((_, end, key)) = next else {
                break;
            };
            path.push(Step {
                start: pos,
                end,
                key: key.clone(),
            });
            pos = end;
        }
        path
    }

    /// Every listed segment a chain that took `used` did not take: those left out by
    /// [`Candidates::of`], those `rejected` (with the reason each was rejected for), and the
    /// candidates never tried (another chain, or past a gap).
    pub fn not_taken(
        &self,
        used: &HashSet<String>,
        rejected: &HashMap<String, String>,
        reached: u64,
    ) -> Vec<LeftOut> {
        let mut out = self.left_out.clone();
        for (&start, list) in &self.by_start {
            for (end, key) in list {
                if used.contains(key) {
                    continue;
                }
                let (kind, why) = match rejected.get(key) {
                    Some(why) => (LeftOutKind::Rejected, why.clone()),
                    None if *end <= reached => (
                        LeftOutKind::OtherChain,
                        "on another chain of segments, which reaches no further than the one \
                         taken"
                            .to_string(),
                    ),
                    None if start > reached => (
                        LeftOutKind::PastGap,
                        format!(
                            "starts at offset {start}, past offset {reached} where the chain \
                             taken stops (no segment continues it)"
                        ),
                    ),
                    None => (
                        LeftOutKind::OtherChain,
                        format!(
                            "on another chain of segments, ending at offset {end} past offset \
                             {reached} where the chain taken stops, but no chain through it \
                             checks out further"
                        ),
                    ),
                };
                out.push(LeftOut {
                    key: key.clone(),
                    start,
                    end: *end,
                    kind,
                    why,
                });
            }
        }
        out.sort_by(|a, b| (a.start, a.end, &a.key).cmp(&(b.start, b.end, &b.key)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::segments_prefix;
    use std::collections::HashSet;

    fn key(s: u64, e: u64) -> String {
        format!("{}{s:020}-{e:020}.seg", segments_prefix(1))
    }

    fn of(ranges: &[(u64, u64)]) -> Candidates {
        Candidates::of(1, 10, None, ranges.iter().map(|&(s, e)| (key(s, e), e - s)))
    }

    fn none(_: &str) -> bool {
        false
    }

    fn ends(p: Vec<Step>) -> Vec<(u64, u64)> {
        p.into_iter().map(|s| (s.start, s.end)).collect()
    }

    #[test]
    fn the_path_reaches_furthest_not_greedily() {
        // The review's dead end: 10..30 is the longest at 10 but nothing starts at 30.
        let c = of(&[(10, 30), (10, 20), (20, 40), (40, 90), (50, 60)]);
        assert_eq!(ends(c.path(10, none)), [(10, 20), (20, 40), (40, 90)]);
        // Where two reach as far, the longer first step.
        let c = of(&[(10, 20), (10, 30), (20, 30), (30, 40)]);
        assert_eq!(ends(c.path(10, none)), [(10, 30), (30, 40)]);
        // A rejected segment is routed around.
        let rejected: HashSet<String> = [key(10, 30)].into();
        assert_eq!(
            ends(c.path(10, |k| rejected.contains(k))),
            [(10, 20), (20, 30), (30, 40)]
        );
        // A gap: nothing starts where the chain stands.
        assert!(c.path(15, none).is_empty());
    }

    #[test]
    fn sealed_lengths_are_candidates_and_longer_ones_are_left_out() {
        let range = 1000;
        let sealed = crate::crypto::stream::sealed_len(range).unwrap();
        assert_eq!(sealed, range + 51);
        let c = Candidates::of(
            1,
            0,
            None,
            [
                (key(0, 1000), sealed),
                (key(1000, 2000), sealed + 1),
                (key(2000, 2000 + (64 << 20)), 0),
            ],
        );
        assert_eq!(ends(c.path(0, none)), [(0, 1000)]);
        let left: Vec<_> = c.left_out.iter().map(|l| l.start).collect();
        assert_eq!(left, [1000, 2000]);
        assert!(
            c.left_out[0].why.contains("at most 1051"),
            "{}",
            c.left_out[0]
        );
        assert!(
            c.left_out[1].why.contains("a writer ships"),
            "{}",
            c.left_out[1]
        );
    }

    #[test]
    fn until_and_start_bound_the_candidates_and_not_taken_says_why() {
        let c = Candidates::of(
            1,
            10,
            Some(50),
            [(5, 10), (10, 20), (10, 15), (20, 60), (30, 40)]
                .iter()
                .map(|&(s, e)| (key(s, e), e - s)),
        );
        assert_eq!(ends(c.path(10, none)), [(10, 20)]);
        let used: HashSet<String> = [key(10, 20)].into();
        let not = c.not_taken(&used, &HashMap::new(), 20);
        let whys: Vec<_> = not.iter().map(|l| (l.start, l.end, &l.why[..12])).collect();
        assert_eq!(
            whys,
            [
                (10, 15, "on another c"),
                (20, 60, "ends at offs"),
                (30, 40, "starts at of"),
            ]
        );
    }

    #[test]
    fn a_long_chain_costs_no_recursion() {
        let ranges: Vec<(u64, u64)> = (0..50_000u64).map(|i| (10 + i, 11 + i)).collect();
        let c = of(&ranges);
        assert_eq!(c.path(10, none).len(), 50_000);
    }
}
