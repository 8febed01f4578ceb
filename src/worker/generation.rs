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

use futures::{StreamExt, TryStreamExt};
use uuid::Uuid;

use super::ctx::Ctx;
use super::local::{Reading, read_side_files};
use super::view::{Generation, View};
use super::{DeferReason, StepOutcome, WorkerError};
use crate::at_rest::encode::Plain;
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
    cx.activity.set(StepPhase::ReadingFiles);
    let reading = read_ahead
        .filter(|r| r.serves(disk))
        .unwrap_or_else(|| Reading::start(cx.store, disk));
    let Some(local) = reading.finish().await? else {
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
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
        return Ok(StepOutcome::Deferred(DeferReason::Changed));
    }

    let uploader = &cx.uploader;
    let lineage = view.lineage;
    let number = view.max_generation + 1;
    tracing::Span::current().record("generation", number);
    let claim = GenerationClaim {
        lineage,
        generation: number,
        snapshot_id: pos.snapshot_id,
        wal_id: pos.wal_id,
        wal_number: disk.wal.header.number,
        created_at: manifest::now_rfc3339(),
    };
    cx.activity.set(StepPhase::Claiming { generation: number });
    uploader
        .put(
            &manifest::generation_key(number),
            Body::from(claim.encode()),
        )
        .await?;
    view.max_generation = number;
    view.claims.insert(number, Some(claim));
    // Its wrappers, before any data object of it (see `super::keys`).
    let seal = super::keys::new_generation_key(cx, view, number).await?;
    let mut uploader = uploader.clone();
    uploader.encoding.seal = seal.clone();
    let uploader = &uploader;

    // What this lineage already holds, newest first: the generation being replaced, then the
    // newest manifest.
    let known_snapshot = view
        .current
        .iter()
        .filter_map(|g| g.snapshot.clone())
        .chain(view.newest_own.iter().filter_map(|m| m.snapshot.clone()))
        .collect::<Vec<_>>();
    let known_archives: Vec<ArchiveEntry> = view
        .current
        .iter()
        .flat_map(|g| g.archives.clone())
        .chain(view.newest_own.iter().flat_map(|m| m.archives.clone()))
        .collect();
    let known_side: Vec<SideFileEntry> = view
        .current
        .iter()
        .flat_map(|g| g.side_files.clone())
        .chain(view.newest_own.iter().flat_map(|m| m.side_files.clone()))
        .collect();

    // Sealed entries compare by their keyed tag: the keys of their generations, if this
    // worker can open them. An entry of the other kind is never reused (a plaintext object
    // named by an encrypted generation, or the reverse).
    super::keys::open_keys_of(
        cx,
        view,
        known_snapshot
            .iter()
            .map(|k| &k.object)
            .chain(known_archives.iter().map(|k| &k.object))
            .chain(known_side.iter().map(|k| &k.object)),
    )
    .await?;
    let encrypting = seal.is_some();
    let keys = &view.keys;
    let matches = |e: &ObjectEntry, len: u64, crc: u32| {
        e.encrypted == encrypting
            && crate::at_rest::seal::plain_matches(
                e,
                len,
                crc,
                keys.get(&e.generation).and_then(|k| k.as_ref()),
            )
    };

    // Entries are decided first (reuse, or a new object of this generation); the new objects
    // then go up together, `GENERATION_UPLOADS_IN_FLIGHT` at a time, all after the claim and
    // all before this returns (so before any manifest can name them).
    let mut reused = 0u64;
    let mut uploads: Vec<(String, Plain, String)> = Vec::new();
    let snapshot = match &local.snapshot {
        None => None,
        Some(s) => {
            let reuse = known_snapshot.iter().find(|k| {
                k.snapshot_id == s.header.snapshot_id && matches(&k.object, s.len, s.crc)
            });
            Some(match reuse {
                Some(k) => {
                    reused += 1;
                    k.clone()
                }
                None => {
                    let key = manifest::snapshot_key(number);
                    let body = Plain::File {
                        file: s.file.clone(),
                        offset: 0,
                        len: s.len,
                        crc: s.crc,
                    };
                    uploads.push((key.clone(), body, "the snapshot".into()));
                    SnapshotEntry {
                        object: entry(key, s.len, s.crc, lineage, number),
                        snapshot_id: s.header.snapshot_id,
                        commit_seq: s.header.commit_seq,
                    }
                }
            })
        }
    };
    let mut archives = Vec::new();
    let of_archives = local.archives.len();
    for (i, a) in local.archives.iter().enumerate() {
        let reuse = known_archives
            .iter()
            .find(|k| k.number == a.number && matches(&k.object, a.len, a.crc));
        archives.push(match reuse {
            Some(k) => {
                reused += 1;
                k.clone()
            }
            None => {
                let key = manifest::archive_key(number, a.number);
                let body = Plain::File {
                    file: a.file.clone(),
                    offset: 0,
                    len: a.len,
                    crc: a.crc,
                };
                uploads.push((
                    key.clone(),
                    body,
                    format!("archive {} of {of_archives}", i + 1),
                ));
                ArchiveEntry {
                    object: entry(key, a.len, a.crc, lineage, number),
                    number: a.number,
                    frames: a.frames,
                }
            }
        });
    }
    let mut side_files = Vec::new();
    for (name, data, crc) in &side {
        let reuse = known_side
            .iter()
            .find(|k| &k.name == name && matches(&k.object, data.len() as u64, *crc));
        side_files.push(match reuse {
            Some(k) => {
                reused += 1;
                k.clone()
            }
            None => {
                // The key names the CRC; sealed, the keyed tag instead.
                let named = seal
                    .as_ref()
                    .map_or(*crc, |k| k.plain_tag(data.len() as u64, *crc));
                let key = manifest::side_key(number, name, named);
                uploads.push((
                    key.clone(),
                    Plain::Bytes(data.clone()),
                    format!("side file {name}"),
                ));
                SideFileEntry {
                    object: entry(key, data.len() as u64, *crc, lineage, number),
                    name: name.clone(),
                }
            }
        });
    }
    let uploaded = uploads.len() as u64;
    let in_flight = InFlight {
        activity: cx.activity,
        generation: number,
        of: uploaded,
        state: Mutex::default(),
    };
    let in_flight = &in_flight;
    let uploaded_entries: HashMap<String, ObjectEntry> =
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
            .await?;
    let bytes: u64 = uploaded_entries.values().map(|e| e.len).sum();
    let logical: u64 = uploaded_entries.values().map(|e| e.plain_len()).sum();
    let mut snapshot = snapshot;
    if let Some(s) = &mut snapshot {
        patch(&mut s.object, &uploaded_entries);
    }
    for a in &mut archives {
        patch(&mut a.object, &uploaded_entries);
    }
    for s in &mut side_files {
        patch(&mut s.object, &uploaded_entries);
    }

    // The same wal.bin as the generation being replaced (a snapshot that kept its WAL): its
    // shipped segments stay valid, and the manifest names them.
    let (segments, shipped_end) = match &view.current {
        Some(g) if g.wal_id == pos.wal_id => (g.segments.clone(), g.shipped_end),
        _ => (Vec::new(), 0),
    };
    view.current = Some(Generation {
        number,
        snapshot_id: pos.snapshot_id,
        wal_id: pos.wal_id,
        wal_number: disk.wal.header.number,
        wal_header_floor: disk.wal.header.floor,
        wal_floor: local.wal_floor,
        snapshot,
        archives,
        side_files,
        segments,
        shipped_end,
        seal,
    });
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
