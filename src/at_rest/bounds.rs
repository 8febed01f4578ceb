//! What plain length an object's stored bytes can honestly decode to, checked before a byte
//! is decoded or a buffer sized (decompression bombs, issue 25 part 1). A manifest entry or a
//! segment key claiming more is refused with an error naming the object; nothing is written
//! from it.
//!
//! The limits are the writer's real ones and the codec's, not guesses:
//! - **zstd**: a block regenerates at most 128 KiB and takes at least 4 stored bytes (a 3-byte
//!   block header and the one byte of an RLE block), so a zstd stream of `n` bytes decodes to
//!   at most `n × 32,768` ([`ZSTD_MAX_RATIO`]). Our own writer reaches nearly that on runs of
//!   zeros (zstd emits RLE blocks), so no lower ratio can be refused without refusing honest
//!   objects. A sealed object's stored bytes are longer than the zstd stream inside them, so
//!   the same bound holds for it.
//! - **raw** (codec `none`): exactly the stored length; sealed raw: less than the stored length.
//! - **segments**: the worker ships at most [`SEGMENT_MAX`] bytes of `wal.bin` per segment (it
//!   always has: `worker::MAX_SEGMENT_BYTES`), so a segment key (or entry) claiming a longer
//!   range was not written by it.
//! - **stored length**: at most [`STORED_MAX`] (S3's largest object), checked before a
//!   restore plans its ranged GETs.
//! - **zstd window**: the writer's levels (1 to 19, `super::LEVELS`) use windows of at most
//!   2^23 bytes; the decoder refuses frames asking for more than 2^[`ZSTD_WINDOW_LOG_MAX`]
//!   (zstd's own default limit is 2^27), so one frame costs at most 16 MiB of window.
//!
//! These bound what a restore writes to disk (the plain sink refuses more than the entry
//! states) and refuse what no writer made, but memory is bounded separately: every decoder
//! streams its plain bytes into a file or a buffer of a constant size (`restore::decode`,
//! `verify`), whatever the plain length.

use crate::manifest::{Codec, ObjectEntry};

/// The most plain bytes one stored byte of a zstd stream decodes to (see the module docs).
pub const ZSTD_MAX_RATIO: u64 = 32_768;

/// The largest zstd window (as a power of two) a decoder accepts.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;

/// The longest segment (plain bytes of `wal.bin`) a writer ships: the worker's
/// `MAX_SEGMENT_BYTES` is defined as this, so the two cannot drift apart (and this floor does
/// not import the worker above it).
pub const SEGMENT_MAX: u64 = 32 << 20;

/// The most stored bytes one object can have: S3's largest object (5 TiB). A manifest entry
/// stating more is refused before anything is sized by it (a restore plans one ranged GET per
/// 16 MiB of it).
pub const STORED_MAX: u64 = 5 << 40;

/// The most stored bytes one restore plans (every object a manifest names, and the segments
/// past it): 16 TiB. A restore plans one ranged GET (a few dozen bytes of bookkeeping) per
/// 16 MiB before its first request, so without a total a manifest of many entries each just
/// under [`STORED_MAX`] (a few KiB of JSON) would size gigabytes of plan: with it, at most
/// 2^20 ranges (reasoned from the sizes of their entries, not measured: some 64 MiB). A store larger than this is restored by no single restore.
pub const RESTORE_STORED_MAX: u64 = 16 << 40;

/// Why a restore of `total` stored bytes is refused, if it is (the detail, without the key).
pub fn restore_total_problem(total: u64) -> Option<String> {
    (total > RESTORE_STORED_MAX).then(|| {
        format!(
            "the restore point and the segments past it state {total} stored bytes in all, more \
             than one restore plans ({RESTORE_STORED_MAX}): refused before downloading (a \
             corrupt or hostile manifest)"
        )
    })
}

/// Why an entry's stored length `len` cannot be an object's, if it cannot (the detail,
/// without the key).
pub fn stored_len_problem(len: u64) -> Option<String> {
    (len > STORED_MAX).then(|| {
        format!(
            "the manifest states {len} stored bytes, more than an object store holds in one \
             object ({STORED_MAX}): refused before downloading (a corrupt or hostile entry)"
        )
    })
}

