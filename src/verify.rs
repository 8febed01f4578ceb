//! Proving what is in a bucket can be restored: [`verify`] checks every restore point,
//! [`list_restore_points`] lists them (`verify` and `ls`, DESIGN.md section 6).
//!
//! [`verify`] reads only. For every key under `manifests/` it checks:
//! - the manifest parses and is consistent ([`Manifest::decode`]: format, `commit_seq` adding
//!   up to `wal_floor + frames`, the key, contiguous segments, consecutive archives);
//! - every object it names exists with the stated length and CRC, under a key of the stated
//!   generation;
//! - the snapshot decodes (header and payload CRCs) and its id and `commit_seq` are the entry's;
//! - the archives are WAL files with the stated numbers and frame counts whose floors chain
//!   (`wal_floor`, then each floor plus its frames);
//! - the segments rebuild a `wal.bin` whose header is the manifest's `wal_id`/`wal_number` with
//!   the floor the archives end at, and that parses whole with the stated frames. Segments end
//!   at frame boundaries (a durable length always is one, DESIGN.md section 3), so each is
//!   checked on its own: whole frames, seqs continuing the previous segment's;
//! - side file names are plain file names a restore can write;
//! - an encoded (compressed) object decodes, and its plain bytes have the length and CRC the
//!   manifest states; the checks above then read the plain bytes. An encrypted object is
//!   checked for presence, length and CRC of its stored bytes, and its generation must have a
//!   wrapped data key; the restore point is reported `encrypted` with the key ids its
//!   generations are wrapped for. With a key that opens them ([`VerifyOptions::keys`]) every
//!   chunk is authenticated and the plain bytes checked as above (`authenticated`); a key
//!   given that does not open a generation is a problem;
//! - LATEST, if there is one, names an existing manifest that verifies, with its commit_seq and
//!   lineage. A missing LATEST is not a problem: a crash between the first manifest and its
//!   LATEST leaves exactly that.
//!
//! Bad content is reported as problems, never an error or a panic. A [`VerifyError`] means the
//! bucket could not be read (listing, throttling, timeouts): nothing can be said then.
//! An object named by several manifests is downloaded and checked once. Fetches run with at
//! most [`VerifyOptions::parallelism`] in flight, each object's stored bytes held in memory
//! while it is checked. Its plain bytes are held only up to [`PLAIN_IN_MEMORY`]: a larger
//! encoded object is decoded into an unnamed temporary file (`TMPDIR`, gone with its
//! descriptor) and checked from there a chunk at a time ([`large`]), so what an entry claims
//! never sizes memory; an entry claiming more than its stored bytes can decode to
//! (`at_rest::bounds`) is a problem naming it, found before anything is decoded, and so is a
//! segment longer than a writer ships.

mod checks;
use checks::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use futures::StreamExt;
use serde::Serialize;

pub mod immutable;
mod large;
mod points;

pub use points::{RestorePointInfo, list_restore_points, restore_points_text};
use uuid::Uuid;

use crate::at_rest::decode::decode_bytes;
use crate::at_rest::seal::GenerationKey;
use crate::bucket::{Bucket, BucketError, list_all};
use crate::manifest::{
    LATEST_KEY, MANIFESTS_PREFIX, Manifest, ObjectEntry, parse_generation, parse_manifest_key,
};
use crate::restore::keys::{EncryptionCheck, encryption_of};
use crate::restore::side_file_name_problem;
use crate::store::format::{
    FRAME_HEADER_LEN, SnapshotHeader, WalHeader, decode_snapshot, scan_frames, scan_wal,
};

/// Manifests fetched at once by [`list_restore_points`].
const LIST_PARALLELISM: usize = 8;
/// Plain bytes of one object decoded in memory (the longest segment a writer ships, which is
/// parsed in memory); a larger one is decoded into an unnamed temporary file and read back a
/// chunk at a time ([`large`]).
pub const PLAIN_IN_MEMORY: u64 = crate::at_rest::bounds::SEGMENT_MAX;

/// How to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Requests in flight at once.
    pub parallelism: usize,
    /// Keys to open encrypted generations with (none: stored bytes only).
    pub keys: crate::restore::keys::RestoreKeys,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            parallelism: 8,
            keys: Default::default(),
        }
    }
}

/// The bucket could not be read well enough to verify it.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot verify {url}: {source}")]
    Bucket { url: String, source: BucketError },
}

/// One manifest's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestCheck {
    pub key: String,
    /// From the manifest, or from its key when it does not parse.
    pub commit_seq: Option<u64>,
    pub lineage: Option<Uuid>,
    pub generation: Option<u64>,
    pub ok: bool,
    /// Each names the object or field and what is wrong with it.
    pub problems: Vec<String>,
    /// When it names encrypted objects: their key ids, and whether they authenticated.
    pub encrypted: Option<EncryptionCheck>,
}

