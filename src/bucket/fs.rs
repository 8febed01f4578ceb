//! A local directory acting as a bucket: the embedded default destination (`file:///path`).
//!
//! # Layout
//! A key maps to the file `root/<key>` (`/` in a key makes nested directories). The bucket's own
//! files start with `.` and no key may: `root/.tmp/` holds writes in flight, `root/.lock` is the
//! file every process `flock`s around a mutation.
//!
//! # Invariants
//! - An object's file is never written in place. A write goes to a fresh temp file under
//!   `.tmp/`, is fsynced, and only then becomes the object by `link` (create-only: atomic, fails
//!   with `EEXIST` when the key exists) or `rename` (plain write and compare-and-swap), followed
//!   by an fsync of the parent directory. So a reader sees either the old object or the whole new
//!   one, never half of one, and an object that a `put` acknowledged survives a power cut. (The
//!   lease object's renewals are the one exception, below.)
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
//! # The lease object
//! The bucket lease (key `lease`) is renewed every few seconds by every worker, so a fleet
//! renews hundreds of times a second; creating, fsyncing and renaming a new file for each
//! renewal was most of an idle fleet's CPU. Its compare-and-swap (`If-Match`) is therefore done,
//! under the same lock and check, by writing the new record into a scratch file
//! (`.tmp/lease.scratch`) and exchanging the two names in one atomic `renameat2`
//! (`RENAME_EXCHANGE`): the object is replaced whole, as by a rename, and the previous record
//! becomes the next scratch, so no inode is created or freed. It is not fsynced: a renewal lost
//! in a power cut leaves an earlier record, which only makes a successor wait a TTL longer, and a
//! power cut ends every holder on this machine anyway (the lease is advisory; see
//! `crate::lease`). A reader that opened the lease just before an exchange may, in the rare case
//! that two renewals pass while it reads, see a torn record: the lease's reader treats a record it
//! cannot parse as held by an unknown holder, and the `If-Match` under the lock is what decides.
//! Where names cannot be exchanged (NFS), the ordinary path below is taken.
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
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::body::check_crc32;
use super::{Body, BucketError, ListPage, Object, ObjectMeta, OpenError, PutCondition};

/// The directory (under the root) holding writes in flight.
const TMP_DIR: &str = ".tmp";
/// The bucket lease's key (`crate::manifest::LEASE_KEY`; the bucket layer does not depend on
/// the layers above it, a test checks the two agree): rewritten by [`Inner::swap_lease`].
const LEASE_KEY: &str = "lease";
/// The scratch file under [`TMP_DIR`] that the lease object is exchanged with.
const LEASE_SCRATCH: &str = "lease.scratch";
/// The file every process locks around a mutation.
const LOCK_FILE: &str = ".lock";
/// Temp files older than this are leftovers of a crashed writer and removed on open.
pub const STALE_TMP_AGE: Duration = Duration::from_secs(15 * 60);
/// The extended attribute caching `<len>:<etag>` (NUL-terminated for the C call).
const ETAG_XATTR: &[u8] = b"user.mushroom-backup.etag\0";
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
}

