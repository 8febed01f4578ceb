//! [`Meter`]: bytes and requests a second, measured over the last ten whole seconds: the `rate`
//! health and `ctl limits show` put beside each class's limit.
//!
//! Counts go into one-second slots of tokio's clock (paused in tests); the rate is what the
//! last [`Meter::WINDOW`] whole seconds before the current one held, over the seconds the
//! meter has been counting when it is younger. Memory only: a crash leaves nothing.

use std::sync::Mutex;

use tokio::time::Instant;

/// What a [`Meter`] measured: bytes and requests a second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    pub bytes_per_second: f64,
    pub requests_per_second: f64,
}

/// Bytes and requests a second over a sliding window; see the module docs.
#[derive(Debug)]
pub struct Meter {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    started: Instant,
    /// `(second, bytes, requests)`, the second counted from `started`.
    slots: [(u64, u64, u64); SLOTS],
}

/// One slot more than the window: the current second's.
const SLOTS: usize = 11;

impl Default for Meter {
    fn default() -> Meter {
        Meter {
            state: Mutex::new(State {
                started: Instant::now(),
                slots: [(u64::MAX, 0, 0); SLOTS],
            }),
        }
    }
}

impl Meter {
    /// Whole seconds the rate is measured over.
    pub const WINDOW: u64 = 10;

    /// Counts `bytes` and `requests` now.
    pub fn add(&self, bytes: u64, requests: u64) {
        let mut s = self.lock();
        let second = s.started.elapsed().as_secs();
        let slot = &mut s.slots[crate::units::usize_of(second % SLOTS as u64)];
        if slot.0 != second {
            *slot = (second, 0, 0);
        }
        slot.1 = slot.1.saturating_add(bytes);
        slot.2 = slot.2.saturating_add(requests);
    }

    /// The rate over the last [`Meter::WINDOW`] whole seconds.
    pub fn rate(&self) -> Measured {
        let s = self.lock();
        let now = s.started.elapsed().as_secs();
        let seconds = now.clamp(1, Self::WINDOW);
        let (mut bytes, mut requests) = (0u64, 0u64);
        for (second, b, r) in s.slots {
            if second < now && now - second <= seconds {
                bytes = bytes.saturating_add(b);
                requests = requests.saturating_add(r);
            }
        }
        Measured {
            bytes_per_second: bytes as f64 / seconds as f64,
            requests_per_second: requests as f64 / seconds as f64,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_rate_is_the_last_ten_whole_seconds() {
        let m = Meter::default();
        assert_eq!(m.rate(), Measured::default());
        for _ in 0..30 {
            m.add(1000, 2);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // 15 s in: the ten whole seconds before the current one held 2,000 B and 4 requests each.
        assert_eq!(
            m.rate(),
            Measured {
                bytes_per_second: 2000.0,
                requests_per_second: 4.0
            }
        );
        // Quiet for 5 s: half the window is empty.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(m.rate().bytes_per_second, 1000.0);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(m.rate(), Measured::default());
    }

    #[tokio::test(start_paused = true)]
    async fn a_young_meter_divides_by_the_seconds_it_has_counted() {
        let m = Meter::default();
        m.add(3000, 1);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        m.add(3000, 1);
        // One whole second behind us, which held 3,000 B.
        assert_eq!(m.rate().bytes_per_second, 3000.0);
    }
}
