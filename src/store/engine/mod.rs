//! The reference engine: a key-value map that writes exactly the store format of DESIGN.md
//! section 2, for tests, benchmarks, the demo node and restore checks.
//!
//! A commit is one WAL frame whose payload is a batch of put/delete [`Op`]s ([`codec`]).
//! [`Engine::commit`] only appends the frame to an in-memory group; [`Engine::sync`] writes
//! the group to `wal.bin`, fdatasyncs it, then rewrites `wal.position` in place and publishes
//! the new position on the [`PositionHandle`]. **A commit is durable only after the sync that
//! covers it**; dropping an engine loses its unsynced group, exactly as a crash would.
//!
//! # Invariants
//!
//! - `store.lock` is flocked by the one engine that has the store open; readers
//!   ([`read_store`], [`digest`]) take no lock and write nothing.
//! - The WAL chain — archives that are not covered by the snapshot, then `wal.bin` — has
//!   consecutive numbers, each file's floor equal to the previous file's last seq, and starts
//!   at or below the snapshot's `commit_seq` (0 without a snapshot).
//! - `wal.bin`, `snapshot.bin` and `store.meta` are only ever replaced by
//!   write-tmp-fsync-rename, so each is whole: old or new, never torn. Only `wal.bin`'s tail
//!   can be torn (an append that did not reach its fsync), and recovery cuts it.
//! - The position (handle and `wal.position`) is published only after the fsync it
//!   describes: it is never ahead of what is durable. `durable_len` is a frame boundary.
//! - `snapshot.intent` is non-empty only while a snapshot is in flight.
//!
//! # Snapshot protocol and what a crash leaves behind
//!
//! [`Engine::snapshot`] first syncs the group, so `wal.bin` ends at `commit_seq` = C.
//!
//! 1. Write `snapshot.intent` (`{"snapshot_id", "commit_seq"}`) and fsync it.
//!    *Crash here*: an intent whose id `snapshot.bin` lacks (or a torn intent). Recovery rolls
//!    back: removes `snapshot.bin.tmp` if any, empties the intent.
//! 2. Write and fsync `snapshot.bin.tmp`. *Crash*: same roll-back.
//! 3. Rename it to `snapshot.bin`, fsync the directory (so the rename is durable before the
//!    WAL it makes redundant is replaced). *Crash from here on*: `snapshot.bin` carries the
//!    intent's id, the snapshot *completed*; recovery finishes the protocol below.
//! 4. Unless `keep_wal_on_snapshot`: start a new `wal.bin` (new `wal_id`, number + 1,
//!    floor C) by write-tmp-fsync-rename. *Crash before it*: recovery sees a completed
//!    intent and a `wal.bin` with floor < C whose frames all lie in the snapshot, and starts
//!    the new `wal.bin` itself. With `keep_wal_on_snapshot` the snapshot's header names the
//!    current WAL in `kept_wal_id` and `wal.bin` continues.
//! 5. Delete the archives the snapshot covers (all of them: each ends at or below the
//!    current WAL's floor), fsync `archive/` and the store directory. *Crash*: covered
//!    archives are skipped by the chain check and deleted by recovery.
//! 6. Empty `snapshot.intent` (truncate to 0, fsync). Done.
//!
//! # Rotation and what a crash leaves behind
//!
//! [`Engine::rotate`] (automatic when `wal.bin` passes `rotate_bytes` after a sync) syncs the
//! group, then:
//!
//! 1. Writes and fsyncs `wal.bin.tmp`: a header with a new `wal_id`, number + 1, floor = the
//!    last seq. *Crash*: a stray tmp, removed by recovery.
//! 2. Renames `wal.bin` to `archive/<number:020>.wal`, fsyncs `archive/` and the store
//!    directory. *Crash*: no `wal.bin`; recovery starts a new one after the last archive.
//! 3. Renames `wal.bin.tmp` to `wal.bin`, fsyncs the directory.
//!
//! # Recovery
//!
//! [`Engine::open`] takes the lock, reads the store exactly as [`read_store`] does (see
//! [`recover`] for the rules), applies the listed [`Recovery`] steps, reads again (which
//! must find nothing left to do), fdatasyncs `wal.bin` (frames a dead process wrote but did
//! not fsync are counted, so they are made durable before they are reported) and writes
//! `wal.position`. Every recovery step is idempotent, so a crash during recovery is
//! recovered by the next open.

