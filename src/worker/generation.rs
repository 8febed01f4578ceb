//! Starting a generation: claim its number, then upload the snapshot, the archives the restore
//! point needs and the side files, reusing what the prefix already holds.
//!
//! A generation starts whenever the snapshot or the WAL file on disk changes. Its GENERATION
//! object is written with `If-None-Match: *` before anything else of it, so two writers cannot
//! both own one number. The local files are read (and the archive chain checked) before the
//! claim, bracketed by two looks ([`super::local`]). After the claim, the new objects go up
//! [`GENERATION_UPLOADS_IN_FLIGHT`] at a time, in no particular order among themselves: none of
//! them is named by anything until the manifest, which is written only after this step has
//! seen every one of them succeed. A crash (or a failed upload, which drops the others in
//! flight) after the claim leaves a claimed generation with some objects and no manifest, which
//! retention removes after its grace period.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use uuid::Uuid;

use super::ctx::Ctx;
use super::local::{LocalArchive, LocalGeneration, LocalSnapshot, Reading, read_side_files};
use super::view::{Generation, View};
use super::{DeferReason, StepOutcome, WorkerError};
use crate::at_rest::encode::Plain;
use crate::at_rest::seal::GenerationKey;
use crate::bucket::Body;
use crate::health::{StepActivity, StepPhase};
use crate::manifest::{
    self, ArchiveEntry, GenerationClaim, ObjectEntry, SideFileEntry, SnapshotEntry,
};
use crate::store::disk::DiskState;
use crate::store::format::WalPosition;

/// New objects of one generation (snapshot, archives, side files) uploaded at once. Each is
/// one request (or, above the S3 multipart threshold, one multipart upload with its own parts
/// in flight); a few at once keep the link busy while one waits for the store to take its
/// bytes. `benches/throughput.rs` copies this shape into its baselines.
pub const GENERATION_UPLOADS_IN_FLIGHT: usize = 4;

/// The entry of a new object before its upload: the plain bytes', replaced by what the
/// upload stored ([`patch`]).
fn entry(key: String, len: u64, crc: u32, lineage: Uuid, generation: u64) -> ObjectEntry {
    ObjectEntry::raw(key, len, crc, lineage, generation)
}

/// Replaces `e` by the uploaded entry of its key, if it was uploaded now.
fn patch(e: &mut ObjectEntry, uploaded: &HashMap<String, ObjectEntry>) {
    if let Some(u) = uploaded.get(&e.key) {
        *e = u.clone();
    }
}

/// The uploads of one generation in flight, shown in health as the oldest of them (the one a
/// hung upload keeps shown). The phase is written when an upload starts with none shown, and
/// when the shown one finishes: at most once per object.
struct InFlight<'a> {
    activity: &'a StepActivity,
    generation: u64,
    of: u64,
    /// What is in flight, by position in the upload order, and how many are up.
    state: Mutex<(BTreeMap<usize, String>, u64)>,
}

impl InFlight<'_> {
    fn started(&self, i: usize, what: String) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let first = state.0.is_empty();
        state.0.insert(i, what);
        if first {
            self.show(&state);
        }
    }

    fn finished(&self, i: usize) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let shown = state.0.first_key_value().is_some_and(|(k, _)| *k == i);
        state.0.remove(&i);
        state.1 += 1;
        if shown {
            self.show(&state);
        }
    }

    fn show(&self, state: &(BTreeMap<usize, String>, u64)) {
        if let Some((_, what)) = state.0.first_key_value() {
            self.activity.set(StepPhase::Uploading {
                generation: self.generation,
                what: what.clone(),
                done: state.1,
                of: self.of,
            });
        }
    }
}

