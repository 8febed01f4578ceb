//! The bounds of what a request may hold, checked before anything is looked up or written.
//!
//! Every text field a client sends has a byte limit and holds no control character (a NUL in
//! particular: PostgreSQL refuses it in `TEXT`, SQLite stores it, so without this check the two
//! registries would answer the same request differently); every number has a range. A value
//! out of bounds is a [`FieldError`] (`INVALID_ARGUMENT`, `error.rs`) with a message naming the
//! field and its limit, and shows
//! at most [`QUOTED_CHARS`] characters of what was sent, so an error never echoes a megabyte
//! back. Nothing here touches the registry: a refused request leaves it as it was.
//!
//! `page_size` is the one field that is coerced instead of refused: above [`MAX_PAGE_SIZE`] it
//! means [`MAX_PAGE_SIZE`], as Google's API guidelines (AIP-158) ask of paged lists.

use std::collections::BTreeMap;

use super::StoreOptions;
// The flags' ranges: an option the API takes is one a flag would take, and the reverse.
use crate::worker::limits as worker_limits;

/// The longest destination URL accepted.
pub const MAX_DESTINATION_BYTES: usize = 4096;
/// The most labels one store may carry.
pub const MAX_LABELS: usize = 64;
/// The longest label key.
pub const MAX_LABEL_KEY_BYTES: usize = 256;
/// The longest label value.
pub const MAX_LABEL_VALUE_BYTES: usize = 1024;
/// The longest interval a store may set (`wal_interval_ms`, `restore_point_interval_ms`,
/// `retention_interval_ms`): one day.
pub const MAX_INTERVAL_MS: u64 = worker_limits::INTERVAL_MS.max;
/// The longest `keep_for_ms`: 100 years, far inside what every millisecond count the worker
/// computes with (`i64` milliseconds since the epoch) can hold.
pub const MAX_KEEP_FOR_MS: u64 = worker_limits::KEEP_FOR_MS.max;
/// The most generations retention may be told to keep.
pub const MAX_KEEP_GENERATIONS: u64 = worker_limits::KEEP_GENERATIONS.max;
/// The shortest `drill_interval_ms` (a drill restores a whole store): one minute.
pub const MIN_DRILL_INTERVAL_MS: u64 = 60_000;
/// The longest `drill_interval_ms`: 30 days.
pub const MAX_DRILL_INTERVAL_MS: u64 = 30 * 24 * 3_600_000;
/// The largest page of restore points (a larger `page_size` is coerced to it).
pub const MAX_PAGE_SIZE: u32 = 1000;
/// `RegisterRequest.instance_id` / `AdoptRequest.instance_id`: an instance id, at most this long.
pub const MAX_INSTANCE_ID_BYTES: usize = 255;
/// The page size when a request names none.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// The longest page token (the tokens this server gives are a manifest key and a span, at
/// most 56 bytes: `crate::listing::Cursor::token`).
pub const MAX_PAGE_TOKEN_BYTES: usize = 64;
/// How much of a refused value an error message shows.
pub const QUOTED_CHARS: usize = 256;

/// A request field that is not what it may be: the message names the field and its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FieldError(pub String);

/// `s` in quotes for an error message: Debug-escaped, cut after [`QUOTED_CHARS`] characters.
pub fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTED_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

/// Checks a text field: at most `max` bytes, and no control character.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.len() > max {
        return Err(FieldError(format!(
            "{field} is longer than {max} bytes ({} bytes)",
            value.len()
        )));
    }
    if let Some((at, c)) = value.char_indices().find(|(_, c)| c.is_control()) {
        let what = if c == '\0' {
            "NUL".to_string()
        } else {
            format!("a control character (U+{:04X})", u32::from(c))
        };
        return Err(FieldError(format!(
            "{field} must not contain {what} (found at byte {at} of {})",
            quote(value)
        )));
    }
    Ok(())
}

/// Checks a store id: store ids are the UUIDs `Register` and `Adopt` hand out.
pub fn check_store_id(id: &str) -> Result<(), FieldError> {
    if id.is_empty() {
        return Err(FieldError("store_id is empty".into()));
    }
    if id.len() > 36 || uuid::Uuid::try_parse(id).is_err() {
        return Err(FieldError(format!(
            "store_id must be a store id (a UUID of 36 characters), not {}",
            quote(id)
        )));
    }
    Ok(())
}

/// Checks a store's labels: at most [`MAX_LABELS`], keys 1 to [`MAX_LABEL_KEY_BYTES`] bytes,
/// values at most [`MAX_LABEL_VALUE_BYTES`], no control characters.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if labels.len() > MAX_LABELS {
        return Err(FieldError(format!(
            "labels: at most {MAX_LABELS} entries ({} given)",
            labels.len()
        )));
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_LABEL_KEY_BYTES {
            return Err(FieldError(format!(
                "label key must be 1 to {MAX_LABEL_KEY_BYTES} bytes ({} bytes: {})",
                k.len(),
                quote(k)
            )));
        }
        check_text("label key", k, MAX_LABEL_KEY_BYTES)?;
        check_text(
            &format!("label {} value", quote(k)),
            v,
            MAX_LABEL_VALUE_BYTES,
        )?;
    }
    Ok(())
}

