//! [`TokenBucket`]: the one pacing mechanism (see the module docs of [`super`], "The token
//! bucket"). Time is tokio's, so tests pause it. A crash leaves nothing: it is memory.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

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
}