/// Claims generation `max + 1` for the files on disk and uploads what it needs. `read_ahead` is
/// a reading a resume started, used when it read these files.
#[tracing::instrument(name = "backup.generation", skip_all, fields(generation = tracing::field::Empty))]
pub(super) async fn start(
    cx: &Ctx<'_>,
    view: &mut View,
    read_ahead: Option<Reading>,
    disk: &DiskState,
    pos: &WalPosition,
) -> Result<StepOutcome, WorkerError> {
    let Some((local, side)) = read_files(cx, read_ahead, disk).await? else {
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
    };
    let lineage = view.lineage;
    let number = view.max_generation + 1;
    tracing::Span::current().record("generation", number);
    let seal = claim(cx, view, number, disk, pos).await?;
    let mut uploader = cx.uploader.clone();
    uploader.encoding.seal = seal.clone();

    let known = Known::of(view);
    // Sealed entries compare by their keyed tag: the keys of their generations, if this
    // worker can open them.
    super::keys::open_keys_of(cx, view, known.objects()).await?;

    // Entries are decided first (reuse, or a new object of this generation); the new objects
    // then go up together, `GENERATION_UPLOADS_IN_FLIGHT` at a time, all after the claim and
    // all before this returns (so before any manifest can name them).
    let mut plan = Plan {
        keys: &view.keys,
        seal: seal.as_ref(),
        lineage,
        number,
        reused: 0,
        uploads: Vec::new(),
    };
    let mut entries = Entries {
        snapshot: local
            .snapshot
            .as_ref()
            .map(|s| plan.snapshot(&known.snapshot, s)),
        archives: plan.archives(&known.archives, &local.archives),
        side_files: plan.side_files(&known.side, &side),
    };
    let Plan {
        reused, uploads, ..
    } = plan;
    let uploaded = uploads.len() as u64;
    let uploaded_entries = upload_all(cx, &uploader, uploads, lineage, number).await?;
    let bytes: u64 = uploaded_entries.values().map(|e| e.len).sum();
    let logical: u64 = uploaded_entries.values().map(|e| e.plain_len()).sum();
    entries.patch(&uploaded_entries);

    view.current = Some(entries.into_generation(view, number, disk, pos, &local, seal));
    tracing::info!(
        generation = number,
        uploaded,
        reused,
        "started a generation"
    );
    Ok(StepOutcome::NewGeneration {
        generation: number,
        uploaded,
        reused,
        bytes,
        logical,
    })
}

/// Reads the local files and the side files, then looks at the disk again: `None` when the
/// snapshot or the WAL file changed meanwhile (the step is deferred, nothing was claimed).
async fn read_files(
    cx: &Ctx<'_>,
    read_ahead: Option<Reading>,
    disk: &DiskState,
) -> Result<Option<(LocalGeneration, SideFiles)>, WorkerError> {
    cx.activity.set(StepPhase::ReadingFiles);
    let reading = read_ahead
        .filter(|r| r.serves(disk))
        .unwrap_or_else(|| Reading::start(cx.store, disk));
    let Some(local) = reading.finish().await? else {
        return Ok(None);
    };
    let store = cx.store.clone();
    let side = tokio::task::spawn_blocking(move || read_side_files(&store))
        .await
        .map_err(|e| WorkerError::Store {
            dir: cx.dir.clone(),
            detail: e.to_string(),
        })??;
    let after = DiskState::look_async(cx.store).await?;
    if !disk.unchanged_until(&after) {
        return Ok(None);
    }
    Ok(Some((local, side)))
}

/// Writes the GENERATION object of `number` (`If-None-Match: *`), records the claim in the
/// view, then the generation's key wrappers, before any data object of it (see
/// `super::keys`). Returns the key its new objects are sealed with, if encrypted.
async fn claim(
    cx: &Ctx<'_>,
    view: &mut View,
    number: u64,
    disk: &DiskState,
    pos: &WalPosition,
) -> Result<Option<GenerationKey>, WorkerError> {
    let claim = GenerationClaim {
        lineage: view.lineage,
        generation: number,
        snapshot_id: pos.snapshot_id,
        wal_id: pos.wal_id,
        wal_number: disk.wal.header.number,
        created_at: manifest::now_rfc3339(),
    };
    cx.activity.set(StepPhase::Claiming { generation: number });
    cx.uploader
        .put(
            &manifest::generation_key(number),
            Body::from(claim.encode()),
        )
        .await?;
    view.max_generation = number;
    view.claims.insert(number, Some(claim));
    super::keys::new_generation_key(cx, view, number).await
}

/// The side files read from the store: name, bytes, CRC.
type SideFiles = Vec<(String, Bytes, u32)>;

