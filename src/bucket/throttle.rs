//! Throttle classes (issue 44), the first part: the traffic classes every bucket request will
//! belong to ([`TrafficClass`]), a class's limit as an operator writes it ([`ClassLimit`],
//! `CLASS=BYTES_PER_SECOND[,requests=N]`, the form of `serve --limit` and `ctl limits set`),
//! and the one pacing mechanism ([`TokenBucket`]) the bucket layer will pace bytes and
//! requests with, beside the retry layer.
//!
//! Not yet wired: no request is paced by this module yet (no wrapper, no flag, no per-store or
//! per-endpoint scope, no fairness between stores). It is the mechanism those will share.
//!
//! # The classes
//! `wal` (segments: never throttled, only counted, so bulk traffic yields to it), `bulk`
//! (snapshots, archives, side files), `restore` (restores and adoption), `check` (drills and
//! verify) and `housekeeping` (retention's listings and deletes). A limit names any but `wal`.
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
//! Time is tokio's, so tests pause it. What a crash leaves: nothing; the buckets are memory.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

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

/// One class's limit: bytes a second, and requests a second when given.
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
    /// unknown or repeated key.
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
        let bytes = number(parts.next().unwrap_or(""), MAX_BYTES_PER_SECOND)
            .map_err(|e| format!("{}: bytes per second {e}", whole()))?;
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

/// Paces a rate of tokens (bytes or requests) a second (see the module docs).
#[derive(Debug)]
pub struct TokenBucket {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Tokens a second; 0: no limit.
    rate: u64,
    /// Tokens now: negative while callers wait for those they took.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// The burst, in seconds of the rate: small enough that a 10 s window holds within 1 %.
    pub const BURST: Duration = Duration::from_millis(100);

    /// A bucket of `rate` tokens a second (0: no limit), full.
    pub fn new(rate: u64) -> TokenBucket {
        TokenBucket {
            state: Mutex::new(State {
                rate,
                tokens: burst(rate),
                at: Instant::now(),
            }),
        }
    }

    pub fn rate(&self) -> u64 {
        self.lock().rate
    }

    /// Paces every take from now at `rate` (0: no limit).
    pub fn set_rate(&self, rate: u64) {
        let mut s = self.lock();
        s.refill(Instant::now());
        s.rate = rate;
        s.tokens = s.tokens.min(burst(rate));
    }

    /// Takes `n` tokens; how long the caller waits before sending them.
    pub fn take(&self, n: u64) -> Duration {
        let mut s = self.lock();
        if s.rate == 0 {
            return Duration::ZERO;
        }
        s.refill(Instant::now());
        s.tokens -= n as f64;
        if s.tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(-s.tokens / s.rate as f64)
    }

    /// [`TokenBucket::take`], then the wait.
    pub async fn acquire(&self, n: u64) {
        let wait = self.take(n);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        if self.rate > 0 {
            self.tokens = (self.tokens + elapsed * self.rate as f64).min(burst(self.rate));
        }
    }
}

fn burst(rate: u64) -> f64 {
    rate as f64 * TokenBucket::BURST.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `chunks` of `size` one after the other through `b`; the time it took.
    async fn send(b: &TokenBucket, chunks: u64, size: u64) -> Duration {
        let started = Instant::now();
        for _ in 0..chunks {
            b.acquire(size).await;
        }
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_holds_over_a_window_within_one_burst() {
        let b = TokenBucket::new(1_000_000);
        // 20 MB at 1 MB/s: 20 s, less the burst it starts with.
        let took = send(&b, 200, 100_000).await.as_secs_f64();
        assert!((19.85..=20.0).contains(&took), "{took}");
        // Idle, it refills only to its burst: the next 10 MB take 10 s less one burst.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let took = send(&b, 100, 100_000).await.as_secs_f64();
        assert!((9.85..=10.0).contains(&took), "{took}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_rate_applies_to_the_next_take() {
        let b = TokenBucket::new(1_000_000);
        send(&b, 10, 100_000).await;
        b.set_rate(250_000);
        assert_eq!(b.rate(), 250_000);
        let took = send(&b, 10, 100_000).await.as_secs_f64();
        assert!((3.9..=4.0).contains(&took), "{took}");
        b.set_rate(0);
        assert_eq!(send(&b, 1000, 1 << 30).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn callers_queue_in_the_order_they_took_and_a_huge_take_waits_in_proportion() {
        let b = TokenBucket::new(1000);
        assert_eq!(b.take(100), Duration::ZERO);
        // Ten times the burst: refused never, waited for ten seconds less what was left.
        assert_eq!(b.take(10_000), Duration::from_secs(10));
        // The next caller waits behind it.
        assert_eq!(b.take(500), Duration::from_millis(10_500));
    }

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
        ] {
            let e = ClassLimit::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(bad), "{bad}: {e}");
        }
        for c in TrafficClass::ALL {
            assert_eq!(TrafficClass::parse(c.name()), Some(c));
        }
    }
}
