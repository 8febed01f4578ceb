//! `mushroom-backoff`: [`Backoff`], the one exponential backoff of the program (bucket
//! retries, the worker's failed steps and lease acquisitions, the node client's reconnects).
//!
//! A delay starts at `first`, doubles after every [`Backoff::next_delay`] up to `max`, and
//! goes back to `first` on [`Backoff::reset`]. Jitter is optional: with a ratio `r > 0` each
//! delay is scaled by a factor drawn uniformly from `[1 − r, 1]` (never longer than the
//! un-jittered delay, so `max` stays a bound), from a seeded generator so that a test can
//! replay it. Every user today keeps the ratio at 0, which is the exact doubling the code had
//! before this type. [`Backoff::wait`] sleeps the next delay unless a [`CancellationToken`]
//! is cancelled first.
//!
//! A floor: it depends on no other crate of the workspace, only on tokio's timer and
//! tokio-util's [`CancellationToken`]; the library re-exports it as `backoff`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Exponential, capped, optionally jittered delays; see the module docs.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// The next delay before jitter.
    current: Duration,
    /// Attempts since the last reset (delays handed out).
    attempts: u32,
    /// Jitter ratio in `[0, 1]`.
    jitter: f64,
    /// xorshift64* state; never 0.
    rng: u64,
}

impl Backoff {
    /// `first`, doubling up to `max`; no jitter. (A `max` below `first` caps every delay
    /// after the first.)
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            current: first,
            attempts: 0,
            jitter: 0.0,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }

    /// Scales each delay by a factor drawn from `[1 − ratio, 1]` (ratio clamped to `[0, 1]`),
    /// from a generator seeded with `seed`: the same seed gives the same delays.
    pub fn with_jitter(mut self, ratio: f64, seed: u64) -> Self {
        self.jitter = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        self.rng = seed | 1;
        self
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.current = self.first;
        self.attempts = 0;
    }

    /// Delays handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The delay [`Self::next_delay`] would hand out next, before jitter.
    pub fn peek(&self) -> Duration {
        self.current
    }

    /// The next delay; the one after is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        if self.jitter == 0.0 {
            return base;
        }
        let factor = 1.0 - self.jitter * self.unit();
        base.mul_f64(factor.clamp(0.0, 1.0))
    }

    /// Sleeps the next delay; `false` (at once) if `cancel` is cancelled first.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> bool {
        let delay = self.next_delay();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// A uniform draw from `[0, 1)`.
    fn unit(&mut self) -> f64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // The top 21 bits as a fraction.
        f64::from(u32::try_from(r >> 43).unwrap_or(0)) / f64::from(1u32 << 21)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let got: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
        assert_eq!(b.attempts(), 6);
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.next_delay(), 100 * MS);
    }

    #[test]
    fn a_cap_below_the_first_delay_caps_the_later_ones() {
        let mut b = Backoff::new(100 * MS, 10 * MS);
        assert_eq!(b.next_delay(), 100 * MS);
        assert_eq!(b.next_delay(), 10 * MS);
    }

    #[test]
    fn jitter_stays_within_bounds_and_replays() {
        let delays = |seed| {
            let mut b = Backoff::new(100 * MS, 10_000 * MS).with_jitter(0.5, seed);
            (0..20).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        let a = delays(7);
        assert_eq!(a, delays(7), "the same seed gives the same delays");
        assert_ne!(a, delays(8));
        let mut plain = Backoff::new(100 * MS, 10_000 * MS);
        for d in a {
            let base = plain.next_delay();
            assert!(
                d <= base && d >= base / 2,
                "{d:?} outside [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn wait_sleeps_the_delay() {
        let cancel = CancellationToken::new();
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let t0 = tokio::time::Instant::now();
        assert!(b.wait(&cancel).await);
        assert_eq!(t0.elapsed(), 100 * MS);
        assert!(b.wait(&cancel).await);
        assert_eq!(t0.elapsed(), 300 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_returns_false_at_cancellation() {
        let cancel = CancellationToken::new();
        let mut b = Backoff::new(10_000 * MS, 10_000 * MS);
        let t0 = tokio::time::Instant::now();
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(30 * MS).await;
            c.cancel();
        });
        assert!(!b.wait(&cancel).await);
        assert_eq!(t0.elapsed(), 30 * MS);
        // Already cancelled: at once.
        assert!(!b.wait(&cancel).await);
        assert_eq!(t0.elapsed(), 30 * MS);
    }
}