/// The most plain bytes `stored` bytes of `codec` decode to.
pub fn max_plain_len(codec: Codec, stored: u64) -> u64 {
    match codec {
        Codec::None => stored,
        Codec::Zstd => stored.saturating_mul(ZSTD_MAX_RATIO),
    }
}

/// Why `entry`'s plain length cannot be what its stored bytes decode to, if it cannot (the
/// detail, without the key).
pub fn plain_len_problem(entry: &ObjectEntry) -> Option<String> {
    let max = max_plain_len(entry.codec, entry.len);
    (entry.plain_len() > max).then(|| {
        format!(
            "the manifest states {} plain bytes from {} stored bytes of codec {}{}, which decode \
             to at most {max}: refused before decoding (a corrupt or hostile entry)",
            entry.plain_len(),
            entry.len,
            entry.codec.name(),
            if entry.encrypted { ", encrypted" } else { "" },
        )
    })
}

/// Why a segment of `len` plain bytes (from its key or entry) was not written by a worker, if
/// it was not (the detail, without the key).
pub fn segment_len_problem(len: u64) -> Option<String> {
    (len > SEGMENT_MAX).then(|| {
        format!(
            "its key claims {len} plain bytes of wal.bin, and a writer ships segments of at most \
             {SEGMENT_MAX}: refused before downloading (a corrupt or hostile object)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(codec: Codec, len: u64, plain: u64) -> ObjectEntry {
        let mut e = ObjectEntry::raw(
            "gen/0000000001/snapshot.bin".into(),
            len,
            0,
            uuid::Uuid::nil(),
            1,
        );
        e.codec = codec;
        e.plain_len = Some(plain);
        e.plain_crc = Some(0);
        e
    }

    #[test]
    fn zstd_entries_are_bounded_by_the_format_ratio() {
        assert_eq!(
            plain_len_problem(&entry(Codec::Zstd, 1 << 20, 1 << 35)),
            None
        );
        let p = plain_len_problem(&entry(Codec::Zstd, 1 << 20, (1 << 35) + 1)).unwrap();
        assert!(p.contains("34359738369 plain bytes from 1048576"), "{p}");
        assert!(plain_len_problem(&entry(Codec::Zstd, 100, 1 << 35)).is_some());
        assert!(plain_len_problem(&entry(Codec::Zstd, u64::MAX, u64::MAX)).is_none());
    }

    #[test]
    fn raw_and_sealed_raw_never_grow() {
        let mut sealed = entry(Codec::None, 100, 101);
        sealed.encrypted = true;
        assert!(plain_len_problem(&sealed).is_some());
        sealed.plain_len = Some(60);
        assert!(plain_len_problem(&sealed).is_none());
    }

    #[test]
    fn stored_lengths_and_segments_are_at_most_what_a_writer_makes() {
        type Check = fn(u64) -> Option<String>;
        let cases: [(Check, u64, u64); 3] = [
            (stored_len_problem, STORED_MAX, 1 << 63),
            (restore_total_problem, RESTORE_STORED_MAX, 1 << 50),
            (segment_len_problem, SEGMENT_MAX, 1 << 40),
        ];
        for (check, max, claim) in cases {
            assert_eq!(check(max), None);
            assert!(check(claim).unwrap().contains(&claim.to_string()));
        }
    }

    /// The writer's zstd on zeros comes near the format's bound, so the bound is not slack.
    #[test]
    fn the_writer_nears_the_ratio_on_zeros() {
        let plain = vec![0u8; 64 << 20];
        let stored = zstd::bulk::compress(&plain, 3).unwrap();
        let ratio = plain.len() as u64 / stored.len() as u64;
        assert!(
            ratio > ZSTD_MAX_RATIO / 4 && ratio <= ZSTD_MAX_RATIO,
            "{ratio}"
        );
    }
}
