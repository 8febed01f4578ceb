//! Resumable restores: the staging record (`.restore.record` in the temporary directory),
//! which says durably which objects of which restore point are complete and checked there,
//! and how a restore run again with the same command finds it and continues.
//!
//! # The record
//! A file of lines, each `<json>\t<crc32 of the json, 8 hex digits>\n`:
//! - the first names what is staged ([`Identity`]): the source (the bucket's URL), the restore
//!   point (lineage, manifest key, the commit restored) and a SHA-256 of the layout (every
//!   object's key, length, CRC, codec, file and offset, in order: the key set);
//! - each next one names one object complete (`{"piece": i, "key": "..."}`).
//!
//! An object's line is appended only after its bytes are fsynced in their file, and the record
//! is fsynced after each append: a line in the record is an object whose bytes are on disk,
//! whose length and CRC (or decoder's check) held as it was fetched. A crash mid-append leaves
//! a torn last line, which fails its CRC or lacks its newline: reading stops there, and the
//! record is cut back to its last whole line before anything is appended again. A line naming
//! an object the layout does not hold at that index is a record of something else: the whole
//! staging directory is discarded.
//!
//! # Finding it again
//! A resumable restore ([`super::RestoreOptions::resumable`]) looks at the temporary
//! directories earlier restores into the same target left (`.<name>.restore-<uuid>`, not
//! locked by a running restore). The first whose record names the same [`Identity`] is
//! continued: its complete objects are kept (files whose objects are all kept are read back
//! with the format's reader again, from disk, before the restore ends), every other object is
//! fetched again, into place at its offset. Every other directory is discarded and named in
//! the log with why (another prefix, restore point or key set; no readable record; `--fresh`).
//! Nothing is mixed: a kept object's bytes only ever sit beside objects of the same layout.
//! A directory that is not this user's, or that another user could write into, is never
//! continued (its objects are kept on the word of its record).
//!
//! # What a crash leaves
//! The temporary directory with its record: the next run of the same restore continues it;
//! any other restore into the target discards it; deleting it by hand is always safe.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::plan::Plan;
use super::{RestoreError, io};

/// The staging record's name inside a temporary restore directory.
pub(crate) const RECORD_NAME: &str = ".restore.record";

/// What a staging directory holds objects of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Identity {
    pub source: String,
    pub lineage: Uuid,
    pub manifest_key: String,
    pub commit_seq: u64,
    /// SHA-256 of the layout, hex.
    pub layout: String,
}

impl Identity {
    /// The identity of a restore of `plan` from `source` whose layout is `described` (each
    /// object's file and its description, in order: `stage::Layout::describe`).
    pub fn of(
        source: &str,
        plan: &Plan,
        described: impl Iterator<Item = (String, String)>,
    ) -> Identity {
        let mut h = Sha256::new();
        for (file, piece) in described {
            h.update(format!("{file}\0{piece}\n").as_bytes());
        }
        Identity {
            source: source.to_string(),
            lineage: plan.manifest.lineage,
            manifest_key: plan.manifest_key.clone(),
            commit_seq: plan.commit_seq,
            layout: hex::encode(h.finalize()),
        }
    }

    /// How it differs from `other`, in words.
    fn differs(&self, other: &Identity) -> String {
        if self.source != other.source {
            format!("it holds a restore from {}", self.source)
        } else if self.manifest_key != other.manifest_key || self.lineage != other.lineage {
            format!(
                "it holds restore point {} (lineage {})",
                self.manifest_key, self.lineage
            )
        } else if self.commit_seq != other.commit_seq {
            format!("it holds a restore to commit {}", self.commit_seq)
        } else {
            "it holds another set of objects".to_string()
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} commit {} of {}",
            self.manifest_key, self.commit_seq, self.source
        )
    }
}

#[derive(Serialize, Deserialize)]
struct PieceLine {
    piece: usize,
    key: String,
}

fn line(json: &str) -> String {
    format!("{json}\t{:08x}\n", crc32fast::hash(json.as_bytes()))
}

/// The whole lines of `bytes` whose CRC holds, and the length they cover.
fn whole_lines(bytes: &[u8]) -> (Vec<&str>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(end) = bytes[at..].iter().position(|b| *b == b'\n') {
        let Ok(text) = std::str::from_utf8(&bytes[at..at + end]) else {
            break;
        };
        let Some((json, crc)) = text.rsplit_once('\t') else {
            break;
        };
        if u32::from_str_radix(crc, 16).ok() != Some(crc32fast::hash(json.as_bytes())) {
            break;
        }
        out.push(json);
        at += end + 1;
    }
    (out, at)
}

/// What an earlier run left complete, by the layout's piece index.
#[derive(Debug, Clone, Default)]
pub(crate) struct Kept {
    pub pieces: Vec<bool>,
}

