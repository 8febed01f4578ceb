//! Restore points: the manifest format, the object keys under a prefix, LATEST and the
//! GENERATION claim (DESIGN.md section 4).
//!
//! ```text
//! LATEST                                        mutable, If-Match: names the newest restore point
//! latest/<!seq:020>.json                        write-once prefixes, instead of LATEST: pointer
//!                                               seq, created once (!seq = u64::MAX - seq: newest first)
//! lease                                         mutable: the bucket lease
//! manifests/<commit_seq:020>.json               one restore point; written once
//! gen/<generation:010>/GENERATION               claims the generation number
//! gen/<generation:010>/snapshot.bin             the generation's snapshot
//! gen/<generation:010>/archive/<number:020>.wal archived WAL files
//! gen/<generation:010>/wal/<start:020>-<end:020>.seg  bytes [start, end) of the generation's wal.bin
//! gen/<generation:010>/side/<name>.<crc:08x>    a side file's content
//! ```
//!
//! Invariants: every object a manifest names is immutable and exists before the manifest is
//! written; LATEST is written only after its manifest; a manifest's `commit_seq` is
//! `wal_floor + sum(frames)` of the entries it lists, checked by [`Manifest::decode`], so it
//! is what the restored store reports. An entry may name an object of an earlier generation
//! (a reused archive, segment, snapshot or side file); `lineage` and `generation` of an entry
//! are those of the object's key.
//!
//! Beyond DESIGN.md's fields a manifest carries `wal_id` and `wal_number` (the `wal.bin` its
//! segments rebuild) so that a worker resuming from the bucket can tell whether the store's
//! files are still that generation's, and a snapshot entry carries `snapshot_id` and
//! `commit_seq`, so that `restore --at` can pick a restore point from the manifest alone.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::branch::{
    BranchOrigin, PINS_PREFIX, Pin, Release, parse_pin_key, pin_key, prefix_url_problem,
    release_key,
};

/// The manifest format this code writes and reads.
pub const FORMAT: u32 = 1;
/// The key naming the newest restore point.
pub const LATEST_KEY: &str = "LATEST";
/// The bucket lease's key.
pub const LEASE_KEY: &str = "lease";
/// Where manifests live.
pub const MANIFESTS_PREFIX: &str = "manifests/";
/// Where generations live.
pub const GEN_PREFIX: &str = "gen/";

/// Where a write-once prefix's pointers live (`src/latest.rs`): one object per move of the
/// newest restore point, each created once, the newest listed first.
pub const POINTERS_PREFIX: &str = "latest/";

/// The key of pointer number `seq` (from 1). The number is written as `u64::MAX - seq`, so
/// that newer pointers sort first; it alone makes the key, so that two writers creating the
/// same number collide (`If-None-Match`). The object holds a [`Latest`].
pub fn pointer_key(seq: u64) -> String {
    format!("{POINTERS_PREFIX}{:020}.json", u64::MAX - seq)
}

/// The sequence number of a key of [`pointer_key`]'s exact form.
pub fn parse_pointer_key(key: &str) -> Option<u64> {
    let n = key.strip_prefix(POINTERS_PREFIX)?.strip_suffix(".json")?;
    let seq = u64::MAX - parse_digits(n, 20)?;
    (seq > 0).then_some(seq)
}

pub fn manifest_key(commit_seq: u64) -> String {
    format!("{MANIFESTS_PREFIX}{commit_seq:020}.json")
}

/// The commit count a manifest key names, if it is one: exactly [`manifest_key`]'s form, so
/// one number has one key (a `+` sign or other non-digit is not a manifest key).
pub fn parse_manifest_key(key: &str) -> Option<u64> {
    let n = key.strip_prefix(MANIFESTS_PREFIX)?.strip_suffix(".json")?;
    parse_digits(n, 20)
}

