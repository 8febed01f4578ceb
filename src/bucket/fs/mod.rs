//! A local directory acting as a bucket: the embedded default destination (`file:///path`).
//!
//! # Layout
//! A key maps to the file `root/<key>` (`/` in a key makes nested directories). The bucket's own
//! files start with `.` and no key may: `root/.tmp/` holds writes in flight, `root/.lock` is the
//! file every process `flock`s around a mutation.
//!
//! Everything the bucket creates (objects, its own files, directories) is private to the
//! service's user unless [`FILE_MODE_ENV`] says otherwise: files `0600`, directories `0700`
//! (see [`FileModes`]).
//!
//! # Opening
//! [`FsBucket::open`] (backups) creates the root, `.tmp/` and `.lock` as needed.
//! [`FsBucket::open_existing`] (the read-only commands, through [`super::open_read_only`])
//! creates nothing and removes nothing, and a missing root is an error: `ls --from
//! file:///typo` must say the directory does not exist, not list an empty bucket it made.
//!
//! # Invariants
//! - An object's file is never written in place. A write goes to a fresh temp file under
//!   `.tmp/`, is fsynced, and only then becomes the object by `link` (create-only: atomic, fails
//!   with `EEXIST` when the key exists) or `rename` (plain write and compare-and-swap), followed
//!   by an fsync of the parent directory. So a reader sees either the old object or the whole new
//!   one, never half of one, and an object that a `put` acknowledged survives a power cut. (The
//!   compare-and-swaps of frequently rewritten objects, the lease's renewals, are the one
//!   exception, below.)
//! - Every mutation (put, delete, and the directories they create or remove) runs under an
//!   exclusive `flock` on `root/.lock`, opened anew for each request, so it also excludes other
//!   `FsBucket`s on the same directory in this process and in other processes. The check of an
//!   `If-Match` and the rename that follows it are therefore one atomic step, exactly as on S3.
//!   Reads take no lock: `rename` and `link` are atomic for them.
//! - The ETag is a hash of the content (quoted hex of the first 16 bytes of its SHA-256). It is
//!   computed while the temp file is written and cached in the file's extended attribute
//!   `user.mushroom-backup.etag` (with the length, as a sanity check), so HEAD and LIST need not
//!   read whole objects. Where extended attributes are not supported, or were lost by a copy,
//!   the hash is computed from the content: the ETag is the same either way.
//!
//! # Frequently rewritten objects (the lease)
//! A write with [`PutHint::FrequentRewrite`] is one of an object rewritten every few seconds:
//! the bucket lease, renewed by every worker, so a fleet renews hundreds of times a second;
//! creating, fsyncing and renaming a new file for each renewal was most of an idle fleet's
//! CPU. Its compare-and-swap (`If-Match`, with the body in memory) is therefore done, under
//! the same lock and check, by writing the new record into the key's scratch file (`lease`'s
//! is `.tmp/lease.scratch`) and exchanging the two names in one atomic `renameat2`
//! (`RENAME_EXCHANGE`): the object is replaced whole, as by a rename, and the previous record
//! becomes the next scratch, so no inode is created or freed. It is not fsynced: a renewal lost
//! in a power cut leaves an earlier record, which only makes a successor wait a TTL longer, and a
//! power cut ends every holder on this machine anyway (the lease is advisory). A reader that opened the lease just before an exchange may, in the rare case
//! that two renewals pass while it reads, see a torn record: the lease's reader treats a record it
//! cannot parse as held by an unknown holder, and the `If-Match` under the lock is what decides.
//! Where names cannot be exchanged (NFS), the ordinary path below is taken.
//!
//! # The bucket's clock
//! A `get` reports the object's age ([`Object::age`]) as the local clock now minus the file's
//! mtime: every process sharing the directory reads the host's one clock, which is this
//! bucket's clock. Every write ends in a file written just before it became the object (the
//! temp file linked or renamed, or the scratch file exchanged), so the mtime is the write's.
//! A file whose mtime is in the future (the clock stepped back) reads as age zero.
//!
//! # The crash story
//! A process dying at any point leaves every object either as it was before the request or as
//! the request made it. What it may leave besides:
//! - a temp file under `.tmp/` (died before the link/rename, or between a link and the unlink of
//!   the temp name). [`FsBucket::open`] removes temp files older than [`STALE_TMP_AGE`], best
//!   effort; they are never visible as objects.
//! - empty directories (died between unlinking an object and removing its emptied parents).
//!   They hold no keys and are harmless; a later delete below them removes them.
//! - the lock: `flock` dies with its process, so a crash never leaves the bucket locked.
//!
//! A request's future dropped while its blocking part runs does not stop that part: the write
//! or delete then finishes (or fails) whole, as an S3 request already sent would.
//!
//! # Limits
//! A key cannot be both an object and a directory prefix of other keys (`a` and `a/b`): the
//! second one gets a `Permanent` error. Keys that are empty, absolute, start with `.`, or contain
//! empty, `.` or `..` segments are refused as `Permanent`. Files not written by this module
//! (symlinks, names that are not UTF-8) are not listed.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::body::check_crc32;
use super::{
    Body, BucketError, ListPage, ListQuery, Object, ObjectMeta, OpenError, PutCondition, PutHint,
    PutOpts,
};
use etag::{cache_etag, cached_etag, etag_of_digest, etag_of_file};
pub use mode::{FILE_MODE_ENV, FileModes};
use walk::walk;