/// LATEST's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LatestCheck {
    /// The manifest LATEST names, when LATEST parses.
    pub manifest: Option<String>,
    pub commit_seq: Option<u64>,
    pub ok: bool,
    pub problems: Vec<String>,
}

/// Everything [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Every key under `manifests/`, in key order.
    pub manifests: Vec<ManifestCheck>,
    /// `None` when there is no LATEST.
    pub latest: Option<LatestCheck>,
    /// Every manifest and LATEST verify.
    pub ok: bool,
}

fn verdict(f: &mut fmt::Formatter<'_>, ok: bool) -> fmt::Result {
    f.write_str(if ok { "ok  " } else { "FAIL" })
}

impl fmt::Display for ManifestCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        verdict(f, self.ok)?;
        write!(f, "  {}", self.key)?;
        if let Some(c) = self.commit_seq {
            write!(f, "  commit {c}")?;
        }
        if let Some(g) = self.generation {
            write!(f, "  generation {g}")?;
        }
        if let Some(l) = self.lineage {
            write!(f, "  lineage {l}")?;
        }
        if let Some(e) = &self.encrypted {
            write!(f, "  {e}")?;
        }
        if !self.problems.is_empty() {
            write!(f, ": {}", self.problems.join("; "))?;
        }
        Ok(())
    }
}

impl fmt::Display for LatestCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        verdict(f, self.ok)?;
        write!(f, "  {LATEST_KEY}")?;
        if let Some(m) = &self.manifest {
            write!(f, " -> {m}")?;
        }
        if !self.problems.is_empty() {
            write!(f, ": {}", self.problems.join("; "))?;
        }
        Ok(())
    }
}

/// One line per manifest, one for LATEST, and a summary line.
impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for m in &self.manifests {
            writeln!(f, "{m}")?;
        }
        match &self.latest {
            Some(l) => writeln!(f, "{l}")?,
            None => writeln!(f, "      {LATEST_KEY}: none")?,
        }
        let bad = self.manifests.iter().filter(|m| !m.ok).count();
        match (self.manifests.len(), bad, self.ok) {
            (0, _, _) => write!(f, "no restore points yet"),
            (n, 0, true) => write!(f, "all {n} restore points verify"),
            (n, 0, false) => write!(f, "{n} restore points verify; {LATEST_KEY} does not"),
            (n, bad, _) => write!(f, "{bad} of {n} restore points FAIL"),
        }
    }
}

/// How a manifest uses an object, which says how to parse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Snapshot,
    /// A whole WAL file (an archive) or the first segment of one (header, then frames).
    Wal,
    /// A later segment: frames only.
    Frames,
    /// A side file: content not interpreted.
    Opaque,
}

/// A WAL file or its first segment, parsed.
#[derive(Debug, Clone)]
struct WalFacts {
    header: WalHeader,
    frames: u64,
    /// Why the frames stop before the end, at which byte.
    stop: Option<String>,
}

/// A later segment, parsed.
#[derive(Debug, Clone)]
struct FrameFacts {
    /// The seq the first frame header carries (when there are enough bytes for one).
    first_seq: Option<u64>,
    frames: u64,
    stop: Option<String>,
}

/// What one download of an object showed, for every role manifests use it in.
#[derive(Debug, Clone)]
struct Facts {
    len: u64,
    crc: u32,
    /// Length and CRC of the decoded bytes, or why they do not decode; `None` when the object
    /// was read as stored raw (or is encrypted).
    plain: Option<Result<(u64, u32), String>>,
    snapshot: Option<Result<SnapshotHeader, String>>,
    wal: Option<Result<WalFacts, String>>,
    frames: Option<FrameFacts>,
}

#[derive(Debug, Clone)]
enum Fetched {
    Missing,
    /// A permanent error for this key (a key the bucket refuses, access denied).
    Unreadable(String),
    Got(Facts),
}

