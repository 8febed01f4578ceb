//! Limits by the time of day and the day of the week: a [`Schedule`] of [`Window`]s, each
//! setting some classes' limits while it is open, over the limits that hold outside every
//! window (the base: `serve --limit`, `[limits]`, `ctl limits set`).
//!
//! Times are UTC (`from = "09:00"`, `to = "18:00"`: open from 09:00:00 to 17:59:59). A window
//! whose `to` is before its `from` runs past midnight, and is open on the morning after each of
//! its days. Windows open at once apply in the order written, the later over the earlier.
//! Nothing is kept: the schedule is the configuration's, and an instance evaluates it again
//! at every tick ([`Schedule::at`]), so a boundary takes effect within a tick.

use super::{ClassLimit, LimitSet};

/// Days of the week, Monday first: a bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Days(u8);

const NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

impl Days {
    pub const ALL: Days = Days(0b111_1111);

    /// Parses `mon-fri`, `sat,sun`, `mon,wed-fri`, or `all`.
    pub fn parse(s: &str) -> Result<Days, String> {
        let day = |d: &str| {
            NAMES
                .iter()
                .position(|n| *n == d.trim().to_ascii_lowercase())
                .ok_or_else(|| format!("days {s:?}: unknown day {:?} (mon … sun)", d.trim()))
        };
        if s.trim() == "all" {
            return Ok(Days::ALL);
        }
        let mut bits = 0u8;
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (day(a)?, day(b)?);
                    if a > b {
                        return Err(format!(
                            "days {s:?}: {part:?} runs backwards (write sat,sun,mon rather than sat-mon)"
                        ));
                    }
                    for d in a..=b {
                        bits |= 1 << d;
                    }
                }
                None => bits |= 1 << day(part)?,
            }
        }
        Ok(Days(bits))
    }

    fn has(self, day: u32) -> bool {
        self.0 & (1 << (day % 7)) != 0
    }
}

/// One window: its days, its minutes of the day (`from` open, `to` closed), and the limits
/// it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub days: Days,
    pub from_minute: u32,
    pub to_minute: u32,
    pub limits: Vec<ClassLimit>,
}

impl Window {
    /// A window from its parts as the TOML writes them, naming what is wrong.
    pub fn parse(days: &str, from: &str, to: &str, limits: &[String]) -> Result<Window, String> {
        let w = Window {
            days: Days::parse(days)?,
            from_minute: minute(from)?,
            to_minute: minute(to)?,
            limits: LimitSet::parse_all(limits)?,
        };
        if w.from_minute == w.to_minute {
            return Err(format!(
                "window {from}-{to}: from and to are the same time (use 00:00-24:00 for all day)"
            ));
        }
        if w.limits.is_empty() {
            return Err(format!("window {from}-{to}: sets no limit"));
        }
        Ok(w)
    }

    /// Whether the window is open on `day` (0: Monday) at `minute` of it.
    fn open(&self, day: u32, minute: u32) -> bool {
        if self.from_minute < self.to_minute {
            return self.days.has(day) && (self.from_minute..self.to_minute).contains(&minute);
        }
        (self.days.has(day) && minute >= self.from_minute)
            || (self.days.has(day + 6) && minute < self.to_minute)
    }
}

impl std::fmt::Display for Days {
    /// `mon,tue,…`, or `all`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Days::ALL {
            return write!(f, "all");
        }
        let days: Vec<&str> = (0..7)
            .filter(|d| self.has(*d))
            .map(|d| NAMES[d as usize])
            .collect();
        write!(f, "{}", days.join(","))
    }
}

impl std::fmt::Display for Window {
    /// `mon-fri 09:00-18:00 bulk=5000000` as `mon,tue,wed,thu,fri 09:00-18:00 bulk=5000000`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hm = |m: u32| format!("{:02}:{:02}", m / 60, m % 60);
        write!(
            f,
            "{} {}-{}",
            self.days,
            hm(self.from_minute),
            hm(self.to_minute)
        )?;
        for l in &self.limits {
            write!(f, " {l}")?;
        }
        Ok(())
    }
}

