//! Throttle classes: every bucket request belongs to a [`TrafficClass`]; each class has a limit
//! of bytes and requests a second ([`Rate`]) at three scopes (the instance, each store, and
//! optionally a bucket endpoint); one mechanism paces them all ([`TokenBucket`], in the bucket
//! layer, beside the retry layer: [`Throttled`]), never a sleep in a caller.
//!
//! # The classes
//! `wal` (segments, and the small objects a restore point and the lease are made of: never
//! throttled, only counted, and counted against the `bulk` budget of every scope so bulk
//! traffic yields to it), `bulk` (snapshots, archives, side files), `restore` (restores and
//! adoption: uncapped unless asked), `check` (drills and verify) and `housekeeping`
//! (retention's listings, reads and deletes, and listing pages). A limit names any class but
//! `wal`. Which class a request is: the class its caller runs in ([`in_class`], how a
//! retention pass says it is housekeeping), else the class its bucket was opened for
//! ([`Lane::classed`]: a restore, a drill), else by what it does ([`classify`]).
//!
//! # How bytes are paced
//! A request first takes one request token at every scope ([`Lane::request`]). Its bytes are
//! paced as they move: the backend's body stream ([`crate::bucket::s3`]: a PUT's body, a part
//! of a multipart upload, a GET's response) takes each piece before it is sent or after it is
//! read ([`pace`], [`Pacer`]); what a backend did not pace as it streamed (a local directory,
//! memory) the wrapper paces when the request ends. So a limit holds inside one large object.
//!
//! # Fairness
//! Every scope's class bucket is shared first come, first served; each store takes at most one
//! piece of a class at a time (its turn), so the instance's queue holds one piece per store
//! that wants the class and serves them in turn: max-min fair (a store that wants less than
//! its share takes less, and the others share the rest). A piece is sized so the whole queue
//! drains within a second ([`Lane::piece`]): no store waits 2 s for its first bytes while
//! fewer stores want a class than its rate has 16 KiB pieces a second.
//!
//! # The token bucket
//! Tokens (bytes or requests) refill at `rate` a second up to a burst of
//! [`TokenBucket::BURST`] of the rate. [`TokenBucket::take`] takes what a request needs at once,
//! going into debt when there is not enough, and answers how long the caller waits before
//! sending: the debt over the rate. So callers queue in the order they took (each waits for
//! the debt of those before it and its own), a request larger than the burst passes after a
//! wait in proportion (never refused, never stuck), and over any window longer than the burst
//! the bytes sent are the rate times the window, plus at most one burst. A rate of 0 is no
//! limit. [`TokenBucket::set_rate`] applies at once: the next take is paced at the new rate
//! (a debt taken at the old rate is not re-priced; it is at most what was in flight).
//!
//! Time is tokio's, so tests pause it. What a crash leaves: nothing; it is all memory (the
//! limits themselves are the configuration's and the registry's).

mod lane;
mod meter;
mod schedule;
mod token;
mod wrapper;

pub use lane::{Lane, Pacer, StoreScope, Throttle, in_class, pace};
pub use meter::{Measured, Meter};
pub use schedule::{Days, Schedule, Window};
pub use token::TokenBucket;
pub use wrapper::{Throttled, classify};

/// What a bucket request is for (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrafficClass {
    Wal,
    Bulk,
    Restore,
    Check,
    Housekeeping,
}

impl TrafficClass {
    pub const ALL: [TrafficClass; 5] = [
        TrafficClass::Wal,
        TrafficClass::Bulk,
        TrafficClass::Restore,
        TrafficClass::Check,
        TrafficClass::Housekeeping,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TrafficClass::Wal => "wal",
            TrafficClass::Bulk => "bulk",
            TrafficClass::Restore => "restore",
            TrafficClass::Check => "check",
            TrafficClass::Housekeeping => "housekeeping",
        }
    }

    /// The class named `s`; `wal` too (it is counted, and shown), though no limit names it.
    pub fn parse(s: &str) -> Option<TrafficClass> {
        TrafficClass::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// The most bytes a second a limit may give: 100 GB/s, past any uplink.
pub const MAX_BYTES_PER_SECOND: u64 = 100_000_000_000;
/// The most requests a second a limit may give.
pub const MAX_REQUESTS_PER_SECOND: u64 = 1_000_000;

/// One class's limit: bytes a second, and requests a second when given (0 bytes: none, as
/// `CLASS=unlimited` writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassLimit {
    pub class: TrafficClass,
    pub bytes_per_second: u64,
    pub requests_per_second: Option<u64>,
}