fn facts_of(
    stored: &[u8],
    roles: &BTreeSet<Role>,
    entry: &ObjectEntry,
    key: Option<GenerationKey>,
) -> Facts {
    let mut facts = Facts {
        len: stored.len() as u64,
        crc: crc32fast::hash(stored),
        plain: None,
        snapshot: None,
        wal: None,
        frames: None,
    };
    if entry.encrypted && key.is_none() {
        return facts;
    }
    let decoded;
    let data = if entry.is_encoded() {
        // Checked against the entry's stored length and CRC too; those problems are reported
        // from `len`/`crc` above, so only a decode failure is kept here.
        let mut probe = entry.clone();
        probe.len = facts.len;
        probe.crc = facts.crc;
        if probe.plain_len() > PLAIN_IN_MEMORY {
            return large::facts(facts, stored, roles, &probe, key.as_ref());
        }
        match decode_bytes(&probe, key.as_ref(), stored) {
            Ok(d) => {
                let (len, crc) = (d.len() as u64, crc32fast::hash(&d));
                let check = key.as_ref().map_or(crc, |k| k.plain_tag(len, crc));
                facts.plain = Some(Ok((len, check)));
                decoded = d;
                &decoded[..]
            }
            Err(e) => {
                facts.plain = Some(Err(e.to_string()));
                return facts;
            }
        }
    } else {
        stored
    };
    for role in roles {
        match role {
            Role::Snapshot => {
                facts.snapshot = Some(
                    decode_snapshot(data)
                        .map(|(h, _)| h)
                        .map_err(|e| e.to_string()),
                );
            }
            Role::Wal => {
                facts.wal = Some(
                    scan_wal(data)
                        .map(|s| WalFacts {
                            header: s.header,
                            frames: s.frames.len() as u64,
                            stop: s.stop.map(|why| format!("{why} at byte {}", s.valid_len)),
                        })
                        .map_err(|e| e.to_string()),
                );
            }
            Role::Frames => {
                let first_seq = (data.len() >= FRAME_HEADER_LEN)
                    .then(|| u64::from_le_bytes(data[8..16].try_into().expect("8 bytes")));
                let scan = scan_frames(data, first_seq.unwrap_or(0));
                facts.frames = Some(FrameFacts {
                    first_seq,
                    frames: scan.frames.len() as u64,
                    stop: scan
                        .stop
                        .map(|why| format!("{why} at byte {}", scan.valid_len)),
                });
            }
            Role::Opaque => {}
        }
    }
    facts
}

/// Downloads `key` and works out its facts (on the blocking pool: CRCs and frame scans).
async fn fetch_facts(
    bucket: &dyn Bucket,
    key: &str,
    (roles, entry): (BTreeSet<Role>, ObjectEntry),
    open: Option<GenerationKey>,
) -> Result<Fetched, VerifyError> {
    match bucket.get(key).await {
        Ok(obj) => {
            let check = move || facts_of(&obj.data, &roles, &entry, open);
            let facts =
                tokio::task::spawn_blocking(check)
                    .await
                    .map_err(|e| VerifyError::Bucket {
                        url: bucket.url(),
                        source: BucketError::Permanent {
                            op: "check",
                            key: key.to_string(),
                            message: format!("check task failed: {e}"),
                        },
                    })?;
            Ok(Fetched::Got(facts))
        }
        Err(BucketError::NotFound { .. }) => Ok(Fetched::Missing),
        Err(e @ BucketError::Permanent { .. }) => Ok(Fetched::Unreadable(e.to_string())),
        Err(source) => Err(VerifyError::Bucket {
            url: bucket.url(),
            source,
        }),
    }
}

fn bucket_err(bucket: &dyn Bucket) -> impl FnOnce(BucketError) -> VerifyError + '_ {
    move |source| VerifyError::Bucket {
        url: bucket.url(),
        source,
    }
}

/// A manifest key's content: parsed, or why not.
type Loaded = (String, Result<Manifest, String>);

/// Every key under `manifests/`, fetched and decoded, in key order.
async fn load_manifests(
    bucket: &dyn Bucket,
    parallelism: usize,
) -> Result<Vec<Loaded>, VerifyError> {
    let mut keys: Vec<String> = list_all(bucket, MANIFESTS_PREFIX)
        .await
        .map_err(bucket_err(bucket))?
        .into_iter()
        .map(|o| o.key)
        .collect();
    keys.sort();
    let loaded: Vec<Result<Loaded, VerifyError>> = futures::stream::iter(keys)
        .map(|key| async move {
            if parse_manifest_key(&key).is_none() {
                return Ok((key, Err("not a manifest key".to_string())));
            }
            let result = match bucket.get(&key).await {
                Ok(obj) => Manifest::decode(&key, &obj.data).map_err(|e| e.to_string()),
                Err(BucketError::NotFound { .. }) => Err("listed, then gone".to_string()),
                Err(e @ BucketError::Permanent { .. }) => Err(e.to_string()),
                Err(e) => return Err(bucket_err(bucket)(e)),
            };
            Ok((key, result))
        })
        .buffered(parallelism.max(1))
        .collect()
        .await;
    loaded.into_iter().collect()
}