/// Checks a store's options: each either unset (the service's default) or in its range.
pub fn check_options(o: &StoreOptions) -> Result<(), FieldError> {
    let intervals = format!("{MAX_INTERVAL_MS} (1 day)");
    let keep_for = format!("{MAX_KEEP_FOR_MS} (100 years)");
    let generations = MAX_KEEP_GENERATIONS.to_string();
    let ranges: [(&str, Option<u64>, u64, &str); 8] = [
        (
            "wal_interval_ms",
            o.wal_interval_ms,
            MAX_INTERVAL_MS,
            &intervals,
        ),
        (
            "restore_point_interval_ms",
            o.restore_point_interval_ms,
            MAX_INTERVAL_MS,
            &intervals,
        ),
        (
            "retention_interval_ms",
            o.retention_interval_ms,
            MAX_INTERVAL_MS,
            &intervals,
        ),
        ("keep_for_ms", o.keep_for_ms, MAX_KEEP_FOR_MS, &keep_for),
        (
            "keep_generations",
            o.keep_generations,
            MAX_KEEP_GENERATIONS,
            &generations,
        ),
        (
            "keep_daily",
            o.keep_daily,
            MAX_KEEP_GENERATIONS,
            &generations,
        ),
        (
            "keep_weekly",
            o.keep_weekly,
            MAX_KEEP_GENERATIONS,
            &generations,
        ),
        (
            "keep_monthly",
            o.keep_monthly,
            MAX_KEEP_GENERATIONS,
            &generations,
        ),
    ];
    if o.compression.as_deref() == Some("none") && o.compression_level.is_some() {
        return Err(FieldError(
            "options.compression_level applies to compression zstd, not none".into(),
        ));
    }
    o.compression().map_err(|e| FieldError(e.to_string()))?;
    o.object_lock().map_err(FieldError)?;
    if let Some(r) = &o.replica {
        check_text("options.replica", r, MAX_DESTINATION_BYTES)?;
    }
    if let Some(d) = &o.durability {
        crate::worker::DurabilityMode::parse(d).map_err(|e| FieldError(format!("options.{e}")))?;
    }
    if let Some(v) = o.wal_puts_per_second {
        worker_limits::WAL_PUTS_PER_SECOND
            .check("options.wal_puts_per_second", v)
            .map_err(|e| FieldError(format!("{e}, or 0 for the service's default")))?;
    }
    if let Some(v) = o.drill_interval_ms
        && !(MIN_DRILL_INTERVAL_MS..=MAX_DRILL_INTERVAL_MS).contains(&v)
    {
        return Err(FieldError(format!(
            "options.drill_interval_ms must be {MIN_DRILL_INTERVAL_MS} (1 minute) to \
             {MAX_DRILL_INTERVAL_MS} (30 days), or 0 for no scheduled drills ({v} given)"
        )));
    }
    for (field, value, max, shown) in ranges {
        if let Some(v) = value
            && !(1..=max).contains(&v)
        {
            return Err(FieldError(format!(
                "options.{field} must be 1 to {shown}, or 0 for the service's default ({v} given)"
            )));
        }
    }
    Ok(())
}

/// `o` with every option brought into its range: what a store registered before these bounds
/// (or with a registry edited by hand) runs with. Clamping only ever keeps more or works less
/// often, never deletes sooner.
pub fn clamp_options(o: &StoreOptions) -> StoreOptions {
    let clamp = |v: Option<u64>, max: u64| v.map(|v| v.clamp(1, max));
    let compression_ok = !(o.compression.as_deref() == Some("none")
        && o.compression_level.is_some())
        && o.compression().is_ok();
    StoreOptions {
        wal_interval_ms: clamp(o.wal_interval_ms, MAX_INTERVAL_MS),
        restore_point_interval_ms: clamp(o.restore_point_interval_ms, MAX_INTERVAL_MS),
        retention_interval_ms: clamp(o.retention_interval_ms, MAX_INTERVAL_MS),
        keep_for_ms: clamp(o.keep_for_ms, MAX_KEEP_FOR_MS),
        keep_generations: clamp(o.keep_generations, MAX_KEEP_GENERATIONS),
        // Unusable values fall back to the service's default.
        compression: compression_ok.then(|| o.compression.clone()).flatten(),
        compression_level: compression_ok.then_some(o.compression_level).flatten(),
        drill_interval_ms: o
            .drill_interval_ms
            .map(|v| v.clamp(MIN_DRILL_INTERVAL_MS, MAX_DRILL_INTERVAL_MS)),
        // Any number of requests is a budget.
        monthly_request_budget: o.monthly_request_budget,
        keep_daily: clamp(o.keep_daily, MAX_KEEP_GENERATIONS),
        keep_weekly: clamp(o.keep_weekly, MAX_KEEP_GENERATIONS),
        keep_monthly: clamp(o.keep_monthly, MAX_KEEP_GENERATIONS),
        // Never dropped: a write-once prefix written mutably would be refused by its worker.
        object_lock: o.object_lock.clone(),
        // An unknown mode runs with the service's default.
        durability: o
            .durability
            .clone()
            .filter(|d| crate::worker::DurabilityMode::parse(d).is_ok()),
        // Checked at registration; a worker that cannot open it is unhealthy, the primary not.
        replica: o.replica.clone(),
        // Never dropped: a standby run as a primary would write to its destination.
        standby: o.standby,
        wal_puts_per_second: o.wal_puts_per_second.map(|v| {
            v.clamp(
                worker_limits::WAL_PUTS_PER_SECOND.min,
                worker_limits::WAL_PUTS_PER_SECOND.max,
            )
        }),
    }
}

