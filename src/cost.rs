//! What a store's backup costs at its object store: a price table ([`Prices`]) and a monthly
//! estimate from a store's [`UsageSnapshot`] ([`estimate`]).
//!
//! # The price table
//!
//! In US dollars. The default is AWS S3 Standard in us-east-1 (first 50 TB, as listed on
//! 2026-12-01): storage $0.023 per GB-month; PUT, COPY, POST and LIST $0.005 per 1,000; GET
//! and HEAD (every other request) $0.0004 per 1,000; DELETE free; data out 0 (backups are
//! written from, and restored into, the same region; set `egress_per_gb` otherwise). A GB is
//! 2^30 bytes, as AWS bills. The serve TOML's `[prices]` table overrides any of the keys
//! ([`Prices::KEYS`]); an unknown key, a negative or non-finite price is refused at start
//! ([`PriceError`]). docs/operators-guide.md ("What a store costs") gives tables for Cloudflare R2 and Backblaze B2.
//!
//! # The estimate
//!
//! Requests per month are extrapolated from the rate since the store's usage counts started
//! (the worker's start in this process): `count × month / window`, a month being 730 hours as
//! AWS bills. A window under a minute is taken as a minute, so the first seconds (a resume's
//! burst of listings) do not project into millions. Storage is what the usage says is stored
//! now, held for the month. Bytes downloaded are priced at `egress_per_gb`. The estimate is a
//! projection of the recent past, not a bill: a restore, a new generation or a retention pass
//! moves it, and it forgets everything before the process started.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bucket::usage::{RequestClass, UsageSnapshot};

/// One month, as AWS bills: 730 hours.
pub const MONTH: Duration = Duration::from_secs(730 * 3600);
/// The shortest window the rate is taken over (see the module docs).
pub const MIN_WINDOW: Duration = Duration::from_secs(60);
const GB: f64 = (1u64 << 30) as f64;

/// `bytes` stored for a month, priced.
pub fn storage_usd(bytes: u64, prices: &Prices) -> f64 {
    bytes as f64 / GB * prices.storage_gb_month
}

/// Prices in US dollars; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prices {
    /// Per GB stored for a month.
    pub storage_gb_month: f64,
    /// Per 1,000 PUT requests.
    pub put_per_1000: f64,
    /// Per 1,000 LIST requests.
    pub list_per_1000: f64,
    /// Per 1,000 GET requests (whole or ranged).
    pub get_per_1000: f64,
    /// Per 1,000 HEAD requests.
    pub head_per_1000: f64,
    /// Per 1,000 DELETE requests.
    pub delete_per_1000: f64,
    /// Per GB downloaded.
    pub egress_per_gb: f64,
}

impl Default for Prices {
    /// AWS S3 Standard, us-east-1.
    fn default() -> Self {
        Prices {
            storage_gb_month: 0.023,
            put_per_1000: 0.005,
            list_per_1000: 0.005,
            get_per_1000: 0.0004,
            head_per_1000: 0.0004,
            delete_per_1000: 0.0,
            egress_per_gb: 0.0,
        }
    }
}

/// A price table that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PriceError {
    #[error("prices.{key} = {value}: a price must be a finite number of dollars, 0 or more")]
    Invalid { key: &'static str, value: f64 },
}

impl Prices {
    /// The TOML keys, in the order of the struct.
    pub const KEYS: [&'static str; 7] = [
        "storage_gb_month",
        "put_per_1000",
        "list_per_1000",
        "get_per_1000",
        "head_per_1000",
        "delete_per_1000",
        "egress_per_gb",
    ];

    fn values(&self) -> [f64; 7] {
        [
            self.storage_gb_month,
            self.put_per_1000,
            self.list_per_1000,
            self.get_per_1000,
            self.head_per_1000,
            self.delete_per_1000,
            self.egress_per_gb,
        ]
    }

    /// Every price finite and not negative.
    pub fn check(&self) -> Result<(), PriceError> {
        for (key, value) in Self::KEYS.into_iter().zip(self.values()) {
            if !value.is_finite() || value < 0.0 {
                return Err(PriceError::Invalid { key, value });
            }
        }
        Ok(())
    }

    /// The price of 1,000 requests of `class`.
    pub fn per_1000(&self, class: RequestClass) -> f64 {
        match class {
            RequestClass::Put => self.put_per_1000,
            RequestClass::Get => self.get_per_1000,
            RequestClass::List => self.list_per_1000,
            RequestClass::Head => self.head_per_1000,
            RequestClass::Delete => self.delete_per_1000,
        }
    }
}

/// A month projected from a usage snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Requests a month at the rate seen, every class.
    pub monthly_requests: u64,
    pub requests_usd: f64,
    pub storage_usd: f64,
    pub egress_usd: f64,
    /// The sum of the three.
    pub monthly_usd: f64,
}

/// How many times the window fits in a month (the window at least [`MIN_WINDOW`]).
fn months_per_window(window: Duration) -> f64 {
    MONTH.as_secs_f64() / window.max(MIN_WINDOW).as_secs_f64()
}