/// The roles each object key is used in by `manifests`, with the first entry naming it (how
/// it is encoded; an entry of another manifest that disagrees shows as a problem of that
/// manifest).
fn roles_by_key(manifests: &[Loaded]) -> BTreeMap<String, (BTreeSet<Role>, ObjectEntry)> {
    let mut roles: BTreeMap<String, (BTreeSet<Role>, ObjectEntry)> = BTreeMap::new();
    let mut add = |e: &ObjectEntry, r: Role| {
        roles
            .entry(e.key.clone())
            .or_insert_with(|| (BTreeSet::new(), e.clone()))
            .0
            .insert(r);
    };
    for (_, m) in manifests {
        let Ok(m) = m else { continue };
        if let Some(s) = &m.snapshot {
            add(&s.object, Role::Snapshot);
        }
        for a in &m.archives {
            add(&a.object, Role::Wal);
        }
        for s in &m.segments {
            add(
                &s.object,
                if s.start == 0 {
                    Role::Wal
                } else {
                    Role::Frames
                },
            );
        }
        for s in &m.side_files {
            add(&s.object, Role::Opaque);
        }
    }
    roles
}

/// Checks every restore point in `bucket` (see the module docs).
pub async fn verify(
    bucket: &dyn Bucket,
    opts: &VerifyOptions,
) -> Result<VerifyReport, VerifyError> {
    let parallelism = opts.parallelism.max(1);
    let manifests = load_manifests(bucket, parallelism).await?;
    // A branch manifest's objects are where its parent keeps them: each holder's manifests
    // are checked against the holder (their keys are its own), the rest against this prefix.
    let mut groups: BTreeMap<Option<String>, Vec<Loaded>> = BTreeMap::new();
    for (key, mut m) in manifests {
        let holder = m.as_mut().ok().and_then(Manifest::take_holder);
        groups.entry(holder).or_default().push((key, m));
    }
    let mut checks = Vec::new();
    for (holder, manifests) in groups {
        let source = match holder.as_deref().map(|h| bucket.sibling(h)) {
            None => None,
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                checks.extend(manifests.iter().map(|(key, _)| unreachable_holder(key, &e)));
                continue;
            }
        };
        let reads = source.as_deref().unwrap_or(bucket);
        checks.extend(check_group(reads, &manifests, opts, parallelism).await?);
    }
    checks.sort_by(|a, b| a.key.cmp(&b.key));
    let latest = check_latest(bucket, &checks).await?;
    let ok = checks.iter().all(|c| c.ok) && latest.as_ref().is_none_or(|l| l.ok);
    Ok(VerifyReport {
        manifests: checks,
        latest,
        ok,
    })
}

/// The check of a branch manifest whose holder cannot be reached.
fn unreachable_holder(key: &str, e: &BucketError) -> ManifestCheck {
    ManifestCheck {
        key: key.to_string(),
        commit_seq: parse_manifest_key(key),
        lineage: None,
        generation: None,
        ok: false,
        problems: vec![format!(
            "the prefix holding its objects cannot be read: {e}"
        )],
        encrypted: None,
    }
}

/// Checks `manifests`, whose objects are all under `bucket`.
async fn check_group(
    bucket: &dyn Bucket,
    manifests: &[Loaded],
    opts: &VerifyOptions,
    parallelism: usize,
) -> Result<Vec<ManifestCheck>, VerifyError> {
    let roles = roles_by_key(manifests);
    let keys = opts
        .keys
        .survey(bucket, roles.values().map(|(_, e)| e))
        .await
        .map_err(bucket_err(bucket))?;
    let fetched: Vec<Result<(String, Fetched), VerifyError>> = futures::stream::iter(roles)
        .map(|(key, roles)| {
            let open = keys.get(&roles.1.generation).and_then(|k| k.opened());
            async move { Ok((key.clone(), fetch_facts(bucket, &key, roles, open).await?)) }
        })
        .buffer_unordered(parallelism)
        .collect()
        .await;
    let facts: HashMap<String, Fetched> = fetched.into_iter().collect::<Result<_, _>>()?;

    let checks: Vec<ManifestCheck> = manifests
        .iter()
        .map(|(key, m)| match m {
            Ok(m) => {
                let mut problems = check_manifest(m, &facts);
                let encrypted = encryption_of(m, &keys, &mut problems);
                ManifestCheck {
                    key: key.clone(),
                    commit_seq: Some(m.commit_seq),
                    lineage: Some(m.lineage),
                    generation: Some(m.generation),
                    ok: problems.is_empty(),
                    problems,
                    encrypted,
                }
            }
            Err(why) => ManifestCheck {
                key: key.clone(),
                commit_seq: parse_manifest_key(key),
                lineage: None,
                generation: None,
                ok: false,
                problems: vec![why.clone()],
                encrypted: None,
            },
        })
        .collect();
    Ok(checks)
}
