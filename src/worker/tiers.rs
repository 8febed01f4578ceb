//! Retention by tiers (grandfather-father-son) over restore points: which restore points the
//! tiers keep, and why ([`keep`]). A pure function of the points' times; retention
//! (`retention.rs`) acts on it and stays lineage-safe (it deletes only objects no remaining
//! manifest names).
//!
//! Rules, each keeping a point for its own reason (the first that holds is the one named):
//! - **keep_for**: every restore point younger than `keep_for`.
//! - **daily**: the newest restore point of each of the `keep_daily` newest UTC days that have
//!   a restore point.
//! - **weekly**: the same over ISO weeks (Monday to Sunday, UTC), `keep_weekly` of them.
//! - **monthly**: the same over calendar months (UTC), `keep_monthly` of them.
//!
//! A day, week or month without a restore point keeps nothing and is not counted (a store
//! paused for a week keeps as many daily points as one that was not). A point whose time
//! cannot be read is kept ([`Reason::UnknownTime`]): never deleted on a guess. Tiers count
//! from the newest points, so a point past every tier is dropped whatever its age beyond
//! `keep_for`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How many points each tier keeps; all 0: tiers are off (retention by `keep_for` and
/// `keep_generations` only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tiers {
    pub keep_daily: u64,
    pub keep_weekly: u64,
    pub keep_monthly: u64,
}

impl Tiers {
    pub fn enabled(&self) -> bool {
        self.keep_daily > 0 || self.keep_weekly > 0 || self.keep_monthly > 0
    }
}

/// Why a restore point is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// Younger than `keep_for`.
    KeepFor,
    /// The newest of its UTC day (among the `keep_daily` newest days).
    Daily,
    Weekly,
    Monthly,
    /// Its time could not be read.
    UnknownTime,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::KeepFor => "keep_for",
            Reason::Daily => "daily",
            Reason::Weekly => "weekly",
            Reason::Monthly => "monthly",
            Reason::UnknownTime => "unknown time",
        }
    }
}

const DAY_MS: i64 = 86_400_000;

fn day(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// The ISO week (Monday first) of a day since the epoch (1970-01-01 was a Thursday).
fn week(ms: i64) -> i64 {
    (day(ms) + 3).div_euclid(7)
}

/// Months since 1970-01, UTC.
fn month(ms: i64) -> i64 {
    // Civil from days (Howard Hinnant's algorithm), only as far as year and month.
    let z = day(ms) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y - 1970) * 12 + (m - 1)
}