pub mod codec;
mod error;
mod files;
mod position;
pub mod recover;
mod workload;

#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use uuid::Uuid;

pub use codec::{KvMap, Op};
pub use error::EngineError;
pub use files::lock_store;
pub use position::PositionHandle;
pub use recover::{
    ArchiveInfo, IntentState, Recovery, StoreDigest, StoreImage, digest, digest_map, read_store,
};
pub use workload::{
    KEY_SPACE, SplitMix64, ValueKind, WORKLOAD_GROUP, WriteOptions, WriteReport, expected_map,
    expected_map_of, workload_ops, workload_ops_of, write_commits,
};

use crate::store::format::{
    MAX_FRAME_PAYLOAD, SnapshotIntent, WAL_HEADER_LEN, WalHeader, WalPosition, encode_frame,
    encode_snapshot,
};
use files::{ARCHIVE_DIR, INTENT, META, POSITION, SNAPSHOT, SNAPSHOT_TMP, WAL, WAL_TMP};

/// `format` written to and expected in `store.meta`.
pub const STORE_FORMAT: u64 = 1;
/// `engine` written to `store.meta`.
pub const ENGINE_NAME: &str = "mushroom-reference";

/// How an [`Engine`] groups, rotates and snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Rotate after a sync that leaves `wal.bin` longer than this many bytes; 0 = never.
    pub rotate_bytes: u64,
    /// Snapshot after a sync once this many commits passed since the last snapshot; 0 = never.
    pub snapshot_every: u64,
    /// Snapshots keep `wal.bin` (naming it in `kept_wal_id`) instead of starting a new one.
    pub keep_wal_on_snapshot: bool,
    /// [`Engine::commit`] syncs by itself once the group holds this many commits; 0 = only
    /// explicit [`Engine::sync`] calls.
    pub group_commit: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            rotate_bytes: 0,
            snapshot_every: 0,
            keep_wal_on_snapshot: false,
            group_commit: 1,
        }
    }
}

/// A step of the snapshot and rotation protocols; unit tests stop the engine at one to
/// simulate a crash there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrashPoint {
    IntentWritten,
    SnapshotTmpWritten,
    SnapshotRenamed,
    NewWalStarted,
    ArchivesDeleted,
    RotateTmpWritten,
    RotateArchived,
}

/// The reference engine with its store open (and locked).
#[derive(Debug)]
pub struct Engine {
    dir: PathBuf,
    opts: EngineOptions,
    /// Holds the flock on `store.lock` for the engine's lifetime.
    _lock: File,
    /// `wal.bin`, written with positioned writes at `durable_len`.
    wal: File,
    wal_header: WalHeader,
    /// Bytes of `wal.bin` written and fdatasynced.
    durable_len: u64,
    /// `wal.position`, rewritten in place after each fsync.
    position_file: File,
    position_tx: tokio::sync::watch::Sender<WalPosition>,
    snapshot_id: Option<Uuid>,
    /// `commit_seq` of the last snapshot (0 without one).
    snapshot_seq: u64,
    map: KvMap,
    /// Last seq assigned, durable or not.
    commit_seq: u64,
    /// Last seq fsynced.
    durable_seq: u64,
    /// Encoded frames not yet written.
    group: Vec<u8>,
    group_commits: usize,
    /// Set after a failed write or protocol step: what is durable is unknown until reopen.
    failed: Option<String>,
    #[cfg(test)]
    crash_at: Option<CrashPoint>,
}