/// `HH:MM` (00:00 to 24:00), as minutes of the day.
fn minute(s: &str) -> Result<u32, String> {
    let bad = || format!("time {s:?}: must be HH:MM, from 00:00 to 24:00 (UTC)");
    let (h, m) = s.trim().split_once(':').ok_or_else(bad)?;
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if m >= 60 || h * 60 + m > 24 * 60 {
        return Err(bad());
    }
    Ok(h * 60 + m)
}

/// The windows of an instance, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    pub windows: Vec<Window>,
}

impl Schedule {
    /// `base` with every window open at `unix_ms` set over it, in order.
    pub fn at(&self, base: &LimitSet, unix_ms: i64) -> LimitSet {
        let (day, minute) = day_and_minute(unix_ms);
        let open: Vec<ClassLimit> = self
            .windows
            .iter()
            .filter(|w| w.open(day, minute))
            .flat_map(|w| w.limits.iter().copied())
            .collect();
        base.with(&open)
    }
}

/// The day of the week (0: Monday) and the minute of that day of a UTC instant.
fn day_and_minute(unix_ms: i64) -> (u32, u32) {
    let minutes = unix_ms.div_euclid(60_000);
    let days = minutes.div_euclid(24 * 60);
    // 1970-01-01 was a Thursday (3, Monday being 0).
    let day = u32::try_from((days + 3).rem_euclid(7)).unwrap_or(0);
    (day, u32::try_from(minutes.rem_euclid(24 * 60)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::super::TrafficClass;
    use super::*;

    /// 2026-12-07 is a Monday: unix ms of `HH:MM` on Monday plus `days`.
    fn at(days: i64, h: i64, m: i64) -> i64 {
        let monday = 1_796_601_600_000; // 2026-12-07T00:00:00Z
        monday + ((days * 24 + h) * 60 + m) * 60_000
    }

    #[test]
    fn windows_open_on_their_days_and_minutes_and_past_midnight() {
        assert_eq!(day_and_minute(at(0, 9, 30)), (0, 570));
        assert_eq!(day_and_minute(at(6, 23, 59)), (6, 1439));
        let office = Window::parse("mon-fri", "09:00", "18:00", &["bulk=5000000".into()]).unwrap();
        let night = Window::parse(
            "fri",
            "22:00",
            "06:00",
            &["bulk=unlimited".into(), "check=100".into()],
        )
        .unwrap();
        let s = Schedule {
            windows: vec![office, night],
        };
        let base = LimitSet::none().with(&LimitSet::parse_all(&["bulk=20000000"]).unwrap());
        let bulk = |ms| s.at(&base, ms).get(TrafficClass::Bulk).bytes_per_second;
        let check = |ms| s.at(&base, ms).get(TrafficClass::Check).bytes_per_second;
        assert_eq!(bulk(at(0, 8, 59)), 20_000_000);
        assert_eq!(bulk(at(0, 9, 0)), 5_000_000);
        assert_eq!(bulk(at(4, 17, 59)), 5_000_000);
        assert_eq!(bulk(at(4, 18, 0)), 20_000_000);
        assert_eq!(bulk(at(5, 12, 0)), 20_000_000);
        // Friday night runs into Saturday morning, not into Friday morning.
        assert_eq!((bulk(at(4, 22, 0)), check(at(4, 23, 0))), (0, 100));
        assert_eq!(check(at(5, 5, 59)), 100);
        assert_eq!(check(at(5, 6, 0)), 0);
        assert_eq!(check(at(4, 5, 0)), 0);
    }

    #[test]
    fn a_bad_window_is_named() {
        for (days, from, to, limits, says) in [
            ("mon-fri", "9", "18:00", "bulk=1", "HH:MM"),
            ("mon-fri", "09:00", "24:01", "bulk=1", "HH:MM"),
            ("mon-fry", "09:00", "18:00", "bulk=1", "unknown day"),
            ("sat-mon", "09:00", "18:00", "bulk=1", "backwards"),
            ("mon", "09:00", "09:00", "bulk=1", "same time"),
            ("mon", "09:00", "10:00", "wal=1", "never throttled"),
        ] {
            let e = Window::parse(days, from, to, &[limits.into()]).unwrap_err();
            assert!(e.contains(says), "{days} {from} {to}: {e}");
        }
        assert_eq!(Days::parse("all"), Ok(Days::ALL));
        assert_eq!(Days::parse("mon,wed-fri").map(|d| d.0), Ok(0b1_1101));
    }
}
