//! The shipped-segment journal (`backup.shipped` in the store directory): the segments this
//! store's worker shipped since its newest restore point, each with the ETag the bucket gave
//! it, so that a restart takes its own segments back from one listing instead of reading every
//! one again (issue 40, finding 7: a busy sync store acknowledged nothing after a restart of
//! `serve` until its worker had re-read, one GET after another, every segment since its
//! restore point: 32 s after 50 s of load at 200 commits/s on moto).
//!
//! # What a line holds, and when it is written
//! After a segment's PUT succeeded (and [`crate::at_rest::chain::segment_stored_problem`]
//! accepted it), one line: the segment's manifest entry (key, stored length and CRC, codec,
//! plain length and CRC or sealed tag, frames), the lineage and generation, and the ETag,
//! followed by a tab and the CRC-32 of the JSON. It is appended without an fsync: the
//! journal is a cache, never the truth. After each restore point the file is emptied
//! (write-temp-fsync-rename), as everything before it is in a manifest.
//!
//! # When an entry is trusted (resume, `super::view`)
//! A segment on the chain the resume chose ([`crate::at_rest::chain`], as a restore chooses
//! it) is taken without a GET only when all of these hold:
//! - the line's CRC checks (a torn last line after a crash is passed over);
//! - its lineage and generation are the ones being resumed, its key is the step's key;
//! - the listing shows the object with the same stored length and the same ETag (the bucket's
//!   MD5 of the bytes for a single-part PUT: an object replaced since, or planted under a key
//!   this worker never wrote, has another ETag or no line at all);
//! - the store's `wal.bin` bytes of its range still match the entry's plain CRC (or sealed
//!   tag), and hold whole frames continuing the commits before it, as many as the entry says.
//!
//! So a trusted segment is one this worker PUT, whose bytes the bucket still holds unchanged,
//! of exactly the WAL the store still has: what a GET and a comparison would have found. Any
//! other segment on the chain (a planted or stale one, finding 2; one shipped by an earlier
//! binary; one whose line was lost) is read and compared as before, and one that fails is
//! routed around. A journal that is missing, unreadable, larger than [`JOURNAL_CAP`] or
//! foreign costs GETs, never correctness.
//!
//! The journal lives beside `backup.lineage`, the one other file the backup side writes into
//! a store directory; it is never shipped (not a side file) and a restore never writes it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::manifest::SegmentEntry;
use crate::store::dir::{FileKind, StoreDir};

/// The journal's file name in the store directory.
pub const JOURNAL_FILE: &str = crate::store::disk::SHIPPED_FILE;

/// A journal larger than this is not read (resume reads every segment instead): 64 MiB, some
/// 200,000 segments.
pub const JOURNAL_CAP: u64 = 64 << 20;

/// One shipped segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    pub lineage: Uuid,
    pub generation: u64,
    pub segment: SegmentEntry,
    /// The ETag the bucket answered the PUT with (quotes as the bucket gave them).
    pub etag: String,
}

/// One line of the journal for `s` (newline included).
pub fn line(s: &Shipped) -> Vec<u8> {
    let json = serde_json::to_string(s).expect("a journal entry serialises");
    format!("{json}\t{:08x}\n", crc32fast::hash(json.as_bytes())).into_bytes()
}

/// The entries of a journal's bytes whose lines check, by key; later lines win.
pub fn parse(bytes: &[u8]) -> HashMap<String, Shipped> {
    let mut out = HashMap::new();
    for raw in bytes.split(|b| *b == b'\n') {
        let Ok(text) = std::str::from_utf8(raw) else {
            continue;
        };
        let Some((json, crc)) = text.rsplit_once('\t') else {
            continue;
        };
        if u32::from_str_radix(crc, 16).ok() != Some(crc32fast::hash(json.as_bytes())) {
            continue;
        }
        if let Ok(s) = serde_json::from_str::<Shipped>(json) {
            out.insert(s.segment.object.key.clone(), s);
        }
    }
    out
}

/// Whether two ETags name the same object version (quotes aside).
pub fn same_etag(a: &str, b: &str) -> bool {
    let bare = |e: &str| e.trim().trim_matches('"').to_string();
    !a.is_empty() && bare(a) == bare(b)
}

/// Appends `s` to the journal of `store` (no fsync: see the module docs), unless it has
/// reached [`JOURNAL_CAP`] (restore points failing for long): then `false`, and a restart
/// reads the later segments instead. Blocking.
pub fn append(store: &StoreDir, s: &Shipped) -> Result<bool, crate::store::dir::DirError> {
    store.append(JOURNAL_FILE, &line(s), JOURNAL_CAP)
}

/// Empties the journal (after a restore point). Blocking.
pub fn clear(store: &StoreDir) -> Result<(), crate::store::dir::DirError> {
    match store.stat(JOURNAL_FILE, FileKind::Store)? {
        Some(st) if st.len == 0 => Ok(()),
        None => Ok(()),
        Some(_) => store.write_durably(JOURNAL_FILE, b""),
    }
}

/// The journal's entries, or none when it is missing, too large or unreadable (logged).
/// Blocking.
pub fn read(store: &StoreDir) -> HashMap<String, Shipped> {
    match store.read_capped(JOURNAL_FILE, FileKind::Store, JOURNAL_CAP) {
        Ok(Some(bytes)) => parse(&bytes),
        Ok(None) => HashMap::new(),
        Err(e) => {
            tracing::warn!("{JOURNAL_FILE} not used (every shipped segment is read instead): {e}");
            HashMap::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ObjectEntry;

    fn shipped(start: u64) -> Shipped {
        let key = crate::manifest::segment_key(1, start, start + 10);
        Shipped {
            lineage: Uuid::nil(),
            generation: 1,
            segment: SegmentEntry {
                object: ObjectEntry::raw(key, 10, 7, Uuid::nil(), 1),
                start,
                end: start + 10,
                frames: 2,
            },
            etag: "\"abc\"".into(),
        }
    }

    #[test]
    fn lines_round_trip_and_torn_or_edited_lines_are_passed_over() {
        let mut bytes = line(&shipped(0));
        bytes.extend(line(&shipped(10)));
        let mut edited = line(&shipped(20));
        edited[5] ^= 1;
        bytes.extend(edited);
        let torn = line(&shipped(30));
        bytes.extend(&torn[..torn.len() - 4]);
        let got = parse(&bytes);
        let mut starts: Vec<u64> = got.values().map(|s| s.segment.start).collect();
        starts.sort();
        assert_eq!(starts, [0, 10]);
        assert_eq!(got[&shipped(10).segment.object.key], shipped(10));
    }

    #[test]
    fn etags_compare_without_quotes_and_an_empty_one_is_never_the_same() {
        assert!(same_etag("\"abc\"", "abc"));
        assert!(!same_etag("\"abc\"", "\"abd\""));
        assert!(!same_etag("", ""));
    }
}