mod etag;
mod mode;
#[cfg(test)]
mod tests;
mod walk;

/// The directory (under the root) holding writes in flight.
const TMP_DIR: &str = ".tmp";
/// How the name of a frequently rewritten object's scratch file under [`TMP_DIR`] ends.
const SCRATCH_SUFFIX: &str = ".scratch";
/// The file every process locks around a mutation.
const LOCK_FILE: &str = ".lock";
/// Temp files older than this are leftovers of a crashed writer and removed on open.
pub const STALE_TMP_AGE: Duration = Duration::from_secs(15 * 60);
/// How much of a file body is read and written at a time.
const CHUNK: u64 = 1 << 20;
/// S3's limit on a page of a listing; larger `max_keys` are cut to it.
const MAX_PAGE: usize = 1000;

/// A local directory acting as a bucket. Cheap to clone; see the module docs.
#[derive(Clone)]
pub struct FsBucket {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    /// Makes temp file names unique within this process (the pid makes them unique across).
    next_tmp: AtomicU64,
    /// What files and directories this bucket creates are given.
    modes: FileModes,
}

impl FsBucket {
    /// Opens (creating it if needed) the directory `root` as a bucket, with the modes of
    /// [`FILE_MODE_ENV`], and removes temp files that crashed writers left behind more than
    /// [`STALE_TMP_AGE`] ago.
    pub fn open(root: &Path) -> Result<FsBucket, OpenError> {
        let modes = FileModes::from_env().map_err(|reason| OpenError::Unavailable {
            url: format!("file://{}", root.display()),
            reason,
        })?;
        Self::open_with(root, modes)
    }

    /// [`FsBucket::open`] with the given modes.
    pub fn open_with(root: &Path, modes: FileModes) -> Result<FsBucket, OpenError> {
        let unavailable = |what: &str, e: io::Error| OpenError::Unavailable {
            url: format!("file://{}", root.display()),
            reason: format!("{what}: {e}"),
        };
        check_absolute(root)?;
        modes
            .create_dir_all(&root.join(TMP_DIR))
            .map_err(|e| unavailable("create directory", e))?;
        let bucket = FsBucket::at(root, modes);
        bucket
            .inner
            .open_lock_file()
            .map_err(|e| unavailable("create lock file", e))?;
        bucket.inner.remove_stale_temp_files();
        Ok(bucket)
    }

    /// Opens the existing directory `root` to read it, creating and removing nothing: no
    /// directory, no `.lock`, no `.tmp/`. A missing directory is [`OpenError::Missing`].
    /// Writes through it would fail (there is no `.tmp/`) or create a `.lock`: read-only
    /// callers take it behind [`super::read_only::ReadOnly`], as [`super::open_read_only`]
    /// does.
    pub fn open_existing(root: &Path) -> Result<FsBucket, OpenError> {
        check_absolute(root)?;
        let url = format!("file://{}", root.display());
        match fs::metadata(root) {
            Ok(meta) if meta.is_dir() => Ok(FsBucket::at(root, FileModes::default())),
            Ok(_) => Err(OpenError::Unavailable {
                url,
                reason: "not a directory".into(),
            }),
            Err(e) if is_absent(&e) => Err(OpenError::Missing { what: url }),
            Err(e) => Err(OpenError::Unavailable {
                url,
                reason: e.to_string(),
            }),
        }
    }