/// `x` rounded to a whole number (finite and not negative here; `as` saturates anyway).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn whole(x: f64) -> u64 {
    x.round() as u64
}

/// The month `usage` projects to at `prices`; see the module docs.
pub fn estimate(usage: &UsageSnapshot, prices: &Prices) -> Estimate {
    let scale = months_per_window(Duration::from_millis(usage.window_ms));
    let mut monthly_requests = 0.0;
    let mut requests_usd = 0.0;
    for class in RequestClass::ALL {
        let monthly = usage.requests(class) as f64 * scale;
        monthly_requests += monthly;
        requests_usd += monthly / 1000.0 * prices.per_1000(class);
    }
    let storage_usd = storage_usd(usage.bytes_stored, prices);
    let egress_usd = usage.bytes_downloaded as f64 * scale / GB * prices.egress_per_gb;
    Estimate {
        monthly_requests: whole(monthly_requests),
        requests_usd,
        storage_usd,
        egress_usd,
        monthly_usd: requests_usd + storage_usd + egress_usd,
    }
}

/// The health note of a store whose projected requests exceed its monthly budget, if they do.
pub fn budget_note(estimate: &Estimate, budget: u64) -> Option<String> {
    (budget > 0 && estimate.monthly_requests > budget).then(|| {
        format!(
            "request budget: {} requests a month projected at the rate since the worker started, \
             over the budget of {budget} (options.monthly_request_budget)",
            estimate.monthly_requests
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(window: Duration) -> UsageSnapshot {
        UsageSnapshot {
            put: 1000,
            get: 2000,
            list: 10,
            head: 5,
            delete: 100,
            bytes_downloaded: 1 << 30,
            bytes_stored: 10 << 30,
            window_ms: crate::units::millis_u64(window),
            ..Default::default()
        }
    }

    #[test]
    fn a_month_of_requests_at_the_default_prices() {
        let e = estimate(&usage(MONTH), &Prices::default());
        assert_eq!(e.monthly_requests, 3115);
        let requests = 1.0 * 0.005 + 2.0 * 0.0004 + 0.01 * 0.005 + 0.005 * 0.0004;
        assert!((e.requests_usd - requests).abs() < 1e-9, "{e:?}");
        assert!((e.storage_usd - 0.23).abs() < 1e-9, "{e:?}");
        assert_eq!(e.egress_usd, 0.0);
    }

    #[test]
    fn requests_scale_with_the_window_and_storage_does_not() {
        let day = estimate(
            &usage(Duration::from_secs(730 * 3600 / 30)),
            &Prices::default(),
        );
        let month = estimate(&usage(MONTH), &Prices::default());
        assert_eq!(day.monthly_requests, month.monthly_requests * 30);
        assert_eq!(day.storage_usd, month.storage_usd);
        let short = estimate(&usage(Duration::from_millis(5)), &Prices::default());
        let minute = estimate(&usage(MIN_WINDOW), &Prices::default());
        assert_eq!(short, minute, "a window under a minute counts as a minute");
    }

    #[test]
    fn overrides_change_the_estimate() {
        let r2 = Prices {
            storage_gb_month: 0.015,
            put_per_1000: 0.0045,
            list_per_1000: 0.0045,
            get_per_1000: 0.00036,
            head_per_1000: 0.00036,
            delete_per_1000: 0.0,
            egress_per_gb: 0.0,
        };
        let e = estimate(&usage(MONTH), &r2);
        assert!((e.storage_usd - 0.15).abs() < 1e-9);
        let egress = Prices {
            egress_per_gb: 0.09,
            ..Prices::default()
        };
        assert!((estimate(&usage(MONTH), &egress).egress_usd - 0.09).abs() < 1e-9);
    }

    #[test]
    fn bad_prices_are_refused_naming_the_key() {
        let bad = Prices {
            get_per_1000: -1.0,
            ..Prices::default()
        };
        let e = bad.check().unwrap_err().to_string();
        assert!(e.contains("prices.get_per_1000 = -1"), "{e}");
        let nan = Prices {
            storage_gb_month: f64::NAN,
            ..Prices::default()
        };
        assert!(nan.check().is_err());
        assert!(Prices::default().check().is_ok());
        let unknown = toml::from_str::<Prices>("put_per_1000 = 1\nputs = 2\n").unwrap_err();
        assert!(unknown.to_string().contains("puts"), "{unknown}");
        let partial: Prices = toml::from_str("storage_gb_month = 0.006\n").unwrap();
        assert_eq!(partial.put_per_1000, Prices::default().put_per_1000);
    }

    #[test]
    fn the_budget_note_only_over_budget() {
        let e = estimate(&usage(MONTH), &Prices::default());
        assert!(budget_note(&e, 0).is_none());
        assert!(budget_note(&e, 10_000).is_none());
        let note = budget_note(&e, 3000).unwrap();
        assert!(note.contains("3115") && note.contains("3000"), "{note}");
    }
}