impl Kept {
    /// Nothing kept of a layout of `n` pieces.
    pub fn none(n: usize) -> Kept {
        Kept {
            pieces: vec![false; n],
        }
    }

    /// Bytes and objects kept, of objects of lengths `lens` (in the layout's order).
    pub fn totals(&self, lens: impl Iterator<Item = u64>) -> (u64, u64) {
        let mut bytes = 0;
        let mut objects = 0;
        for (i, len) in lens.enumerate() {
            if self.pieces[i] {
                bytes += len;
                objects += 1;
            }
        }
        (bytes, objects)
    }
}

/// The open staging record of one restore.
#[derive(Debug)]
pub(crate) struct Record {
    file: File,
    path: PathBuf,
    recorded: HashSet<usize>,
}

impl Record {
    /// Creates the record of a new staging directory `dir`, naming `identity`, durably.
    pub fn create(dir: &Path, identity: &Identity) -> Result<Record, RestoreError> {
        let path = dir.join(RECORD_NAME);
        let json = serde_json::to_string(identity).map_err(|e| io(&path)(e.into()))?;
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io(&path))?
        };
        file.write_all(line(&json).as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(io(&path))?;
        crate::store::disk::sync_dir(dir)?;
        Ok(Record {
            file,
            path,
            recorded: HashSet::new(),
        })
    }

    /// Reads the record in `dir` and continues it if it names `identity`: what it keeps, or
    /// why the directory cannot be continued.
    /// `keys`: the layout's objects' keys, in order.
    pub fn resume(
        dir: &Path,
        identity: &Identity,
        keys: &[&str],
    ) -> Result<(Record, Kept), String> {
        let path = dir.join(RECORD_NAME);
        let mut file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err("it has no staging record (a restore that did not resume)".into());
            }
            Err(e) => return Err(format!("its staging record cannot be read: {e}")),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| format!("its staging record cannot be read: {e}"))?;
        let (lines, valid) = whole_lines(&bytes);
        let Some(first) = lines.first() else {
            return Err("its staging record names nothing".into());
        };
        let theirs: Identity = serde_json::from_str(first)
            .map_err(|e| format!("its staging record is not one: {e}"))?;
        if theirs != *identity {
            return Err(theirs.differs(identity));
        }
        let mut kept = Kept::none(keys.len());
        for l in &lines[1..] {
            let p: PieceLine = serde_json::from_str(l)
                .map_err(|e| format!("its staging record has a bad line: {e}"))?;
            if keys.get(p.piece) != Some(&p.key.as_str()) {
                return Err(format!(
                    "its staging record names {} as object {}, which this restore does not",
                    p.key, p.piece
                ));
            }
            kept.pieces[p.piece] = true;
        }
        // A torn last line is cut off before anything is appended after it.
        if valid < bytes.len() {
            file.set_len(valid as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("its staging record cannot be cut back: {e}"))?;
        }
        file.seek(std::io::SeekFrom::End(0))
            .map_err(|e| format!("its staging record cannot be appended to: {e}"))?;
        let recorded = (0..keys.len()).filter(|i| kept.pieces[*i]).collect();
        Ok((
            Record {
                file,
                path,
                recorded,
            },
            kept,
        ))
    }

    /// Appends the objects `pieces` (their bytes already fsynced) and fsyncs the record.
    /// Blocking.
    pub fn append(
        &mut self,
        pieces: impl IntoIterator<Item = (usize, String)>,
    ) -> Result<(), RestoreError> {
        let mut out = String::new();
        for (piece, key) in pieces {
            if !self.recorded.insert(piece) {
                continue;
            }
            let json = serde_json::to_string(&PieceLine { piece, key })
                .map_err(|e| io(&self.path)(e.into()))?;
            out.push_str(&line(&json));
        }
        if out.is_empty() {
            return Ok(());
        }
        self.file
            .write_all(out.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(io(&self.path))
    }
}

/// Removes the record from `dir` before it is renamed into place.
pub(crate) fn remove_record(dir: &Path) -> Result<(), RestoreError> {
    let path = dir.join(RECORD_NAME);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_or_damaged_line_ends_the_record() {
        let a = line(r#"{"piece":0,"key":"a"}"#);
        let b = line(r#"{"piece":1,"key":"b"}"#);
        let whole = format!("{a}{b}");
        let (lines, valid) = whole_lines(whole.as_bytes());
        assert_eq!((lines.len(), valid), (2, whole.len()));
        // Torn: no newline on the last line.
        let torn = &whole.as_bytes()[..whole.len() - 1];
        let (lines, valid) = whole_lines(torn);
        assert_eq!((lines.len(), valid), (1, a.len()));
        // Damaged: a flipped byte fails the CRC, and nothing after it counts.
        let mut bad = whole.clone().into_bytes();
        bad[3] ^= 1;
        assert_eq!(whole_lines(&bad).0.len(), 0);
    }
}