/// One new object to upload: its key, its plain bytes, and what health calls it.
type Upload = (String, Plain, String);

/// What this lineage already holds, newest first: the generation being replaced, then the
/// newest manifest.
struct Known {
    snapshot: Vec<SnapshotEntry>,
    archives: Vec<ArchiveEntry>,
    side: Vec<SideFileEntry>,
}

impl Known {
    /// Collects the entries of the view's current generation and newest own manifest.
    fn of(view: &View) -> Known {
        Known {
            snapshot: view
                .current
                .iter()
                .filter_map(|g| g.snapshot.clone())
                .chain(view.newest_own.iter().filter_map(|m| m.snapshot.clone()))
                .collect(),
            archives: view
                .current
                .iter()
                .flat_map(|g| g.archives.clone())
                .chain(view.newest_own.iter().flat_map(|m| m.archives.clone()))
                .collect(),
            side: view
                .current
                .iter()
                .flat_map(|g| g.side_files.clone())
                .chain(view.newest_own.iter().flat_map(|m| m.side_files.clone()))
                .collect(),
        }
    }

    /// Every object these entries name.
    fn objects(&self) -> impl Iterator<Item = &ObjectEntry> {
        self.snapshot
            .iter()
            .map(|k| &k.object)
            .chain(self.archives.iter().map(|k| &k.object))
            .chain(self.side.iter().map(|k| &k.object))
    }
}

/// Deciding, file by file, whether a known object is reused or a new one is uploaded; counts
/// the reuses and collects the uploads.
struct Plan<'a> {
    /// The opened keys of the lineage's generations, to compare sealed entries by tag.
    keys: &'a HashMap<u64, Option<GenerationKey>>,
    /// The new generation's key, when it is encrypted.
    seal: Option<&'a GenerationKey>,
    lineage: Uuid,
    number: u64,
    reused: u64,
    uploads: Vec<Upload>,
}

impl Plan<'_> {
    /// Whether a known entry holds these plain bytes. An entry of the other kind is never
    /// reused (a plaintext object named by an encrypted generation, or the reverse).
    fn matches(&self, e: &ObjectEntry, len: u64, crc: u32) -> bool {
        e.encrypted == self.seal.is_some()
            && crate::at_rest::seal::plain_matches(
                e,
                len,
                crc,
                self.keys.get(&e.generation).and_then(|k| k.as_ref()),
            )
    }

    /// The entry of a new object of this generation, queued for upload.
    fn upload(
        &mut self,
        key: String,
        body: Plain,
        what: String,
        len: u64,
        crc: u32,
    ) -> ObjectEntry {
        let e = entry(key.clone(), len, crc, self.lineage, self.number);
        self.uploads.push((key, body, what));
        e
    }

    /// A known entry, counted as reused.
    fn reuse<T: Clone>(&mut self, k: &T) -> T {
        self.reused += 1;
        k.clone()
    }

    /// The snapshot's entry: a known one with its id and bytes, or a new upload.
    fn snapshot(&mut self, known: &[SnapshotEntry], s: &LocalSnapshot) -> SnapshotEntry {
        let reuse = known.iter().find(|k| {
            k.snapshot_id == s.header.snapshot_id && self.matches(&k.object, s.len, s.crc)
        });
        if let Some(k) = reuse {
            return self.reuse(k);
        }
        let body = Plain::File {
            file: s.file.clone(),
            offset: 0,
            len: s.len,
            crc: s.crc,
        };
        let key = manifest::snapshot_key(self.number);
        SnapshotEntry {
            object: self.upload(key, body, "the snapshot".into(), s.len, s.crc),
            snapshot_id: s.header.snapshot_id,
            commit_seq: s.header.commit_seq,
        }
    }

    /// The archives' entries, in order: each a known one of its number and bytes, or a new
    /// upload.
    fn archives(&mut self, known: &[ArchiveEntry], local: &[LocalArchive]) -> Vec<ArchiveEntry> {
        let of_archives = local.len();
        let mut archives = Vec::new();
        for (i, a) in local.iter().enumerate() {
            let reuse = known
                .iter()
                .find(|k| k.number == a.number && self.matches(&k.object, a.len, a.crc));
            if let Some(k) = reuse {
                archives.push(self.reuse(k));
                continue;
            }
            let body = Plain::File {
                file: a.file.clone(),
                offset: 0,
                len: a.len,
                crc: a.crc,
            };
            let key = manifest::archive_key(self.number, a.number);
            let what = format!("archive {} of {of_archives}", i + 1);
            archives.push(ArchiveEntry {
                object: self.upload(key, body, what, a.len, a.crc),
                number: a.number,
                frames: a.frames,
            });
        }
        archives
    }

    /// The side files' entries: each a known one of its name and bytes, or a new upload whose
    /// key names the CRC (sealed, the keyed tag instead).
    fn side_files(&mut self, known: &[SideFileEntry], side: &SideFiles) -> Vec<SideFileEntry> {
        let mut side_files = Vec::new();
        for (name, data, crc) in side {
            let len = data.len() as u64;
            let reuse = known
                .iter()
                .find(|k| &k.name == name && self.matches(&k.object, len, *crc));
            if let Some(k) = reuse {
                side_files.push(self.reuse(k));
                continue;
            }
            let named = self.seal.map_or(*crc, |k| k.plain_tag(len, *crc));
            let key = manifest::side_key(self.number, name, named);
            let body = Plain::Bytes(data.clone());
            side_files.push(SideFileEntry {
                object: self.upload(key, body, format!("side file {name}"), len, *crc),
                name: name.clone(),
            });
        }
        side_files
    }
}

