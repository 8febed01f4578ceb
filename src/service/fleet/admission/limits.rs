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

/// The longest destination URL accepted.
pub const MAX_DESTINATION_BYTES: usize = 4096;
/// The most labels one store may carry.
pub const MAX_LABELS: usize = 64;
/// The longest label key.
pub const MAX_LABEL_KEY_BYTES: usize = 256;
/// The longest label value.
pub const MAX_LABEL_VALUE_BYTES: usize = 1024;
/// The shortest `drill_interval_ms` (a drill restores a whole store): one minute.
pub const MIN_DRILL_INTERVAL_MS: u64 = 60_000;
/// The longest `drill_interval_ms`: 30 days.
pub const MAX_DRILL_INTERVAL_MS: u64 = 30 * 24 * 3_600_000;
/// The longest restore-time target a store may state (`options.rto_target_seconds`): 30 days.
pub const MAX_RTO_TARGET_SECONDS: u64 = 30 * 24 * 3_600;
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
    use crate::bucket::write_once::LockMode;
    use crate::service::fleet::StoreOptions;
    use crate::worker::DurabilityMode;
    use crate::worker::limits::{INTERVAL_MS, KEEP_FOR_MS, KEEP_GENERATIONS};
    use crate::worker::overrides::{CompressionKind, WorkerOverrides};

    const MAX_INTERVAL_MS: u64 = INTERVAL_MS.max;
    const MAX_KEEP_FOR_MS: u64 = KEEP_FOR_MS.max;
    const MAX_KEEP_GENERATIONS: u64 = KEEP_GENERATIONS.max;

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
            worker: WorkerOverrides {
                wal_interval_ms: Some(1),
                restore_point_interval_ms: Some(MAX_INTERVAL_MS),
                retention_interval_ms: None,
                keep_for_ms: Some(MAX_KEEP_FOR_MS),
                keep_generations: Some(1),
                compression: Some(CompressionKind::Zstd),
                compression_level: Some(19),
                keep_daily: Some(7),
                keep_weekly: Some(4),
                keep_monthly: Some(MAX_KEEP_GENERATIONS),
                object_lock: Some(LockMode::Governance),
                durability: Some(DurabilityMode::Sync),
                wal_puts_per_second: Some(100),
                orphan_grace_ms: Some(60_000),
            },
            drill_interval_ms: Some(MIN_DRILL_INTERVAL_MS),
            monthly_request_budget: Some(u64::MAX),
            rto_target_seconds: Some(MAX_RTO_TARGET_SECONDS),
            replica: Some("s3://b/replica?region=r".into()),
            standby: Some(true),
            limits: vec!["bulk=4000000".into(), "check=unlimited,requests=5".into()],
        };
        assert!(ok.check().is_ok());
        let e = StoreOptions {
            limits: vec!["bulk=4000000".into(), "wal=1".into()],
            ..ok.clone()
        };
        let e = e.check().unwrap_err().0;
        assert!(e.contains("options.limits") && e.contains("wal=1"), "{e}");
        for bad in [0, MAX_RTO_TARGET_SECONDS + 1] {
            let o = StoreOptions {
                rto_target_seconds: Some(bad),
                ..StoreOptions::default()
            };
            let e = o.check().unwrap_err().0;
            assert!(e.starts_with("options.rto_target_seconds must be"), "{e}");
        }
        let worker = |w: WorkerOverrides| StoreOptions {
            worker: w,
            ..ok.clone()
        };
        for bad in [
            worker(WorkerOverrides {
                keep_for_ms: Some(1 << 63),
                ..ok.worker.clone()
            }),
            worker(WorkerOverrides {
                keep_generations: Some(0),
                ..ok.worker.clone()
            }),
            worker(WorkerOverrides {
                wal_interval_ms: Some(MAX_INTERVAL_MS + 1),
                ..ok.worker.clone()
            }),
            worker(WorkerOverrides {
                compression_level: Some(20),
                ..ok.worker.clone()
            }),
            worker(WorkerOverrides {
                compression: Some(CompressionKind::None),
                ..ok.worker.clone()
            }),
            StoreOptions {
                drill_interval_ms: Some(MIN_DRILL_INTERVAL_MS - 1),
                ..ok.clone()
            },
            worker(WorkerOverrides {
                wal_puts_per_second: Some(1001),
                ..ok.worker.clone()
            }),
            StoreOptions {
                drill_interval_ms: Some(MAX_DRILL_INTERVAL_MS + 1),
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        let wild = worker(WorkerOverrides {
            keep_for_ms: Some(u64::MAX),
            keep_generations: Some(0),
            compression_level: Some(99),
            ..ok.worker.clone()
        });
        let clamped = wild.clamped();
        assert!(clamped.check().is_ok(), "{clamped:?}");
        assert_eq!(clamped.worker.keep_for_ms, Some(MAX_KEEP_FOR_MS));
        assert_eq!(clamped.worker.keep_generations, Some(1));
        assert_eq!(ok.clamped(), ok);
        assert_eq!(page_size(0), 100);
        assert_eq!(page_size(u32::MAX), 1000);
    }
}
