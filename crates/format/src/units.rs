//! Durations, counts and lengths as the wire, the registry and the bucket carry them: every
//! conversion between integer widths or signedness saturates instead of wrapping.
//!
//! Invariant: no `as` cast that can wrap or truncate stands anywhere in the crate (clippy's
//! `cast_possible_wrap`, `cast_possible_truncation` and `cast_sign_loss` are denied in
//! `lib.rs`); a value out of the target's range becomes the nearest value in range. That is the
//! safe direction for every use here: a `keep_for` of 2^63 ms or more is "keep for ever", not a
//! negative age that retention would take as "delete now"; a length past `usize::MAX` is
//! refused by the allocation or read that follows, never silently shortened.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An error and its sources, each `Display`ed on one line (runs of whitespace as one space),
/// joined by ": "; a source that only repeats what is already said (hyper and tonic repeat
/// their I/O errors) is left out. Every error the crate puts into a message reads this way.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = String::new();
    say_once(&mut out, &e.to_string());
    let mut next = e.source();
    while let Some(c) = next {
        say_once(&mut out, &c.to_string());
        next = c.source();
    }
    out
}

fn say_once(out: &mut String, text: &str) {
    let said = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if !said.is_empty() && !out.contains(&said) {
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&said);
    }
}

/// Milliseconds of `d`, saturating at `i64::MAX` (about 292 million years).
pub fn millis_i64(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds of `d`, saturating at `u64::MAX`.
pub fn millis_u64(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Nanoseconds of `d`, saturating at `u64::MAX` (about 584 years).
pub fn nanos_u64(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch, now; 0 on a clock set before 1970.
pub fn unix_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis_i64)
}

/// `n` as an `i64`, saturating at `i64::MAX`.
pub fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `n` as a `u64`, with negatives as 0.
pub fn u64_of(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// `n` as a `usize`, saturating at `usize::MAX` (never reached on 64-bit targets).
pub fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// A length or count as a `u64` (lossless on every target Rust supports).
pub fn u64_len(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// `n` as an `i32`, saturating at the bounds.
pub fn i32_of(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(if n < 0 { i32::MIN } else { i32::MAX })
}

/// `ms` since the epoch as RFC 3339 UTC (or as a count, out of the calendar's range).
pub fn rfc3339_ms(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_saturate_instead_of_wrapping() {
        let huge = Duration::from_millis(u64::MAX);
        assert_eq!(millis_i64(huge), i64::MAX);
        assert_eq!(millis_i64(Duration::from_millis(1 << 63)), i64::MAX);
        assert_eq!(millis_i64(Duration::from_millis((1 << 63) - 1)), i64::MAX);
        assert_eq!(millis_i64(Duration::from_millis(42)), 42);
        assert_eq!(millis_u64(Duration::MAX), u64::MAX);
        assert_eq!(nanos_u64(Duration::from_secs(u64::MAX)), u64::MAX);
        assert_eq!(nanos_u64(Duration::from_nanos(7)), 7);
    }

    #[test]
    fn integers_saturate_at_their_bounds() {
        assert_eq!(i64_of(u64::MAX), i64::MAX);
        assert_eq!(i64_of(5), 5);
        assert_eq!(u64_of(-1), 0);
        assert_eq!(u64_of(i64::MAX), u64::try_from(i64::MAX).unwrap());
        assert_eq!(usize_of(u64::MAX), usize::MAX);
        assert_eq!(i32_of(i64::MAX), i32::MAX);
        assert_eq!(i32_of(i64::MIN), i32::MIN);
        assert_eq!(i32_of(-3), -3);
        assert_eq!(u64_len(9), 9);
    }
}