impl ClassLimit {
    /// Parses `CLASS=BYTES_PER_SECOND[,requests=N]` (`bulk=20000000,requests=100`), naming
    /// what is wrong: an unknown class or `wal` (never throttled), a number that is not one or
    /// out of its range (1 to [`MAX_BYTES_PER_SECOND`], 1 to [`MAX_REQUESTS_PER_SECOND`]), an
    /// unknown or repeated key. `unlimited` for the bytes lifts the byte limit
    /// (`housekeeping=unlimited,requests=50`, or `bulk=unlimited` to lift a class's limit).
    pub fn parse(s: &str) -> Result<ClassLimit, String> {
        let whole = || format!("limit {s:?}");
        let (class, rest) = s.split_once('=').ok_or_else(|| {
            format!(
                "{}: must be CLASS=BYTES_PER_SECOND[,requests=N], e.g. bulk=20000000",
                whole()
            )
        })?;
        let class = match TrafficClass::parse(class.trim()) {
            Some(TrafficClass::Wal) => {
                return Err(format!(
                    "{}: the wal class is never throttled (it protects the RPO); limit bulk, \
                     restore, check or housekeeping",
                    whole()
                ));
            }
            Some(c) => c,
            None => {
                return Err(format!(
                    "{}: unknown class {class:?}: one of bulk, restore, check, housekeeping",
                    whole()
                ));
            }
        };
        let mut parts = rest.split(',');
        let bytes = match parts.next().unwrap_or("").trim() {
            "unlimited" => 0,
            n => number(n, MAX_BYTES_PER_SECOND)
                .map_err(|e| format!("{}: bytes per second {e}", whole()))?,
        };
        let mut requests = None;
        for part in parts {
            match part.trim().split_once('=') {
                Some(("requests", n)) if requests.is_none() => {
                    requests = Some(
                        number(n, MAX_REQUESTS_PER_SECOND)
                            .map_err(|e| format!("{}: requests per second {e}", whole()))?,
                    );
                }
                Some(("requests", _)) => {
                    return Err(format!("{}: requests given twice", whole()));
                }
                _ => {
                    return Err(format!(
                        "{}: unknown part {part:?}: only requests=N may follow the bytes",
                        whole()
                    ));
                }
            }
        }
        Ok(ClassLimit {
            class,
            bytes_per_second: bytes,
            requests_per_second: requests,
        })
    }
}

impl std::fmt::Display for ClassLimit {
    /// As [`ClassLimit::parse`] reads it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=", self.class.name())?;
        match self.bytes_per_second {
            0 => write!(f, "unlimited")?,
            n => write!(f, "{n}")?,
        }
        match self.requests_per_second {
            Some(n) => write!(f, ",requests={n}"),
            None => Ok(()),
        }
    }
}

/// Bytes and requests a second of one class at one scope; 0: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rate {
    pub bytes_per_second: u64,
    pub requests_per_second: u64,
}

impl Rate {
    pub fn is_limited(&self) -> bool {
        self.bytes_per_second > 0 || self.requests_per_second > 0
    }
}

/// Every class's limit at one scope (the instance's, a store's, an endpoint's); `wal`'s is
/// always none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitSet {
    rates: [Rate; TrafficClass::ALL.len()],
}

impl LimitSet {
    /// What `check` is capped at when nothing says otherwise (the instance's default): 50 MB/s,
    /// so a scheduled drill never takes a production uplink.
    pub const DEFAULT_CHECK: u64 = 50_000_000;

    /// No limit on any class.
    pub fn none() -> LimitSet {
        LimitSet::default()
    }

    /// An instance's limits when none is given: only `check` capped, at [`Self::DEFAULT_CHECK`].
    pub fn instance_default() -> LimitSet {
        let mut l = LimitSet::none();
        l.rates[TrafficClass::Check as usize].bytes_per_second = Self::DEFAULT_CHECK;
        l
    }

    pub fn get(&self, class: TrafficClass) -> Rate {
        self.rates[class as usize]
    }

    /// Sets one class's limit (a `wal` limit is never made: [`ClassLimit::parse`] refuses it).
    pub fn set(&mut self, limit: ClassLimit) {
        if limit.class == TrafficClass::Wal {
            return;
        }
        self.rates[limit.class as usize] = Rate {
            bytes_per_second: limit.bytes_per_second,
            requests_per_second: limit.requests_per_second.unwrap_or(0),
        };
    }

