//! The range of every number that paces or limits a worker, in one table: the command-line
//! flags, the TOML file and the gRPC API's per-store options are all checked against it, so a
//! value no flag would take cannot arrive through the API, and the reverse.
//!
//! Why ranges at all: an interval of `u64::MAX` ms overflows the `Instant` it is added to (a
//! panic), an interval of 0 spins, and a `keep_for` past `i64::MAX` ms once wrapped negative
//! and made retention delete what it was told to keep. The bounds are generous: nothing a
//! person means is refused, nothing that breaks arithmetic is accepted.

use std::time::Duration;

/// One bounded setting: its range, in its unit.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub min: u64,
    pub max: u64,
    /// `"ms"`, `"days"` or `""` (a count).
    pub unit: &'static str,
}

const DAY_MS: u64 = 24 * 3600 * 1000;

impl Limit {
    /// A duration in milliseconds, `min` to `max`.
    const fn ms(min: u64, max: u64) -> Limit {
        Limit {
            min,
            max,
            unit: "ms",
        }
    }

    /// A count, `min` to `max`.
    const fn count(min: u64, max: u64) -> Limit {
        Limit { min, max, unit: "" }
    }
}

/// `wal_interval`, `restore_point_interval`, `retention_interval`: 1 ms to 1 day.
pub const INTERVAL_MS: Limit = Limit::ms(1, DAY_MS);
/// `keep_for`: up to 100 years (0: restore points are kept by generation count alone).
pub const KEEP_FOR_MS: Limit = Limit::ms(0, 36_500 * DAY_MS);
/// `orphan_grace`: up to 1 year.
pub const ORPHAN_GRACE_MS: Limit = Limit::ms(0, 365 * DAY_MS);
/// `keep_generations`: at least the newest, at most 100,000.
pub const KEEP_GENERATIONS: Limit = Limit::count(1, 100_000);
/// WAL PUTs a second one store may cost (`durability`'s cap): 1 to 1,000. A store committing
/// at N a second whose every commit should ship on its own needs a cap above N: at exactly N
/// the token bucket is a queue at full load, and commits wait for tokens
/// (docs/operators-guide.md, "Durable acknowledgements"). 1,000 a second is about $13,000 a
/// month of PUTs at S3 Standard's price.
pub const WAL_PUTS_PER_SECOND: Limit = Limit::count(1, 1_000);
/// Restore points a retention tier keeps (daily, weekly, monthly): 0 (off) to 100,000.
pub const KEEP_TIER: Limit = Limit::count(0, 100_000);
/// The bucket lease's TTL: [`crate::lease::MIN_TTL`] to [`crate::lease::MAX_TTL`].
pub const LEASE_TTL_MS: Limit = Limit::ms(30, 3600 * 1000);
/// The service's health report interval and owner silence: 1 ms to 1 day.
pub const SERVICE_PERIOD_MS: Limit = INTERVAL_MS;
/// A pause's default and longest deadline (the service's `Pause`): 1 ms to 1 year.
pub const PAUSE_MS: Limit = Limit::ms(1, 365 * DAY_MS);

impl Limit {
    /// `value` if it lies in the range, else an error naming `field` and the range.
    pub fn check(&self, field: &str, value: u64) -> Result<u64, String> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{field} = {value} is out of range: it must be from {} to {}{}",
                self.min,
                self.max,
                if self.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", self.unit)
                },
            ))
        }
    }

    /// [`Limit::check`] of a number of milliseconds, as a duration.
    pub fn check_ms(&self, field: &str, value: u64) -> Result<Duration, String> {
        self.check(field, value).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_out_of_range_names_the_field_and_the_range() {
        assert_eq!(INTERVAL_MS.check("x", 1), Ok(1));
        assert_eq!(INTERVAL_MS.check("x", DAY_MS), Ok(DAY_MS));
        let e = INTERVAL_MS.check("--wal-interval-ms", 0).unwrap_err();
        assert_eq!(
            e,
            "--wal-interval-ms = 0 is out of range: it must be from 1 to 86400000 ms"
        );
        let e = KEEP_GENERATIONS.check("keep_generations", 0).unwrap_err();
        assert!(e.ends_with("from 1 to 100000"), "{e}");
        assert!(KEEP_FOR_MS.check("k", u64::MAX).is_err());
        assert!(KEEP_FOR_MS.check("k", 1 << 63).is_err());
        assert_eq!(
            LEASE_TTL_MS.min,
            crate::units::millis_u64(crate::lease::MIN_TTL)
        );
        assert_eq!(
            LEASE_TTL_MS.max,
            crate::units::millis_u64(crate::lease::MAX_TTL)
        );
    }
}