/// The points (`id` → its time in ms since the epoch, `None` when unreadable) the rules keep,
/// each with the first reason that keeps it; every other point may go.
pub fn keep<K: Ord + Clone>(
    points: &BTreeMap<K, Option<i64>>,
    now_ms: i64,
    keep_for: Duration,
    tiers: &Tiers,
) -> BTreeMap<K, Reason> {
    let keep_for_ms = crate::units::millis_i64(keep_for);
    let mut kept: BTreeMap<K, Reason> = BTreeMap::new();
    // Newest first, ties by id (so the choice is deterministic).
    let mut timed: Vec<(i64, &K)> = Vec::new();
    for (k, t) in points {
        match t {
            None => {
                kept.insert(k.clone(), Reason::UnknownTime);
            }
            Some(t) => timed.push((*t, k)),
        }
    }
    timed.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
    let mut reasons: BTreeMap<&K, Reason> = BTreeMap::new();
    for (t, k) in &timed {
        if now_ms.saturating_sub(*t) < keep_for_ms {
            reasons.insert(k, Reason::KeepFor);
        }
    }
    for (n, period, reason) in [
        (tiers.keep_daily, day as fn(i64) -> i64, Reason::Daily),
        (tiers.keep_weekly, week, Reason::Weekly),
        (tiers.keep_monthly, month, Reason::Monthly),
    ] {
        let mut seen: BTreeSet<i64> = BTreeSet::new();
        for (t, k) in &timed {
            if crate::units::u64_len(seen.len()) >= n {
                break;
            }
            if seen.insert(period(*t)) {
                // The newest point of a period not seen yet.
                reasons.entry(k).or_insert(reason);
            }
        }
    }
    for (k, r) in reasons {
        kept.insert(k.clone(), r);
    }
    kept
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const H: i64 = 3_600_000;
    /// 2026-12-01T00:00:00Z, a Tuesday.
    const DEC_1: i64 = 1_796_083_200_000;

    fn at(points: &[i64]) -> BTreeMap<usize, Option<i64>> {
        points
            .iter()
            .enumerate()
            .map(|(i, t)| (i, Some(*t)))
            .collect()
    }

    #[test]
    fn calendar_periods() {
        assert_eq!(month(0), 0);
        assert_eq!(month(DEC_1), (2026 - 1970) * 12 + 11);
        assert_eq!(month(DEC_1 - 1), (2026 - 1970) * 12 + 10);
        // Monday 2026-11-30 and Sunday 2026-12-06 are one ISO week; Monday 12-07 the next.
        assert_eq!(week(DEC_1 - DAY_MS), week(DEC_1 + 5 * DAY_MS + DAY_MS - 1));
        assert_eq!(week(DEC_1 + 6 * DAY_MS), week(DEC_1 - DAY_MS) + 1);
    }

    #[test]
    fn a_simulated_month_keeps_what_each_tier_names() {
        // A restore point every 6 hours through December 2026, "now" on Jan 1 00:00.
        let times: Vec<i64> = (0..31 * 4).map(|i| DEC_1 + i * 6 * H).collect();
        let now = DEC_1 + 31 * DAY_MS;
        let tiers = Tiers {
            keep_daily: 7,
            keep_weekly: 4,
            keep_monthly: 2,
        };
        let kept = keep(&at(&times), now, Duration::from_secs(24 * 3600), &tiers);
        let reason = |t: i64| kept[&times.iter().position(|x| *x == t).unwrap()];
        // keep_for: Dec 31's 06:00, 12:00, 18:00 (00:00 is exactly 24 h old: not younger).
        let last = DEC_1 + 30 * DAY_MS;
        for h in [6, 12, 18] {
            assert_eq!(reason(last + h * H), Reason::KeepFor);
        }
        // Daily: the 18:00 point of Dec 25..=30 (Dec 31's newest is kept for keep_for).
        for d in 24..30 {
            assert_eq!(
                reason(DEC_1 + d * DAY_MS + 18 * H),
                Reason::Daily,
                "Dec {}",
                d + 1
            );
        }
        // Weekly, 4 ISO weeks: Dec 28-31 and 21-27 are kept already; the Sundays Dec 20 and 13.
        assert_eq!(reason(DEC_1 + 19 * DAY_MS + 18 * H), Reason::Weekly);
        assert_eq!(reason(DEC_1 + 12 * DAY_MS + 18 * H), Reason::Weekly);
        // Monthly: December's newest is kept already; November has none: nothing more.
        assert_eq!(kept.len(), 3 + 6 + 2, "{kept:?}");
    }

    #[test]
    fn an_unreadable_time_is_kept() {
        let mut p = at(&[DEC_1]);
        p.insert(7, None);
        let kept = keep(&p, DEC_1 + 400 * DAY_MS, Duration::ZERO, &Tiers::default());
        assert_eq!(
            kept.into_iter().collect::<Vec<_>>(),
            vec![(7, Reason::UnknownTime)]
        );
    }

    proptest! {
        /// Each tier keeps exactly one point per period for its `n` newest periods (no more
        /// than `n` in all), each the newest of its period; everything `keep_for` covers stays.
        #[test]
        fn tiers_keep_exactly_the_newest_of_the_newest_periods(
            offsets in proptest::collection::vec(0i64..90 * DAY_MS, 0..60),
            daily in 0u64..10, weekly in 0u64..6, monthly in 0u64..4,
            keep_for_h in 0u64..72,
        ) {
            let now = DEC_1 + 90 * DAY_MS;
            let times: Vec<i64> = offsets.iter().map(|o| DEC_1 + o).collect();
            let points = at(&times);
            let tiers = Tiers { keep_daily: daily, keep_weekly: weekly, keep_monthly: monthly };
            let keep_for = Duration::from_secs(keep_for_h * 3600);
            let kept = keep(&points, now, keep_for, &tiers);
            let keep_for_ms = crate::units::millis_i64(keep_for);
            for (i, t) in times.iter().enumerate() {
                if now - t < keep_for_ms {
                    prop_assert_eq!(kept.get(&i), Some(&Reason::KeepFor));
                }
            }
            for (n, period) in [(daily, day as fn(i64) -> i64), (weekly, week), (monthly, month)] {
                let periods: BTreeSet<i64> = times.iter().map(|t| period(*t)).collect();
                let newest: Vec<i64> = periods.iter().rev().take(crate::units::usize_of(n)).copied().collect();
                for p in &newest {
                    // The newest point of the period (ties: the highest id) is kept.
                    let (i, _) = times.iter().enumerate()
                        .filter(|(_, t)| period(**t) == *p)
                        .max_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(&b.0)))
                        .unwrap();
                    prop_assert!(kept.contains_key(&i), "period {} point {}", p, i);
                }
            }
            // Nothing is kept but by a rule.
            for (i, t) in times.iter().enumerate() {
                if kept.contains_key(&i) && now - t >= keep_for_ms {
                    let newest_of = |period: fn(i64) -> i64, n: u64| {
                        let periods: BTreeSet<i64> = times.iter().map(|t| period(*t)).collect();
                        periods.iter().rev().take(crate::units::usize_of(n)).any(|p| *p == period(*t))
                            && !times.iter().enumerate().any(|(j, u)| period(*u) == period(*t) && (*u, j) > (*t, i))
                    };
                    prop_assert!(newest_of(day, daily) || newest_of(week, weekly) || newest_of(month, monthly),
                        "point {} kept by no rule", i);
                }
            }
        }
    }
}