    fn at(root: &Path, modes: FileModes) -> FsBucket {
        FsBucket {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                next_tmp: AtomicU64::new(0),
                modes,
            }),
        }
    }

    /// The directory this bucket is rooted at.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Runs `f` on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        key: &str,
        f: impl FnOnce(&Inner) -> Result<T, BucketError> + Send + 'static,
    ) -> Result<T, BucketError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| BucketError::Permanent {
                op,
                key: key.to_string(),
                message: format!("blocking task failed: {e}"),
            })?
    }
}

#[async_trait::async_trait]
impl super::Bucket for FsBucket {
    fn url(&self) -> String {
        format!("file://{}", self.inner.root.display())
    }

    async fn get(&self, key: &str) -> Result<Object, BucketError> {
        check_key("get", key)?;
        let k = key.to_string();
        self.blocking("get", key, move |b| b.get(&k)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        check_key("get_range", key)?;
        let k = key.to_string();
        self.blocking("get_range", key, move |b| b.get_range(&k, range))
            .await
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        check_key("head", key)?;
        let k = key.to_string();
        self.blocking("head", key, move |b| b.head(&k)).await
    }

    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        check_key("put", key)?;
        let k = key.to_string();
        self.blocking("put", key, move |b| b.put(&k, &body, &opts))
            .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        check_key("delete", key)?;
        let k = key.to_string();
        let if_match = if_match.map(str::to_string);
        self.blocking("delete", key, move |b| b.delete(&k, if_match.as_deref()))
            .await
    }

    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        let (p, max_keys) = (query.prefix.to_string(), query.max_keys);
        let after = query.after().map(str::to_string);
        self.blocking("list", query.prefix, move |b| {
            b.list(&p, after.as_deref(), max_keys)
        })
        .await
    }
}

impl Inner {
    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn get(&self, key: &str) -> Result<Object, BucketError> {
        let err = |e| io_error("get", key, e, false);
        let Some((mut file, len)) = open_object(&self.path(key)).map_err(err)? else {
            return Err(BucketError::not_found(key));
        };
        // Taken before the read: an object replaced meanwhile is read through this descriptor,
        // so both the age and the data are the opened file's.
        let age = file
            .metadata()
            .map_err(err)?
            .modified()
            .ok()
            .map(|written| {
                SystemTime::now()
                    .duration_since(written)
                    .unwrap_or(Duration::ZERO)
            });
        let mut data = Vec::with_capacity(crate::units::usize_of(len));
        file.read_to_end(&mut data).map_err(err)?;
        let etag = match cached_etag(&file, data.len() as u64) {
            Some(etag) => etag,
            None => etag_of_digest(Sha256::digest(&data).into()),
        };
        Ok(Object {
            data: Bytes::from(data),
            etag,
            age,
        })
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        let err = |e| io_error("get_range", key, e, false);
        let Some((file, len)) = open_object(&self.path(key)).map_err(err)? else {
            return Err(BucketError::not_found(key));
        };
        let (start, end) = (range.start.min(len), range.end.min(len));
        if start >= end {
            return Ok(Bytes::new());
        }
        let mut buf = vec![0u8; crate::units::usize_of(end - start)];
        file.read_exact_at(&mut buf, start).map_err(err)?;
        Ok(Bytes::from(buf))
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        let err = |e| io_error("head", key, e, false);
        let Some((file, len)) = open_object(&self.path(key)).map_err(err)? else {
            return Ok(None);
        };
        let etag = etag_of_file(&file, len).map_err(err)?;
        // The directory's clock is the bucket's: the object's mtime (set when it was written,
        // before the link or rename that made it visible).
        let modified_ms = file
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(crate::units::millis_i64);
        Ok(Some(ObjectMeta {
            key: key.to_string(),
            len,
            etag,
            modified_ms,
        }))
    }

    /// The current ETag of `key`, or `None` when there is no such object.
    fn current_etag(&self, op: &'static str, key: &str) -> Result<Option<String>, BucketError> {
        let err = |e| io_error(op, key, e, false);
        match open_object(&self.path(key)).map_err(err)? {
            Some((file, len)) => Ok(Some(etag_of_file(&file, len).map_err(err)?)),
            None => Ok(None),
        }
    }