/// `digits` as a number, when it is exactly `width` ASCII digits (`str::parse` alone would
/// also take a leading `+`, so two keys could name one number).
fn parse_digits(digits: &str, width: usize) -> Option<u64> {
    (digits.len() == width && digits.bytes().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

pub fn generation_prefix(generation: u64) -> String {
    format!("{GEN_PREFIX}{generation:010}/")
}

pub fn generation_key(generation: u64) -> String {
    format!("{}GENERATION", generation_prefix(generation))
}

pub fn snapshot_key(generation: u64) -> String {
    format!("{}snapshot.bin", generation_prefix(generation))
}

pub fn archive_key(generation: u64, number: u64) -> String {
    format!("{}archive/{number:020}.wal", generation_prefix(generation))
}

pub fn segments_prefix(generation: u64) -> String {
    format!("{}wal/", generation_prefix(generation))
}

pub fn segment_key(generation: u64, start: u64, end: u64) -> String {
    format!("{}{start:020}-{end:020}.seg", segments_prefix(generation))
}

pub fn side_key(generation: u64, name: &str, crc: u32) -> String {
    format!("{}side/{name}.{crc:08x}", generation_prefix(generation))
}

/// The generation number of any key under `gen/`.
pub fn parse_generation(key: &str) -> Option<u64> {
    let rest = key.strip_prefix(GEN_PREFIX)?;
    let (n, _) = rest.split_once('/')?;
    parse_digits(n, 10)
}

/// `(start, end)` of a segment key of `generation`.
pub fn parse_segment_key(generation: u64, key: &str) -> Option<(u64, u64)> {
    let rest = key
        .strip_prefix(&segments_prefix(generation))?
        .strip_suffix(".seg")?;
    let (a, b) = rest.split_once('-')?;
    let (start, end) = (parse_digits(a, 20)?, parse_digits(b, 20)?);
    (start < end).then_some((start, end))
}

/// How an object's stored bytes encode its plain bytes (`src/at_rest/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// Stored as they are: the stored bytes are the plain bytes.
    #[default]
    None,
    /// One zstd stream.
    Zstd,
}

impl Codec {
    pub fn is_none(&self) -> bool {
        *self == Codec::None
    }

    pub fn name(&self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Zstd => "zstd",
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One object a manifest names.
///
/// `len` and `crc` are those of the *stored* bytes, what the bucket holds (so `verify` needs
/// no key to check presence, length and CRC). An object stored as its plain bytes (codec
/// `none`, not encrypted) has no `plain_len`/`plain_crc`, and its JSON is exactly what
/// manifests held before codecs existed; an encoded one records both, the length and CRC-32
/// of the bytes a restore writes. An `encrypted` object (`src/at_rest/seal.rs`) records in
/// `plain_crc` a keyed tag of its plain length and CRC (nothing a reader without the key can
/// check a guess against); without its generation's key it is refused, never written out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObjectEntry {
    pub key: String,
    pub len: u64,
    pub crc: u32,
    pub lineage: Uuid,
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Codec::is_none")]
    pub codec: Codec,
    #[serde(default, skip_serializing_if = "is_false")]
    pub encrypted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_len: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_crc: Option<u32>,
    /// The prefix holding the object when it is not the manifest's own: a branch manifest
    /// ([`Manifest::branch`]) names its parent's objects where they are, as the parent
    /// prefix's URL without a query (`s3://bucket/prefix`, `file:///path`). Absent (and not
    /// written) for an object under the manifest's own prefix; only a branch manifest may
    /// name another prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

impl Manifest {
    /// Whether any object it names is encrypted.
    pub fn encrypted(&self) -> bool {
        self.snapshot.iter().any(|s| s.object.encrypted)
            || self.archives.iter().any(|a| a.object.encrypted)
            || self.segments.iter().any(|s| s.object.encrypted)
            || self.side_files.iter().any(|s| s.object.encrypted)
    }
}

impl ObjectEntry {
    /// An object stored as its plain bytes.
    pub fn raw(key: String, len: u64, crc: u32, lineage: Uuid, generation: u64) -> ObjectEntry {
        ObjectEntry {
            key,
            len,
            crc,
            lineage,
            generation,
            ..ObjectEntry::default()
        }
    }

    /// Whether the stored bytes differ from the plain bytes (compressed or encrypted).
    pub fn is_encoded(&self) -> bool {
        !self.codec.is_none() || self.encrypted
    }

    /// Bytes of the plain content: what a restore writes.
    pub fn plain_len(&self) -> u64 {
        self.plain_len.unwrap_or(self.len)
    }

    /// CRC-32 of the plain content.
    pub fn plain_crc(&self) -> u32 {
        self.plain_crc.unwrap_or(self.crc)
    }

    /// Why the entry's encoding fields do not fit together, if they do not: an encoded object
    /// states its plain length and CRC, a raw one neither.
    fn encoding_problem(&self) -> Option<String> {
        match (self.is_encoded(), self.plain_len, self.plain_crc) {
            (true, Some(_), Some(_)) | (false, None, None) => None,
            (true, _, _) => Some(format!(
                "{}: encoded ({}{}) without its plain length and CRC",
                self.key,
                self.codec.name(),
                if self.encrypted { ", encrypted" } else { "" }
            )),
            (false, _, _) => Some(format!(
                "{}: stored raw but states a plain length or CRC",
                self.key
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    #[serde(flatten)]
    pub object: ObjectEntry,
    pub snapshot_id: Uuid,
    pub commit_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveEntry {
    #[serde(flatten)]
    pub object: ObjectEntry,
    pub number: u64,
    pub frames: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentEntry {
    #[serde(flatten)]
    pub object: ObjectEntry,
    pub start: u64,
    pub end: u64,
    pub frames: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideFileEntry {
    #[serde(flatten)]
    pub object: ObjectEntry,
    pub name: String,
}

/// The restore point a manifest's lineage was adopted from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub lineage: Uuid,
    pub manifest: String,
}

/// One restore point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub lineage: Uuid,
    pub generation: u64,
    pub commit_seq: u64,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub wal_floor: u64,
    pub wal_id: Uuid,
    pub wal_number: u64,
    pub snapshot: Option<SnapshotEntry>,
    pub archives: Vec<ArchiveEntry>,
    pub segments: Vec<SegmentEntry>,
    pub side_files: Vec<SideFileEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentRef>,
    /// Set on a branch manifest only (the first restore point of a branch prefix): its
    /// objects are the parent's, named where they are ([`ObjectEntry::prefix`]), its
    /// `generation` is 0 (no generation of its own prefix: nothing extends it), and its WAL
    /// may run past `commit_seq`: a restore cuts it right after frame `commit_seq`
    /// ([`Manifest::cut`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<BranchOrigin>,
    /// Set on every later manifest of a branch prefix (a store adopted from the branch backing
    /// up into it): the branch manifest's [`Manifest::branch`], carried forward from the
    /// manifest each lineage continues, so the prefix names where it came from for as long as
    /// any of its restore points is kept (health names the parent and the fork commit). Not
    /// on a branch manifest itself, nor on any manifest of a prefix that is no branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branched_from: Option<BranchOrigin>,
}

/// Bytes that are not a valid manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("{key}: not a manifest: {detail}")]
    Parse { key: String, detail: String },
    #[error("{key}: format {found}, this build reads format {FORMAT}")]
    Format { key: String, found: u32 },
    #[error("{key}: {detail}")]
    Inconsistent { key: String, detail: String },
}

impl Manifest {
    /// `wal_floor + sum(frames of archives and segments)`: what a restore reports.
    pub fn computed_commit_seq(&self) -> Option<u64> {
        self.archives
            .iter()
            .map(|a| a.frames)
            .chain(self.segments.iter().map(|s| s.frames))
            .try_fold(self.wal_floor, |acc, f| acc.checked_add(f))
    }

    /// Where a restore of this manifest cuts its WAL: right after frame `commit_seq` when its
    /// frames run past it (a branch manifest, cut inside the parent's WAL), `None` otherwise.
    pub fn cut(&self) -> Option<u64> {
        self.computed_commit_seq()
            .is_some_and(|n| n > self.commit_seq)
            .then_some(self.commit_seq)
    }

    /// The key this manifest is stored under.
    pub fn key(&self) -> String {
        manifest_key(self.commit_seq)
    }

    /// Every object the manifest names.
    pub fn objects(&self) -> impl Iterator<Item = &ObjectEntry> {
        self.snapshot
            .iter()
            .map(|s| &s.object)
            .chain(self.archives.iter().map(|a| &a.object))
            .chain(self.segments.iter().map(|s| &s.object))
            .chain(self.side_files.iter().map(|s| &s.object))
    }

    /// Every object the manifest names, to change (a branch names them where they are).
    pub fn objects_mut(&mut self) -> impl Iterator<Item = &mut ObjectEntry> {
        self.snapshot
            .iter_mut()
            .map(|s| &mut s.object)
            .chain(self.archives.iter_mut().map(|a| &mut a.object))
            .chain(self.segments.iter_mut().map(|s| &mut s.object))
            .chain(self.side_files.iter_mut().map(|s| &mut s.object))
    }

    /// Bytes of every object the manifest names; `None` on overflow, which [`Manifest::check`]
    /// refuses, so it is `Some` for every decoded manifest.
    pub fn total_len(&self) -> Option<u64> {
        self.objects()
            .try_fold(0u64, |acc, o| acc.checked_add(o.len))
    }

    /// Plain bytes of every object the manifest names (what a restore writes); `None` on
    /// overflow, which [`Manifest::check`] refuses.
    pub fn total_plain_len(&self) -> Option<u64> {
        self.objects()
            .try_fold(0u64, |acc, o| acc.checked_add(o.plain_len()))
    }

    /// The end offset of the last segment (0 when none): where the next segment starts.
    pub fn segments_end(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.end)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest serializes");
        v.push(b'\n');
        v
    }

    /// Parses and checks a manifest stored under `key`: the format, that `commit_seq` adds up,
    /// that it matches the key, and that archives and segments are contiguous.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse {
            key: key.to_string(),
            detail: e.to_string(),
        })?;
        if m.format != FORMAT {
            return Err(ManifestError::Format {
                key: key.to_string(),
                found: m.format,
            });
        }
        m.check(key)?;
        Ok(m)
    }

    /// The structural checks of [`Manifest::decode`], on a manifest in memory.
    pub fn check(&self, key: &str) -> Result<(), ManifestError> {
        let bad = |detail: String| ManifestError::Inconsistent {
            key: key.to_string(),
            detail,
        };
        match (self.computed_commit_seq(), &self.branch) {
            (Some(n), None) if n == self.commit_seq => {}
            // A branch cut inside its parent's WAL: the frames run at or past the fork.
            (Some(n), Some(b)) if n >= self.commit_seq && b.commit_seq == self.commit_seq => {}
            (Some(_), Some(b)) if b.commit_seq != self.commit_seq => {
                return Err(bad(format!(
                    "commit_seq {} but the branch record says {}",
                    self.commit_seq, b.commit_seq
                )));
            }
            (Some(n), _) => {
                return Err(bad(format!(
                    "commit_seq {} but floor and frames add up to {n}",
                    self.commit_seq
                )));
            }
            (None, _) => return Err(bad("frame counts overflow".into())),
        }
        if let Some(problem) = self.prefix_problem() {
            return Err(bad(problem));
        }
        if parse_manifest_key(key).is_some_and(|n| n != self.commit_seq) {
            return Err(bad(format!(
                "key names a different commit_seq than {}",
                self.commit_seq
            )));
        }
        if let Some(s) = &self.snapshot {
            if self.wal_floor > s.commit_seq {
                return Err(bad(format!(
                    "wal_floor {} above the snapshot's commit_seq {}",
                    self.wal_floor, s.commit_seq
                )));
            }
            if s.commit_seq > self.commit_seq {
                return Err(bad("snapshot holds more commits than the manifest".into()));
            }
        } else if self.wal_floor != 0 {
            return Err(bad(format!(
                "wal_floor {} with no snapshot",
                self.wal_floor
            )));
        }
        for w in self.archives.windows(2) {
            if Some(w[1].number) != w[0].number.checked_add(1) {
                return Err(bad(format!(
                    "archives {} and {} are not consecutive",
                    w[0].number, w[1].number
                )));
            }
        }
        if let Some(last) = self.archives.last()
            && last.number.checked_add(1) != Some(self.wal_number)
        {
            return Err(bad(format!(
                "last archive {} does not precede wal.bin number {}",
                last.number, self.wal_number
            )));
        }
        let mut end = 0;
        for s in &self.segments {
            if s.start != end || s.end <= s.start || s.object.plain_len() != s.end - s.start {
                return Err(bad(format!(
                    "segment {} is not contiguous ({}..{} after {end})",
                    s.object.key, s.start, s.end
                )));
            }
            end = s.end;
        }
        if self.segments.is_empty() {
            return Err(bad(
                "no WAL segment (a restore point always holds wal.bin's header)".into(),
            ));
        }
        if let Some(problem) = self.objects().find_map(ObjectEntry::encoding_problem) {
            return Err(bad(problem));
        }
        if self.total_len().is_none() || self.total_plain_len().is_none() {
            return Err(bad("object lengths add up to more than 2^64 bytes".into()));
        }
        Ok(())
    }
}

impl Manifest {
    /// Why the prefixes the manifest names do not fit, if they do not: only a branch manifest
    /// names objects under other prefixes, all under one, a URL without query, `..` or control
    /// characters ([`prefix_url_problem`]).
    pub(crate) fn prefix_problem(&self) -> Option<String> {
        if let Some(f) = &self.branched_from {
            if self.branch.is_some() {
                return Some(
                    "a branch manifest carries no branched_from (its branch says it)".into(),
                );
            }
            if let Some(why) = prefix_url_problem(&f.prefix) {
                return Some(format!("branched_from prefix {:?}: {why}", f.prefix));
            }
        }
        let Some(b) = &self.branch else {
            return self
                .objects()
                .find(|o| o.prefix.is_some())
                .map(|o| format!("{}: names another prefix, but this is no branch", o.key));
        };
        if self.generation != 0 {
            return Some(format!(
                "a branch manifest belongs to no generation, but names generation {}",
                self.generation
            ));
        }
        if self.parent.is_some() {
            return Some("a branch manifest names no adopted parent".into());
        }
        let prefixes = std::iter::once(b.prefix.as_str())
            .chain(self.objects().filter_map(|o| o.prefix.as_deref()));
        for p in prefixes {
            if let Some(why) = prefix_url_problem(p) {
                return Some(format!("prefix {p:?}: {why}"));
            }
        }
        if let Some(o) = self.objects().find(|o| o.prefix.is_none()) {
            return Some(format!(
                "{}: a branch manifest names its parents' objects only",
                o.key
            ));
        }
        // One holder: a branch is cut from one restore point, whose objects are all under one
        // prefix (its own, or for a branch of a branch, the one that holds its parent's).
        let holder = self.holder();
        self.objects()
            .find(|o| o.prefix.as_deref() != holder)
            .map(|o| {
                format!(
                    "{}: a branch manifest names the objects of one prefix",
                    o.key
                )
            })
    }

    /// The prefix holding every object of a branch manifest (`None` for any other manifest,
    /// whose objects are under its own prefix).
    pub fn holder(&self) -> Option<&str> {
        self.branch.as_ref()?;
        self.objects().next().and_then(|o| o.prefix.as_deref())
    }

    /// The commit count at the end of segment `key`, when this manifest names it (counted back
    /// from `commit_seq` over its segments' frames; `None` too for counts that do not add up).
    pub fn commit_at_segment_end(&self, key: &str) -> Option<u64> {
        let frames = self
            .segments
            .iter()
            .try_fold(0u64, |sum, s| sum.checked_add(s.frames))?;
        let mut seq = self.commit_seq.checked_sub(frames)?;
        for s in &self.segments {
            seq += s.frames;
            if s.object.key == key {
                return Some(seq);
            }
        }
        None
    }

    /// Where the prefix holding this manifest was branched from, if it is a branch: the
    /// branch manifest's own record, or the one later manifests carry.
    pub fn origin(&self) -> Option<&BranchOrigin> {
        self.branch.as_ref().or(self.branched_from.as_ref())
    }

    /// [`Manifest::holder`], taken: every entry's prefix is cleared, so its keys are the
    /// holder's own (what a reader of the holder's bucket asks for).
    pub fn take_holder(&mut self) -> Option<String> {
        let holder = self.holder()?.to_string();
        self.objects_mut().for_each(|o| o.prefix = None);
        Some(holder)
    }
}

/// What LATEST holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latest {
    pub manifest: String,
    pub commit_seq: u64,
    pub lineage: Uuid,
    /// Set by a promotion (`mushroom-backup promote`) that adopted the restore point LATEST
    /// names: the lineage that writes the prefix from now on. The restore point is still the
    /// parent's (`manifest`, `commit_seq`, `lineage` describe it, and a reader restores it),
    /// but the writer of `lineage` is refused (`worker::lineage`), and so is any other
    /// adopter. Absent (and not written) otherwise; older readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_by: Option<Uuid>,
    /// With [`Latest::adopted_by`]: how far the adopter holds the parent's history (it may
    /// hold segments past the restore point, which a restore reads as trailing segments). A
    /// restore of this LATEST stops there, so what the old writer may still ship into the
    /// generation after the promotion (a write delayed in the network, a writer that has not
    /// noticed yet) is never restored: the prefix's history is the adopter's. Absent on
    /// LATESTs written before it existed (a restore then reads every trailing segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_at: Option<AdoptedAt>,
}

/// Where an adopter's copy of its parent's history ends ([`Latest::adopted_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptedAt {
    /// The generation whose WAL the adopter holds (the restore point's).
    pub generation: u64,
    /// Bytes of that generation's `wal.bin` the adopter holds (a segment boundary).
    pub wal_end: u64,
    /// Commits the adopter holds.
    pub commit_seq: u64,
}

impl Latest {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("LATEST serializes");
        v.push(b'\n');
        v
    }

    pub fn decode(bytes: &[u8]) -> Result<Latest, ManifestError> {
        serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse {
            key: LATEST_KEY.to_string(),
            detail: e.to_string(),
        })
    }
}

/// What a GENERATION object holds: who claimed the number, for which files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationClaim {
    pub lineage: Uuid,
    pub generation: u64,
    pub snapshot_id: Option<Uuid>,
    pub wal_id: Uuid,
    pub wal_number: u64,
    /// RFC 3339, UTC: retention deletes a claim left by a crashed run only after a grace period.
    pub created_at: String,
}

impl GenerationClaim {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("claim serializes");
        v.push(b'\n');
        v
    }

    pub fn decode(key: &str, bytes: &[u8]) -> Result<GenerationClaim, ManifestError> {
        serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse {
            key: key.to_string(),
            detail: e.to_string(),
        })
    }
}

/// Now, as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formats")
}

/// Milliseconds since the epoch of an RFC 3339 time, if it parses.
pub fn parse_time_ms(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