impl FsBucket {
    /// Opens (creating it if needed) the directory `root` as a bucket, and removes temp files
    /// that crashed writers left behind more than [`STALE_TMP_AGE`] ago.
    pub fn open(root: &Path) -> Result<FsBucket, OpenError> {
        let unavailable = |what: &str, e: io::Error| OpenError::Unavailable {
            url: format!("file://{}", root.display()),
            reason: format!("{what}: {e}"),
        };
        if !root.is_absolute() {
            return Err(OpenError::BadUrl {
                url: format!("file://{}", root.display()),
                reason: "the bucket directory must be an absolute path".into(),
            });
        }
        fs::create_dir_all(root.join(TMP_DIR)).map_err(|e| unavailable("create directory", e))?;
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join(LOCK_FILE))
            .map_err(|e| unavailable("create lock file", e))?;
        let bucket = FsBucket {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                next_tmp: AtomicU64::new(0),
            }),
        };
        bucket.inner.remove_stale_temp_files();
        Ok(bucket)
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

    async fn put(&self, key: &str, body: Body, cond: PutCondition) -> Result<String, BucketError> {
        check_key("put", key)?;
        let k = key.to_string();
        self.blocking("put", key, move |b| b.put(&k, &body, &cond))
            .await
    }

    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        check_key("delete", key)?;
        let k = key.to_string();
        let if_match = if_match.map(str::to_string);
        self.blocking("delete", key, move |b| b.delete(&k, if_match.as_deref()))
            .await
    }

    async fn list(
        &self,
        prefix: &str,
        token: Option<String>,
        max_keys: usize,
    ) -> Result<ListPage, BucketError> {
        let p = prefix.to_string();
        self.blocking("list", prefix, move |b| {
            b.list(&p, token.as_deref(), max_keys)
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
            return Err(not_found(key));
        };
        let mut data = Vec::with_capacity(crate::units::usize_of(len));
        file.read_to_end(&mut data).map_err(err)?;
        let etag = match cached_etag(&file, data.len() as u64) {
            Some(etag) => etag,
            None => etag_of_digest(Sha256::digest(&data).into()),
        };
        Ok(Object {
            data: Bytes::from(data),
            etag,
        })
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        let err = |e| io_error("get_range", key, e, false);
        let Some((file, len)) = open_object(&self.path(key)).map_err(err)? else {
            return Err(not_found(key));
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
        Ok(Some(ObjectMeta {
            key: key.to_string(),
            len,
            etag,
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

    fn put(&self, key: &str, body: &Body, cond: &PutCondition) -> Result<String, BucketError> {
        if key == LEASE_KEY
            && let (PutCondition::IfMatch(expected), Body::Bytes(bytes)) = (cond, body)
            && let Some(renewed) = self.swap_lease(bytes, expected)
        {
            return renewed;
        }
        let (tmp, etag) = self.write_temp(key, body)?;
        let committed = self.commit(key, &tmp, cond);
        // After a rename the temp name is gone; after a link or a failure it is ours to remove.
        let _ = fs::remove_file(&tmp);
        committed.map(|()| etag)
    }

    /// A compare-and-swap of the lease object by exchange with a scratch file (see the module
    /// docs): `None` where the file system cannot exchange names (then the ordinary path runs).
    fn swap_lease(&self, body: &Bytes, expected: &str) -> Option<Result<String, BucketError>> {
        let key = LEASE_KEY;
        let err = |e| io_error("put", key, e, false);
        let swapped = (|| -> Result<Option<String>, BucketError> {
            let _lock = self.lock("put", key)?;
            if self.current_etag("put", key)?.as_deref() != Some(expected) {
                return Err(precondition_failed(key));
            }
            let scratch = self.root.join(TMP_DIR).join(LEASE_SCRATCH);
            // Overwritten from the start and cut to length, never truncated to nothing first:
            // ext4 flushes a file emptied by a truncate when it is closed, at the cost of a
            // disk write per renewal.
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(&scratch)
                .map_err(err)?;
            file.write_all_at(body, 0).map_err(err)?;
            // Records grow by a digit now and then: a cut is rarely needed.
            if file.metadata().map_err(err)?.len() != body.len() as u64 {
                file.set_len(body.len() as u64).map_err(err)?;
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
        let written = write_file(&tmp, body);
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
                    return Err(precondition_failed(key));
                }
                Err(e) => return Err(err(e)),
            },
            PutCondition::IfMatch(expected) => {
                if self.current_etag("put", key)?.as_deref() != Some(expected.as_str()) {
                    return Err(precondition_failed(key));
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
            return Err(precondition_failed(key));
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
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(LOCK_FILE))
            .map_err(|e| io_error(op, key, e, false))?;
        file.lock().map_err(|e| io_error(op, key, e, false))?;
        Ok(file)
    }

    /// Creates the missing directories above `key`, each made durable in its parent.
    fn create_parents(&self, op: &'static str, key: &str) -> Result<(), BucketError> {
        let mut dir = self.root.clone();
        let segments: Vec<&str> = key.split('/').collect();
        for segment in &segments[..segments.len() - 1] {
            dir.push(segment);
            match fs::create_dir(&dir) {
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

/// Writes `body` to the new file `path`, fsyncs it and caches its ETag; returns the ETag.
fn write_file(path: &Path, body: &Body) -> Result<String, WriteError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(WriteError::Temp)?;
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

/// The ETag of an object file: the cached one, else hashed from its content.
fn etag_of_file(file: &File, len: u64) -> io::Result<String> {
    if let Some(etag) = cached_etag(file, len) {
        return Ok(etag);
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; crate::units::usize_of(CHUNK.min(len))];
    let mut done = 0;
    while done < len {
        let n = crate::units::usize_of(CHUNK.min(len - done));
        file.read_exact_at(&mut buf[..n], done)?;
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(etag_of_digest(hasher.finalize().into()))
}

fn etag_of_digest(digest: [u8; 32]) -> String {
    format!("\"{}\"", hex::encode(&digest[..16]))
}

/// Caches `len:etag` in the file's extended attribute (best effort).
fn cache_etag(file: &File, len: u64, etag: &str) {
    let value = format!("{len}:{etag}");
    // SAFETY: the name is NUL-terminated, the value pointer and length describe `value`.
    unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            ETAG_XATTR.as_ptr().cast(),
            value.as_ptr().cast(),
            value.len(),
            0,
        );
    }
}

/// The cached ETag, if the attribute is there and names this length.
fn cached_etag(file: &File, len: u64) -> Option<String> {
    let mut buf = [0u8; 128];
    // SAFETY: the name is NUL-terminated, the buffer pointer and length describe `buf`.
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            ETAG_XATTR.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let value = std::str::from_utf8(buf.get(..usize::try_from(n).ok()?)?).ok()?;
    let (cached_len, etag) = value.split_once(':')?;
    (cached_len.parse::<u64>().ok()? == len).then(|| etag.to_string())
}

/// Appends to `out`, in key order, the keys under `dir` (whose keys start with `rel`) that
/// start with `prefix` and sort after `after`, until `out` holds `want` keys.
///
/// Entries are visited sorted by name, a directory's name taken with its trailing `/`: every key
/// below directory `d` starts with `d/` and no sibling's key does, so this visits keys in exactly
/// the byte order S3 lists them in, and whole subtrees outside the prefix or before `after` are
/// skipped.
fn walk(
    dir: &Path,
    rel: &str,
    prefix: &str,
    after: Option<&str>,
    want: usize,
    out: &mut Vec<String>,
) -> io::Result<()> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if rel.is_empty() && name.starts_with('.') {
            continue; // the bucket's own files
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            entries.push((format!("{rel}{name}/"), true));
        } else if kind.is_file() {
            entries.push((format!("{rel}{name}"), false));
        }
    }
    entries.sort();
    for (key, is_dir) in entries {
        if is_dir {
            let relevant = key.starts_with(prefix) || prefix.starts_with(&key);
            let passed = after.is_some_and(|a| a > key.as_str() && !a.starts_with(&key));
            if relevant && !passed {
                match walk(&dir.join(&key[rel.len()..]), &key, prefix, after, want, out) {
                    // Removed meanwhile by a delete: it holds no keys.
                    Err(e) if is_absent(&e) => {}
                    other => other?,
                }
            }
        } else if key.starts_with(prefix) && after.is_none_or(|a| key.as_str() > a) {
            out.push(key);
        }
        if out.len() >= want {
            return Ok(());
        }
    }
    Ok(())
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

fn not_found(key: &str) -> BucketError {
    BucketError::NotFound {
        key: key.to_string(),
    }
}

fn precondition_failed(key: &str) -> BucketError {
    BucketError::PreconditionFailed {
        key: key.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_keys_are_refused() {
        for key in [
            "", "/abs", ".lock", ".tmp/x", "a//b", "a/", "a/./b", "a/../b", "..", "a\0b",
        ] {
            assert!(
                matches!(check_key("put", key), Err(BucketError::Permanent { .. })),
                "{key:?} was accepted"
            );
        }
        for key in [
            "a",
            "a/b.c",
            "gen/0000000001/side/store.meta.0badf00d",
            "a/.b",
        ] {
            assert!(check_key("put", key).is_ok(), "{key:?} was refused");
        }
    }

    #[test]
    fn walk_visits_keys_in_byte_order() {
        let dir = tempfile::tempdir().unwrap();
        let keys = ["a-b", "a/b", "a/c/d", "a0", "b", "ab/x"];
        for key in keys {
            let path = dir.path().join(key);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, key).unwrap();
        }
        let mut sorted = keys.to_vec();
        sorted.sort();
        let mut out = Vec::new();
        walk(dir.path(), "", "", None, 100, &mut out).unwrap();
        assert_eq!(out, sorted);
        out.clear();
        walk(dir.path(), "", "a", Some("a/b"), 100, &mut out).unwrap();
        assert_eq!(out, ["a/c/d", "a0", "ab/x"]);
    }

    #[tokio::test]
    async fn create_cas_delete_smoke() {
        use crate::bucket::Bucket;
        let dir = tempfile::tempdir().unwrap();
        let b = FsBucket::open(dir.path()).unwrap();
        let body = |s: &'static str| Body::from(Bytes::from_static(s.as_bytes()));
        let e1 = b
            .put("x/y", body("one"), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        let again = b.put("x/y", body("two"), PutCondition::IfNoneMatch).await;
        assert!(matches!(again, Err(BucketError::PreconditionFailed { .. })));
        let e2 = b
            .put("x/y", body("two"), PutCondition::IfMatch(e1.clone()))
            .await
            .unwrap();
        let stale = b.put("x/y", body("three"), PutCondition::IfMatch(e1)).await;
        assert!(matches!(stale, Err(BucketError::PreconditionFailed { .. })));
        assert_eq!(b.get("x/y").await.unwrap().etag, e2);
        b.delete("x/y", Some(&e2)).await.unwrap();
        assert!(b.head("x/y").await.unwrap().is_none());
        assert!(
            !dir.path().join("x").exists(),
            "the emptied directory was left"
        );
        assert_eq!(fs::read_dir(dir.path().join(TMP_DIR)).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn the_lease_is_renewed_by_exchange_with_no_inode_churn() {
        use crate::bucket::Bucket;
        use std::os::unix::fs::MetadataExt;
        assert_eq!(LEASE_KEY, crate::manifest::LEASE_KEY);
        let dir = tempfile::tempdir().unwrap();
        let b = FsBucket::open(dir.path()).unwrap();
        let record = |n: u32| Body::from(Bytes::from(format!("{{\"renewals\":{n}}}")));
        let mut etag = b
            .put(LEASE_KEY, record(0), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        let mut inodes = std::collections::BTreeSet::new();
        for n in 1..=20u32 {
            let next = b
                .put(LEASE_KEY, record(n), PutCondition::IfMatch(etag.clone()))
                .await
                .unwrap();
            assert_ne!(next, etag);
            let got = b.get(LEASE_KEY).await.unwrap();
            assert_eq!(got.data, format!("{{\"renewals\":{n}}}").as_bytes());
            assert_eq!(
                got.etag, next,
                "the ETag is the content's, as on every other path"
            );
            let meta = b.head(LEASE_KEY).await.unwrap().unwrap();
            assert_eq!(
                (meta.len, meta.etag.as_str()),
                (got.data.len() as u64, next.as_str())
            );
            // A stale ETag is refused and changes nothing.
            let stale = b
                .put(LEASE_KEY, record(99), PutCondition::IfMatch(etag))
                .await;
            assert!(matches!(stale, Err(BucketError::PreconditionFailed { .. })));
            assert_eq!(b.get(LEASE_KEY).await.unwrap().etag, next);
            inodes.insert(fs::metadata(dir.path().join(LEASE_KEY)).unwrap().ino());
            etag = next;
        }
        assert!(inodes.len() <= 2, "two inodes take turns: {inodes:?}");
        // The scratch is the bucket's own file: never listed, never an object.
        let listed = b.list("", None, 100).await.unwrap();
        let keys: Vec<_> = listed.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, [LEASE_KEY]);
        b.delete(LEASE_KEY, Some(&etag)).await.unwrap();
        assert!(b.head(LEASE_KEY).await.unwrap().is_none());
    }
}