/// Uploads the new objects, `GENERATION_UPLOADS_IN_FLIGHT` at a time, showing the oldest in
/// flight in health. Returns what each upload stored, by key; the first failure drops the
/// others in flight.
async fn upload_all(
    cx: &Ctx<'_>,
    uploader: &super::upload::Uploader,
    uploads: Vec<Upload>,
    lineage: Uuid,
    number: u64,
) -> Result<HashMap<String, ObjectEntry>, WorkerError> {
    let in_flight = InFlight {
        activity: cx.activity,
        generation: number,
        of: uploads.len() as u64,
        state: Mutex::default(),
    };
    let in_flight = &in_flight;
    futures::stream::iter(uploads.into_iter().enumerate())
        .map(|(i, (key, body, what))| {
            let uploader = uploader.clone();
            async move {
                in_flight.started(i, what);
                let created = uploader.put_encoded(&key, body, lineage, number).await;
                in_flight.finished(i);
                created.map(|e| (key, e))
            }
        })
        .buffer_unordered(GENERATION_UPLOADS_IN_FLIGHT)
        .try_collect::<HashMap<_, _>>()
        .await
}

/// The entries a new generation names, reused or new.
struct Entries {
    snapshot: Option<SnapshotEntry>,
    archives: Vec<ArchiveEntry>,
    side_files: Vec<SideFileEntry>,
}

impl Entries {
    /// Replaces each new entry by what its upload stored.
    fn patch(&mut self, uploaded: &HashMap<String, ObjectEntry>) {
        if let Some(s) = &mut self.snapshot {
            patch(&mut s.object, uploaded);
        }
        for a in &mut self.archives {
            patch(&mut a.object, uploaded);
        }
        for s in &mut self.side_files {
            patch(&mut s.object, uploaded);
        }
    }

    /// The view's new current generation. With the same wal.bin as the generation being
    /// replaced (a snapshot that kept its WAL), its shipped segments stay valid, and the
    /// manifest names them.
    fn into_generation(
        self,
        view: &View,
        number: u64,
        disk: &DiskState,
        pos: &WalPosition,
        local: &LocalGeneration,
        seal: Option<GenerationKey>,
    ) -> Generation {
        let (segments, shipped_end) = match &view.current {
            Some(g) if g.wal_id == pos.wal_id => (g.segments.clone(), g.shipped_end),
            _ => (Vec::new(), 0),
        };
        Generation {
            number,
            snapshot_id: pos.snapshot_id,
            wal_id: pos.wal_id,
            wal_number: disk.wal.header.number,
            wal_header_floor: disk.wal.header.floor,
            wal_floor: local.wal_floor,
            snapshot: self.snapshot,
            archives: self.archives,
            side_files: self.side_files,
            segments,
            shipped_end,
            seal,
        }
    }
}