    fn put(&self, key: &str, body: &Body, opts: &PutOpts) -> Result<String, BucketError> {
        let cond = &opts.cond;
        if opts.hint == PutHint::FrequentRewrite
            && let (PutCondition::IfMatch(expected), Body::Bytes(bytes)) = (cond, body)
            && let Some(swapped) = self.swap(key, bytes, expected)
        {
            return swapped;
        }
        let (tmp, etag) = self.write_temp(key, body)?;
        let committed = self.commit(key, &tmp, cond);
        // After a rename the temp name is gone; after a link or a failure it is ours to remove.
        let _ = fs::remove_file(&tmp);
        committed.map(|()| etag)
    }

    /// A compare-and-swap of a frequently rewritten object by exchange with its scratch file
    /// (see the module docs): `None` where the file system cannot exchange names, or the key
    /// is too long for a scratch name (then the ordinary path runs).
    fn swap(&self, key: &str, body: &Bytes, expected: &str) -> Option<Result<String, BucketError>> {
        let scratch = self.root.join(TMP_DIR).join(scratch_name(key)?);
        let err = |e| io_error("put", key, e, false);
        let swapped = (|| -> Result<Option<String>, BucketError> {
            let _lock = self.lock("put", key)?;
            if self.current_etag("put", key)?.as_deref() != Some(expected) {
                return Err(BucketError::precondition_failed(key));
            }
            // Overwritten from the start and cut to length, never truncated to nothing first:
            // ext4 flushes a file emptied by a truncate when it is closed, at the cost of a
            // disk write per renewal.
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(self.modes.file)
                .open(&scratch)
                .map_err(err)?;
            file.write_all_at(body, 0).map_err(err)?;
            let meta = file.metadata().map_err(err)?;
            // Records grow by a digit now and then: a cut is rarely needed.
            if meta.len() != body.len() as u64 {
                file.set_len(body.len() as u64).map_err(err)?;
            }
            // Only a fresh scratch file (or one the umask narrowed) needs its mode.
            if meta.permissions().mode() & 0o777 != self.modes.file {
                self.modes.set_file(&file).map_err(err)?;
            }
            let etag = etag_of_digest(Sha256::digest(body).into());
            cache_etag(&file, body.len() as u64, &etag);
            match exchange(&scratch, &self.path(key)) {
                Ok(()) => Ok(Some(etag)),
                // No exchange here (NFS, say), or the scratch file was cleaned up meanwhile.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::ENOSYS | libc::ENOENT)
                    ) =>
                {
                    Ok(None)
                }
                Err(e) => Err(err(e)),
            }
        })();
        swapped.transpose()
    }

    /// Writes `body` to a new, fsynced temp file; returns its path and the content's ETag.
    fn write_temp(&self, key: &str, body: &Body) -> Result<(PathBuf, String), BucketError> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = self
            .root
            .join(TMP_DIR)
            .join(format!("{}-{n}-{nanos:09}.tmp", std::process::id()));
        let written = write_file(&tmp, body, &self.modes);
        match written {
            Ok(etag) => Ok((tmp, etag)),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(match e {
                    WriteError::Body(e) => BucketError::Permanent {
                        op: "put",
                        key: key.to_string(),
                        message: format!("reading the body: {e}"),
                    },
                    WriteError::Temp(e) => io_error("put", key, e, false),
                })
            }
        }
    }

    /// Makes the temp file the object `key` if `cond` holds, under the bucket lock.
    fn commit(&self, key: &str, tmp: &Path, cond: &PutCondition) -> Result<(), BucketError> {
        let _lock = self.lock("put", key)?;
        let path = self.path(key);
        if path.is_dir() {
            return Err(prefix_conflict("put", key));
        }
        self.create_parents("put", key)?;
        let err = |e| io_error("put", key, e, false);
        match cond {
            PutCondition::IfNoneMatch => match fs::hard_link(tmp, &path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(BucketError::precondition_failed(key));
                }
                Err(e) => return Err(err(e)),
            },
            PutCondition::IfMatch(expected) => {
                if self.current_etag("put", key)?.as_deref() != Some(expected.as_str()) {
                    return Err(BucketError::precondition_failed(key));
                }
                fs::rename(tmp, &path).map_err(err)?;
            }
            PutCondition::None => fs::rename(tmp, &path).map_err(err)?,
        }
        // The object is visible now; only its durability is in question.
        sync_parent(&path).map_err(|e| io_error("put", key, e, true))
    }

    fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        let _lock = self.lock("delete", key)?;
        if let Some(expected) = if_match
            && self.current_etag("delete", key)?.as_deref() != Some(expected)
        {
            return Err(BucketError::precondition_failed(key));
        }
        let path = self.path(key);
        match fs::remove_file(&path) {
            Ok(()) => {}
            // No such object (or only a directory prefix of other keys): deleting is a no-op.
            Err(e) if is_absent(&e) || e.raw_os_error() == Some(libc::EISDIR) => return Ok(()),
            Err(e) => return Err(io_error("delete", key, e, false)),
        }
        sync_parent(&path).map_err(|e| io_error("delete", key, e, true))?;
        self.remove_empty_parents(&path);
        Ok(())
    }

    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage, BucketError> {
        let max_keys = max_keys.clamp(1, MAX_PAGE);
        let mut found = Vec::new();
        walk(&self.root, "", prefix, after, max_keys + 1, &mut found)
            .map_err(|e| io_error("list", prefix, e, false))?;
        let more = found.len() > max_keys;
        found.truncate(max_keys);
        let next_token = if more { found.last().cloned() } else { None };
        let mut objects = Vec::with_capacity(found.len());
        for key in found {
            // An object deleted since the walk is simply not listed.
            if let Some(meta) = self.head(&key)? {
                objects.push(meta);
            }
        }
        Ok(ListPage {
            objects,
            next_token,
        })
    }

    /// Takes the bucket-wide lock; it is released when the returned file is dropped.
    fn lock(&self, op: &'static str, key: &str) -> Result<File, BucketError> {
        let file = self
            .open_lock_file()
            .map_err(|e| io_error(op, key, e, false))?;
        file.lock().map_err(|e| io_error(op, key, e, false))?;
        Ok(file)
    }

    /// Opens the lock file, creating it (with the file mode) if it is not there.
    fn open_lock_file(&self) -> io::Result<File> {
        let path = self.root.join(LOCK_FILE);
        match OpenOptions::new().append(true).open(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            other => return other,
        }
        match OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(self.modes.file)
            .open(&path)
        {
            Ok(file) => {
                self.modes.set_file(&file)?;
                Ok(file)
            }
            // Created meanwhile by another process.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                OpenOptions::new().append(true).open(&path)
            }
            Err(e) => Err(e),
        }
    }

    /// Creates the missing directories above `key`, each made durable in its parent.
    fn create_parents(&self, op: &'static str, key: &str) -> Result<(), BucketError> {
        let mut dir = self.root.clone();
        let segments: Vec<&str> = key.split('/').collect();
        for segment in &segments[..segments.len() - 1] {
            dir.push(segment);
            match self.modes.create_dir(&dir) {
                Ok(()) => sync_parent(&dir).map_err(|e| io_error(op, key, e, false))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(prefix_conflict(op, key));
                }
                Err(e) => return Err(io_error(op, key, e, false)),
            }
        }
        Ok(())
    }

    /// Removes the directories above `path` that the delete left empty (best effort).
    fn remove_empty_parents(&self, path: &Path) {
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == self.root || fs::remove_dir(d).is_err() {
                return;
            }
            dir = d.parent();
        }
    }

    fn remove_stale_temp_files(&self) {
        let Ok(entries) = fs::read_dir(self.root.join(TMP_DIR)) else {
            return;
        };
        for entry in entries.flatten() {
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP_AGE);
            if stale {
                match fs::remove_file(entry.path()) {
                    Ok(()) => {
                        tracing::info!(path = %entry.path().display(), "removed a stale temp file")
                    }
                    Err(e) => {
                        tracing::warn!(path = %entry.path().display(), "cannot remove a stale temp file: {e}")
                    }
                }
            }
        }
    }
}