    /// Sets one class's rate (`wal`'s stays none).
    pub fn set_rate(&mut self, class: TrafficClass, rate: Rate) {
        if class != TrafficClass::Wal {
            self.rates[class as usize] = rate;
        }
    }

    /// These limits with `limits` set over them, in order.
    pub fn with(mut self, limits: &[ClassLimit]) -> LimitSet {
        for l in limits {
            self.set(*l);
        }
        self
    }

    /// Parses `CLASS=…` items ([`ClassLimit::parse`]); a class named twice is refused.
    pub fn parse_all<S: AsRef<str>>(items: &[S]) -> Result<Vec<ClassLimit>, String> {
        let mut out: Vec<ClassLimit> = Vec::new();
        for item in items {
            let l = ClassLimit::parse(item.as_ref())?;
            if out.iter().any(|o| o.class == l.class) {
                return Err(format!(
                    "limit {:?}: the class {} is limited twice",
                    item.as_ref(),
                    l.class.name()
                ));
            }
            out.push(l);
        }
        Ok(out)
    }

    /// The limits set, as [`ClassLimit`]s (the classes with none left out).
    pub fn limits(&self) -> Vec<ClassLimit> {
        TrafficClass::ALL
            .into_iter()
            .filter(|c| self.get(*c).is_limited())
            .map(|c| {
                let r = self.get(c);
                ClassLimit {
                    class: c,
                    bytes_per_second: r.bytes_per_second,
                    requests_per_second: (r.requests_per_second > 0)
                        .then_some(r.requests_per_second),
                }
            })
            .collect()
    }
}

/// What an instance's throttle is started with: the base limits of the instance scope (outside
/// every window of the schedule), the schedule, and the endpoints' limits (by endpoint, as
/// [`crate::bucket::url::endpoint_of`] names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleSettings {
    pub instance: LimitSet,
    pub schedule: Schedule,
    pub endpoints: std::collections::BTreeMap<String, LimitSet>,
}

impl Default for ThrottleSettings {
    /// `check` capped at [`LimitSet::DEFAULT_CHECK`], nothing else.
    fn default() -> ThrottleSettings {
        ThrottleSettings {
            instance: LimitSet::instance_default(),
            schedule: Schedule::default(),
            endpoints: Default::default(),
        }
    }
}

/// A whole number from 1 to `max`.
fn number(s: &str, max: u64) -> Result<u64, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{:?} is not a whole number", s.trim()))?;
    if !(1..=max).contains(&n) {
        return Err(format!("{n} is out of range (1 to {max})"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_as_operators_write_them_and_name_what_is_wrong() {
        assert_eq!(
            ClassLimit::parse("bulk=20000000,requests=100"),
            Ok(ClassLimit {
                class: TrafficClass::Bulk,
                bytes_per_second: 20_000_000,
                requests_per_second: Some(100),
            })
        );
        assert_eq!(
            ClassLimit::parse("housekeeping=1000").map(|l| (l.class, l.requests_per_second)),
            Ok((TrafficClass::Housekeeping, None))
        );
        for (bad, says) in [
            ("wal=1000", "never throttled"),
            ("backups=1000", "unknown class"),
            ("bulk", "CLASS=BYTES_PER_SECOND"),
            ("bulk=0", "out of range"),
            ("bulk=-5", "not a whole number"),
            ("bulk=200000000000", "out of range"),
            (
                "bulk=1000,requests=0",
                "requests per second 0 is out of range",
            ),
            ("bulk=1000,requests=5,requests=6", "twice"),
            ("bulk=1000,burst=5", "unknown part"),
            ("check=", "not a whole number"),
            ("restore=unlimited,requests=unlimited", "not a whole number"),
        ] {
            let e = ClassLimit::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
        for c in TrafficClass::ALL {
            assert_eq!(TrafficClass::parse(c.name()), Some(c));
        }
        for s in [
            "bulk=unlimited",
            "housekeeping=unlimited,requests=50",
            "check=7,requests=2",
        ] {
            assert_eq!(ClassLimit::parse(s).unwrap().to_string(), s);
        }
        let set = LimitSet::instance_default()
            .with(&LimitSet::parse_all(&["bulk=20,requests=3", "check=unlimited"]).unwrap());
        assert_eq!(
            set.limits()
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>(),
            ["bulk=20,requests=3"]
        );
        let e = LimitSet::parse_all(&["bulk=1", "bulk=2"]).unwrap_err();
        assert!(e.contains("bulk=2") && e.contains("twice"), "{e}");
    }
}