/// Checks a page token's size (its content is checked against the listing it pages).
pub fn check_page_token(token: &str) -> Result<(), FieldError> {
    check_text("page_token", token, MAX_PAGE_TOKEN_BYTES)
}

/// The page size a request's `page_size` stands for (0: the default; above the maximum: the
/// maximum).
pub fn page_size(requested: u32) -> usize {
    let size = match requested {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    size as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_is_bounded() {
        assert_eq!(quote("ab"), "\"ab\"");
        let long = "é".repeat(1000);
        let q = quote(&long);
        assert!(q.len() < 4 * QUOTED_CHARS + 32, "{q}");
        assert!(q.ends_with("(2000 bytes)"), "{q}");
        assert_eq!(quote("a\0b"), "\"a\\0b\"");
    }

    #[test]
    fn texts_and_ids_are_bounded() {
        assert!(check_text("f", "abc", 3).is_ok());
        let e = check_text("f", "abcd", 3).unwrap_err().to_string();
        assert_eq!(e, "f is longer than 3 bytes (4 bytes)");
        let e = check_text("f", "a\0", 3).unwrap_err().to_string();
        assert!(
            e.starts_with("f must not contain NUL (found at byte 1"),
            "{e}"
        );
        let e = check_text("f", "a\n", 3).unwrap_err().to_string();
        assert!(e.contains("U+000A"), "{e}");
        assert!(check_store_id("00000000-0000-0000-0000-000000000000").is_ok());
        assert!(check_store_id("").is_err());
        assert!(check_store_id("nope").is_err());
        assert!(check_store_id(&"0".repeat(10_000)).is_err());
    }

    #[test]
    fn options_have_ranges() {
        let ok = StoreOptions {
            wal_interval_ms: Some(1),
            restore_point_interval_ms: Some(MAX_INTERVAL_MS),
            retention_interval_ms: None,
            keep_for_ms: Some(MAX_KEEP_FOR_MS),
            keep_generations: Some(1),
            compression: Some("zstd".into()),
            compression_level: Some(19),
            drill_interval_ms: Some(MIN_DRILL_INTERVAL_MS),
            monthly_request_budget: Some(u64::MAX),
            keep_daily: Some(7),
            keep_weekly: Some(4),
            keep_monthly: Some(MAX_KEEP_GENERATIONS),
            object_lock: Some("governance".into()),
            durability: Some("sync".into()),
            wal_puts_per_second: Some(100),
            replica: Some("s3://b/replica?region=r".into()),
            standby: Some(true),
        };
        assert!(check_options(&ok).is_ok());
        for bad in [
            StoreOptions {
                keep_for_ms: Some(1 << 63),
                ..ok.clone()
            },
            StoreOptions {
                keep_generations: Some(0),
                ..ok.clone()
            },
            StoreOptions {
                wal_interval_ms: Some(MAX_INTERVAL_MS + 1),
                ..ok.clone()
            },
            StoreOptions {
                compression_level: Some(20),
                ..ok.clone()
            },
            StoreOptions {
                compression: Some("lz4".into()),
                ..ok.clone()
            },
            StoreOptions {
                compression: Some("none".into()),
                ..ok.clone()
            },
            StoreOptions {
                drill_interval_ms: Some(MIN_DRILL_INTERVAL_MS - 1),
                ..ok.clone()
            },
            StoreOptions {
                durability: Some("eventually".into()),
                ..ok.clone()
            },
            StoreOptions {
                wal_puts_per_second: Some(1001),
                ..ok.clone()
            },
            StoreOptions {
                drill_interval_ms: Some(MAX_DRILL_INTERVAL_MS + 1),
                ..ok.clone()
            },
        ] {
            assert!(check_options(&bad).is_err(), "{bad:?}");
        }
        let wild = StoreOptions {
            keep_for_ms: Some(u64::MAX),
            keep_generations: Some(0),
            compression_level: Some(99),
            ..ok.clone()
        };
        let clamped = clamp_options(&wild);
        assert!(check_options(&clamped).is_ok(), "{clamped:?}");
        assert_eq!(clamped.keep_for_ms, Some(MAX_KEEP_FOR_MS));
        assert_eq!(clamped.keep_generations, Some(1));
        assert_eq!(clamp_options(&ok), ok);
        assert_eq!(page_size(0), 100);
        assert_eq!(page_size(u32::MAX), 1000);
    }
}