/// Why writing a temp file failed: the body could not be read, or the temp file not written.
enum WriteError {
    Body(io::Error),
    Temp(io::Error),
}

/// Writes `body` to the new file `path` (given the file mode), fsyncs it and caches its ETag;
/// returns the ETag.
fn write_file(path: &Path, body: &Body, modes: &FileModes) -> Result<String, WriteError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(modes.file)
        .open(path)
        .map_err(WriteError::Temp)?;
    modes.set_file(&file).map_err(WriteError::Temp)?;
    let mut hasher = Sha256::new();
    match body {
        Body::Bytes(bytes) => {
            hasher.update(bytes);
            file.write_all(bytes).map_err(WriteError::Temp)?;
        }
        Body::File {
            file: source,
            offset,
            len,
            crc32,
        } => {
            let mut buf = vec![0u8; crate::units::usize_of(CHUNK.min(*len))];
            let mut crc = crc32fast::Hasher::new();
            let mut done = 0;
            while done < *len {
                let n = crate::units::usize_of(CHUNK.min(len - done));
                source
                    .read_exact_at(&mut buf[..n], offset + done)
                    .map_err(WriteError::Body)?;
                hasher.update(&buf[..n]);
                if crc32.is_some() {
                    crc.update(&buf[..n]);
                }
                file.write_all(&buf[..n]).map_err(WriteError::Temp)?;
                done += n as u64;
            }
            // Checked before the fsync and the rename: a changed file leaves no object.
            if let Some(stated) = crc32 {
                check_crc32(*stated, crc.finalize())
                    .map_err(|m| WriteError::Body(io::Error::new(io::ErrorKind::InvalidData, m)))?;
            }
        }
    }
    file.sync_all().map_err(WriteError::Temp)?;
    let etag = etag_of_digest(hasher.finalize().into());
    cache_etag(&file, body.len(), &etag);
    Ok(etag)
}