impl Engine {
    /// Opens the store in `dir`, creating it if there is none, locks it and recovers it
    /// (see the module docs). Fails with [`EngineError::Locked`] if another engine has it.
    pub fn open(dir: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let dir = dir.as_ref().to_path_buf();
        files::ensure_dir(&dir)?;
        let lock = files::lock_store(&dir)?;
        let image = match read_store(&dir) {
            Err(EngineError::NotAStore { .. }) => {
                create_store(&dir)?;
                read_store(&dir)?
            }
            other => other?,
        };
        let image = if image.recovery.is_empty() {
            image
        } else {
            tracing::info!(dir = %dir.display(), steps = ?image.recovery, "recovering store");
            recover::repair(&dir, &image.recovery)?;
            let again = read_store(&dir)?;
            if !again.recovery.is_empty() {
                return Err(EngineError::corrupt(
                    &dir,
                    format!(
                        "recovery did not converge, still to do: {:?}",
                        again.recovery
                    ),
                ));
            }
            again
        };
        let wal_header = image
            .wal
            .ok_or_else(|| EngineError::corrupt(&dir.join(WAL), "missing after recovery"))?;
        ensure_side_files(&dir)?;

        let wal_path = dir.join(WAL);
        let wal = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&wal_path)
            .map_err(|e| EngineError::io(&wal_path, "open", e))?;
        wal.sync_data()
            .map_err(|e| EngineError::io(&wal_path, "fdatasync", e))?;
        let pos_path = dir.join(POSITION);
        let position_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&pos_path)
            .map_err(|e| EngineError::io(&pos_path, "open", e))?;

        let position = WalPosition {
            snapshot_id: image.snapshot.map(|s| s.snapshot_id),
            wal_id: wal_header.wal_id,
            wal_number: wal_header.number,
            durable_len: image.wal_valid_len,
            commit_seq: image.commit_seq,
        };
        let (position_tx, _) = tokio::sync::watch::channel(position);
        let mut engine = Engine {
            dir,
            opts,
            _lock: lock,
            wal,
            wal_header,
            durable_len: image.wal_valid_len,
            position_file,
            position_tx,
            snapshot_id: image.snapshot.map(|s| s.snapshot_id),
            snapshot_seq: image.snapshot.map_or(0, |s| s.commit_seq),
            map: image.map,
            commit_seq: image.commit_seq,
            durable_seq: image.commit_seq,
            group: Vec::new(),
            group_commits: 0,
            failed: None,
            #[cfg(test)]
            crash_at: None,
        };
        engine.publish()?;
        Ok(engine)
    }

    /// Appends one commit to the group and returns its seq. It is durable only after the
    /// next [`sync`](Self::sync) (which this calls itself when the group is full).
    pub fn commit(&mut self, ops: &[Op]) -> Result<u64, EngineError> {
        self.check_ok()?;
        let len = codec::batch_len(ops);
        if len > MAX_FRAME_PAYLOAD as usize {
            return Err(EngineError::TooLarge {
                len,
                max: MAX_FRAME_PAYLOAD,
            });
        }
        let seq = self.commit_seq + 1;
        encode_frame(seq, &codec::encode_batch(ops), &mut self.group);
        codec::apply_ops(&mut self.map, ops);
        self.commit_seq = seq;
        self.group_commits += 1;
        if self.opts.group_commit > 0 && self.group_commits >= self.opts.group_commit {
            self.sync()?;
        }
        Ok(seq)
    }

    /// Writes the group to `wal.bin`, fdatasyncs it, publishes the position, then rotates or
    /// snapshots if the options say so. Returns the durable position.
    pub fn sync(&mut self) -> Result<WalPosition, EngineError> {
        self.guarded(|e| {
            e.flush()?;
            if e.opts.snapshot_every > 0 && e.durable_seq - e.snapshot_seq >= e.opts.snapshot_every
            {
                e.snapshot_steps()?;
            }
            // An empty wal.bin is never rotated, whatever `rotate_bytes` is.
            let has_frames = e.durable_len > WAL_HEADER_LEN as u64;
            if e.opts.rotate_bytes > 0 && e.durable_len > e.opts.rotate_bytes && has_frames {
                e.rotate_steps()?;
            }
            Ok(e.position())
        })
    }

    /// Syncs, then closes `wal.bin` into `archive/` and starts the next one (module docs).
    pub fn rotate(&mut self) -> Result<WalPosition, EngineError> {
        self.guarded(|e| {
            e.rotate_steps()?;
            Ok(e.position())
        })
    }

    /// Syncs, then takes a snapshot of the map by the snapshot protocol (module docs).
    pub fn snapshot(&mut self) -> Result<WalPosition, EngineError> {
        self.guarded(|e| {
            e.snapshot_steps()?;
            Ok(e.position())
        })
    }

    /// Syncs and closes the engine, releasing `store.lock`.
    pub fn close(mut self) -> Result<WalPosition, EngineError> {
        self.sync()
    }

    /// The durable position: what the last sync made durable.
    pub fn position(&self) -> WalPosition {
        WalPosition {
            snapshot_id: self.snapshot_id,
            wal_id: self.wal_header.wal_id,
            wal_number: self.wal_header.number,
            durable_len: self.durable_len,
            commit_seq: self.durable_seq,
        }
    }

    /// A handle on the durable position for other tasks; reading it takes no engine lock.
    pub fn position_handle(&self) -> PositionHandle {
        PositionHandle::new(self.position_tx.subscribe())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// The map, including commits not yet synced.
    pub fn map(&self) -> &KvMap {
        &self.map
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    /// The last seq assigned, including commits not yet synced.
    pub fn commit_seq(&self) -> u64 {
        self.commit_seq
    }

    /// The digest of the map and `commit_seq`, including commits not yet synced.
    pub fn digest(&self) -> StoreDigest {
        StoreDigest {
            commit_seq: self.commit_seq,
            digest: digest_map(&self.map),
        }
    }

    #[cfg(test)]
    pub(crate) fn crash_at(&mut self, point: CrashPoint) {
        self.crash_at = Some(point);
    }

    fn reached(&self, _point: CrashPoint) -> Result<(), EngineError> {
        #[cfg(test)]
        if self.crash_at == Some(_point) {
            return Err(EngineError::InjectedCrash(format!("{_point:?}")));
        }
        Ok(())
    }

    fn check_ok(&self) -> Result<(), EngineError> {
        match &self.failed {
            None => Ok(()),
            Some(reason) => Err(EngineError::Failed {
                dir: self.dir.clone(),
                reason: reason.clone(),
            }),
        }
    }

    /// Runs a step that writes files; if it fails, the engine refuses further work.
    fn guarded<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        self.check_ok()?;
        let r = f(self);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    /// Writes and fdatasyncs the group, then publishes the position.
    fn flush(&mut self) -> Result<(), EngineError> {
        if self.group.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(WAL);
        self.wal
            .write_all_at(&self.group, self.durable_len)
            .map_err(|e| EngineError::io(&path, "write", e))?;
        self.wal
            .sync_data()
            .map_err(|e| EngineError::io(&path, "fdatasync", e))?;
        self.durable_len += self.group.len() as u64;
        self.durable_seq = self.commit_seq;
        self.group.clear();
        self.group_commits = 0;
        self.publish()
    }

    /// Publishes the durable position: the handle, then `wal.position` (a hint for a
    /// follower in another process; not fsynced, the next open rewrites it).
    fn publish(&mut self) -> Result<(), EngineError> {
        let pos = self.position();
        self.position_tx.send_replace(pos);
        self.position_file
            .write_all_at(&pos.encode(), 0)
            .map_err(|e| EngineError::io(&self.dir.join(POSITION), "write", e))
    }

    fn reopen_wal(&mut self, header: WalHeader) -> Result<(), EngineError> {
        let path = self.dir.join(WAL);
        self.wal = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| EngineError::io(&path, "open", e))?;
        self.wal_header = header;
        self.durable_len = WAL_HEADER_LEN as u64;
        Ok(())
    }

    fn rotate_steps(&mut self) -> Result<(), EngineError> {
        self.flush()?;
        let adir = self.dir.join(ARCHIVE_DIR);
        files::ensure_dir(&adir)?;
        let header = WalHeader {
            wal_id: Uuid::new_v4(),
            number: self.wal_header.number + 1,
            floor: self.durable_seq,
        };
        let tmp = self.dir.join(WAL_TMP);
        files::write_synced(&tmp, &header.encode())?;
        self.reached(CrashPoint::RotateTmpWritten)?;
        let wal = self.dir.join(WAL);
        files::rename(
            &wal,
            &adir.join(files::archive_name(self.wal_header.number)),
        )?;
        files::fsync_dir(&adir)?;
        files::fsync_dir(&self.dir)?;
        self.reached(CrashPoint::RotateArchived)?;
        files::rename(&tmp, &wal)?;
        files::fsync_dir(&self.dir)?;
        self.reopen_wal(header)?;
        self.publish()
    }

    fn snapshot_steps(&mut self) -> Result<(), EngineError> {
        self.flush()?;
        let intent = SnapshotIntent {
            snapshot_id: Uuid::new_v4(),
            commit_seq: self.durable_seq,
        };
        let intent_json = serde_json::to_vec(&intent).expect("intent serializes");
        files::rewrite_in_place(&self.dir.join(INTENT), &intent_json)?;
        self.reached(CrashPoint::IntentWritten)?;

        let keep = self.opts.keep_wal_on_snapshot;
        let kept_wal_id = keep.then_some(self.wal_header.wal_id);
        let file = encode_snapshot(
            intent.snapshot_id,
            intent.commit_seq,
            kept_wal_id,
            &codec::encode_map(&self.map),
        );
        let tmp = self.dir.join(SNAPSHOT_TMP);
        files::write_synced(&tmp, &file)?;
        self.reached(CrashPoint::SnapshotTmpWritten)?;
        files::rename(&tmp, &self.dir.join(SNAPSHOT))?;
        files::fsync_dir(&self.dir)?;
        self.reached(CrashPoint::SnapshotRenamed)?;

        // Every archive precedes the current WAL, so it ends at or below its floor <= C.
        let covered_below = self.wal_header.number;
        if !keep {
            let header =
                files::start_wal(&self.dir, self.wal_header.number + 1, intent.commit_seq)?;
            self.reopen_wal(header)?;
        }
        self.reached(CrashPoint::NewWalStarted)?;
        for (number, path) in files::list_archives(&self.dir)? {
            if number < covered_below {
                files::remove_if_present(&path)?;
            }
        }
        let adir = self.dir.join(ARCHIVE_DIR);
        if adir.is_dir() {
            files::fsync_dir(&adir)?;
        }
        files::fsync_dir(&self.dir)?;
        self.reached(CrashPoint::ArchivesDeleted)?;
        files::rewrite_in_place(&self.dir.join(INTENT), b"")?;

        self.snapshot_id = Some(intent.snapshot_id);
        self.snapshot_seq = intent.commit_seq;
        self.publish()
    }
}

/// Creates an empty store: `archive/`, `store.meta`, an empty `snapshot.intent`, and last
/// `wal.bin` (number 1, floor 0) — its presence is what makes the directory a store.
fn create_store(dir: &Path) -> Result<(), EngineError> {
    tracing::info!(dir = %dir.display(), "creating store");
    ensure_side_files(dir)?;
    files::start_wal(dir, 1, 0)?;
    Ok(())
}

/// `archive/`, `snapshot.intent` and `store.meta`, created if missing.
fn ensure_side_files(dir: &Path) -> Result<(), EngineError> {
    files::ensure_dir(&dir.join(ARCHIVE_DIR))?;
    let intent = dir.join(INTENT);
    let mut created = false;
    if !intent.exists() {
        files::rewrite_in_place(&intent, b"")?;
        created = true;
    }
    if !dir.join(META).exists() {
        let meta = serde_json::json!({ "format": STORE_FORMAT, "engine": ENGINE_NAME });
        files::write_atomic(dir, META, meta.to_string().as_bytes())?;
    }
    if created {
        files::fsync_dir(dir)?;
    }
    Ok(())
}