/// Opens the object file at `path`: `None` when there is no such object.
fn open_object(path: &Path) -> io::Result<Option<(File, u64)>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((file, meta.len())))
}

fn check_absolute(root: &Path) -> Result<(), OpenError> {
    if root.is_absolute() {
        Ok(())
    } else {
        Err(OpenError::BadUrl {
            url: format!("file://{}", root.display()),
            reason: "the bucket directory must be an absolute path".into(),
        })
    }
}

/// Refuses keys that could escape the root, collide with the bucket's own files or name one
/// file in two ways.
pub(super) fn check_key(op: &'static str, key: &str) -> Result<(), BucketError> {
    let why = if key.is_empty() {
        "the key is empty"
    } else if key.starts_with('/') {
        "the key is absolute"
    } else if key.starts_with('.') {
        "keys starting with '.' are reserved for the bucket's own files"
    } else if key.contains('\0') {
        "the key contains a NUL byte"
    } else if key.split('/').any(|s| s.is_empty()) {
        "the key has an empty segment ('//' or a trailing '/')"
    } else if key.split('/').any(|s| s == "." || s == "..") {
        "the key has a '.' or '..' segment"
    } else {
        return Ok(());
    };
    Err(BucketError::Permanent {
        op,
        key: key.to_string(),
        message: format!("bad key: {why}"),
    })
}

/// The scratch file name of `key` under [`TMP_DIR`]: the key with `%` and `/` escaped (`lease`
/// is `lease.scratch`), or `None` when that is longer than a file name may be.
fn scratch_name(key: &str) -> Option<String> {
    let name = key.replace('%', "%25").replace('/', "%2F") + SCRATCH_SUFFIX;
    (name.len() <= 255).then_some(name)
}

/// Swaps the names `a` and `b` in one atomic step (`renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let a = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let b = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths; no memory is handed to the kernel beyond the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Fsyncs the directory holding `path`, making a link, rename, unlink or mkdir in it durable.
fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// Maps an I/O error: resource trouble that may pass is `Transient`, the rest `Permanent`
/// unless the request may already have taken effect (`indeterminate`).
fn io_error(op: &'static str, key: &str, e: io::Error, indeterminate: bool) -> BucketError {
    let may_pass = matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSPC
                | libc::EDQUOT
                | libc::EIO
                | libc::EAGAIN
                | libc::EINTR
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOMEM
                | libc::EBUSY
        )
    );
    if may_pass || indeterminate {
        BucketError::Transient {
            op,
            key: key.to_string(),
            message: e.to_string(),
            indeterminate,
        }
    } else {
        BucketError::Permanent {
            op,
            key: key.to_string(),
            message: e.to_string(),
        }
    }
}

fn prefix_conflict(op: &'static str, key: &str) -> BucketError {
    BucketError::Permanent {
        op,
        key: key.to_string(),
        message: "a local-directory bucket cannot hold an object that is also a directory \
                  prefix of other keys (like `a` and `a/b`)"
            .into(),
    }
}
