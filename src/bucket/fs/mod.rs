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
//! Both open the root once and keep its descriptor: a root renamed or replaced later is not
//! followed to its new place (the bucket goes on with the directory it opened).
//!
//! # Links
//! The root's own path may pass through symbolic links (the operator names it, and the service
//! places it, links resolved: `--allow-destination-root`), but not its last component where
//! the bucket is opened with [`RootLink::Refuse`] (a lease root; see there). Below the root, nothing is ever
//! reached through a link, so whoever can write inside the bucket directory cannot make a
//! write, read or delete land outside it: every request walks from the root's descriptor one
//! directory at a time with `openat` and `O_NOFOLLOW` ([`crate::nofollow`], the walk the store
//! directory uses), and opens, creates, links, renames and unlinks its file relative to the
//! directory so reached; the temp directory and the lock file are reached the same way. A
//! link (or a FIFO, socket or device) where a request meets it — a directory of the key, the
//! object itself, `.tmp/`, `.lock`, a scratch file — fails that request with a `Permanent`
//! "bad bucket: PATH is a symbolic link; …" naming it, and nothing is written, read or deleted
//! through it. A listing refuses the same way, naming the first such entry that would be
//! listed or that a listed key could lie below: it neither descends into it nor skips it, so
//! a listing never silently misses what a link hides (entries outside the prefix are not
//! looked at). Nothing is ever removed or repaired: the operator removes the link.
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
//! empty, `.` or `..` segments are refused as `Permanent`. Names that are not UTF-8 are not
//! listed; links and other special files are refused (see "Links").

mod bucket;
mod write;

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};
use write::*;

use bytes::Bytes;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};

use super::body::check_crc32;
use super::{
    Body, BucketError, ListPage, ListQuery, Object, ObjectMeta, OpenError, PutCondition, PutHint,
    PutOpts,
};
use crate::nofollow::{AtError, kind_at, open_dir_at, open_regular_at};
pub use at::RootLink;
use at::{Temp, open_root};
use etag::{cache_etag, cached_etag, etag_of_digest, etag_of_file};
pub(crate) use key::check_key;
use key::scratch_name;
pub use mode::{FILE_MODE_ENV, FileModes};
use walk::walk;

mod at;
mod etag;
mod key;
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
    /// The root as the operator named it (for messages).
    root: PathBuf,
    /// The root's device and inode as opened: each request opens the root anew and reaches
    /// everything below from that descriptor, refusing a root that is no longer this directory
    /// ([`Inner::root_dir`]).
    id: (u64, u64),
    /// Makes temp file names unique within this process (the pid makes them unique across).
    next_tmp: AtomicU64,
    /// What files and directories this bucket creates are given.
    modes: FileModes,
    /// Whether the root's path may end in a link (every request reopens it so).
    root_link: RootLink,
}

impl FsBucket {
    /// Opens (creating it if needed) the directory `root` as a bucket, with the modes of
    /// [`FILE_MODE_ENV`], and removes temp files that crashed writers left behind more than
    /// [`STALE_TMP_AGE`] ago.
    pub fn open(root: &Path) -> Result<FsBucket, OpenError> {
        Self::open_as(root, false, RootLink::Follow)
    }

    /// [`FsBucket::open`], or [`FsBucket::open_existing`] if `existing`, per [`RootLink`].
    pub fn open_as(root: &Path, existing: bool, link: RootLink) -> Result<FsBucket, OpenError> {
        if existing {
            return Self::open_existing_rooted(root, link);
        }
        let modes = FileModes::from_env().map_err(|reason| OpenError::Unavailable {
            url: format!("file://{}", root.display()),
            reason,
        })?;
        Self::open_rooted(root, modes, link)
    }

    /// [`FsBucket::open`] with the given modes.
    pub fn open_with(root: &Path, modes: FileModes) -> Result<FsBucket, OpenError> {
        Self::open_rooted(root, modes, RootLink::Follow)
    }

    fn open_rooted(root: &Path, modes: FileModes, link: RootLink) -> Result<FsBucket, OpenError> {
        let url = format!("file://{}", root.display());
        let unavailable = |what: &str, e: io::Error| OpenError::Unavailable {
            url: url.clone(),
            reason: format!("{what}: {e}"),
        };
        check_absolute(root)?;
        at::check_root_link(root, link).map_err(|e| unavailable("open directory", e))?;
        modes
            .create_dir_all(root)
            .map_err(|e| unavailable("create directory", e))?;
        let dir = open_root(root, link).map_err(|e| unavailable("open directory", e))?;
        let bucket =
            FsBucket::at(root, &dir, modes, link).map_err(|e| unavailable("open directory", e))?;
        let refused = |e: BucketError| OpenError::Unavailable {
            url: url.clone(),
            reason: match e {
                BucketError::Permanent { message, .. } | BucketError::Transient { message, .. } => {
                    message
                }
                e => e.to_string(),
            },
        };
        let inner = &bucket.inner;
        match open_dir_at(&dir, TMP_DIR) {
            Ok(Some(_)) => {}
            Ok(None) => {
                modes
                    .create_dir_at(dir.as_fd(), TMP_DIR)
                    .map_err(|e| refused(inner.at_error("open", "", TMP_DIR, e)))?;
            }
            Err(e) => return Err(refused(inner.at_error("open", "", TMP_DIR, e))),
        }
        inner.open_lock_file("open", "").map_err(refused)?;
        inner.remove_stale_temp_files();
        Ok(bucket)
    }

    /// Opens the existing directory `root` to read it, creating and removing nothing: no
    /// directory, no `.lock`, no `.tmp/`. A missing directory is [`OpenError::Missing`].
    /// Writes through it would fail (there is no `.tmp/`) or create a `.lock`: read-only
    /// callers take it behind [`super::read_only::ReadOnly`], as [`super::open_read_only`]
    /// does.
    pub fn open_existing(root: &Path) -> Result<FsBucket, OpenError> {
        Self::open_existing_rooted(root, RootLink::Follow)
    }

    fn open_existing_rooted(root: &Path, link: RootLink) -> Result<FsBucket, OpenError> {
        check_absolute(root)?;
        let url = format!("file://{}", root.display());
        let unavailable = |e: io::Error| OpenError::Unavailable {
            url: url.clone(),
            reason: e.to_string(),
        };
        match at::check_root_link(root, link).and_then(|()| fs::metadata(root)) {
            Ok(meta) if meta.is_dir() => {
                let dir = open_root(root, link).map_err(unavailable)?;
                FsBucket::at(root, &dir, FileModes::default(), link).map_err(unavailable)
            }
            Ok(_) => Err(OpenError::Unavailable {
                url,
                reason: "not a directory".into(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(OpenError::Missing { what: url }),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn at(root: &Path, dir: &OwnedFd, modes: FileModes, link: RootLink) -> io::Result<FsBucket> {
        Ok(FsBucket {
            inner: Arc::new(Inner {
                root: root.to_path_buf(),
                id: at::identity(dir)?,
                next_tmp: AtomicU64::new(0),
                modes,
                root_link: link,
            }),
        })
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

impl Inner {
    /// Opens the object `name` in `dir` (the key `key`): `None` when there is none (or only a
    /// directory prefix of other keys).
    fn object_in(
        &self,
        op: &'static str,
        key: &str,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<Option<(File, u64)>, BucketError> {
        match open_regular_at(dir, name, OFlags::RDONLY) {
            Ok(Some(file)) => {
                let len = file
                    .metadata()
                    .map_err(|e| io_error(op, key, e, false))?
                    .len();
                Ok(Some((file, len)))
            }
            Ok(None) | Err(AtError::Refused(FileType::Directory)) => Ok(None),
            Err(e) => Err(self.at_error(op, key, key, e)),
        }
    }

    /// Opens the object `key`: `None` when there is none.
    fn open_object(&self, op: &'static str, key: &str) -> Result<Option<(File, u64)>, BucketError> {
        match self.parent(op, key, false)? {
            Some(p) => self.object_in(op, key, p.dir(), &p.name),
            None => Ok(None),
        }
    }

    fn get(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        let err = |e| io_error("get", key, e, false);
        let Some((file, len)) = self.open_object("get", key)? else {
            return Err(BucketError::not_found(key));
        };
        if len > at_most {
            return Err(BucketError::too_large("get", key, len, at_most));
        }
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
        // Never past `at_most`, should the file grow after the look at its length.
        let mut data = Vec::with_capacity(crate::units::usize_of(len));
        (&file)
            .take(at_most + 1)
            .read_to_end(&mut data)
            .map_err(err)?;
        if data.len() as u64 > at_most {
            return Err(BucketError::too_large(
                "get",
                key,
                data.len() as u64,
                at_most,
            ));
        }
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
        let Some((file, len)) = self.open_object("get_range", key)? else {
            return Err(BucketError::not_found(key));
        };
        let (start, end) = (range.start.min(len), range.end.min(len));
        if start >= end {
            return Ok(Bytes::new());
        }
        let mut buf = vec![0u8; crate::units::usize_of(end - start)];
        file.read_exact_at(&mut buf, start)
            .map_err(|e| io_error("get_range", key, e, false))?;
        Ok(Bytes::from(buf))
    }

    fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        let Some((file, len)) = self.open_object("head", key)? else {
            return Ok(None);
        };
        let etag = etag_of_file(&file, len).map_err(|e| io_error("head", key, e, false))?;
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
            lock: None,
        }))
    }

    /// The current ETag of the object `name` in `dir` (the key `key`), or `None` when there
    /// is no such object.
    fn etag_in(
        &self,
        op: &'static str,
        key: &str,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<Option<String>, BucketError> {
        match self.object_in(op, key, dir, name)? {
            Some((file, len)) => Ok(Some(
                etag_of_file(&file, len).map_err(|e| io_error(op, key, e, false))?,
            )),
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
        let _ = rustix::fs::unlinkat(&tmp.dir, tmp.name.as_str(), AtFlags::empty());
        committed.map(|()| etag)
    }

    /// A compare-and-swap of a frequently rewritten object by exchange with its scratch file
    /// (see the module docs): `None` where the file system cannot exchange names, or the key
    /// is too long for a scratch name (then the ordinary path runs).
    fn swap(&self, key: &str, body: &Bytes, expected: &str) -> Option<Result<String, BucketError>> {
        let scratch = scratch_name(key)?;
        let err = |e: io::Error| io_error("put", key, e, false);
        let swapped = (|| -> Result<Option<String>, BucketError> {
            let _lock = self.lock("put", key)?;
            let Some(parent) = self.parent("put", key, false)? else {
                return Err(BucketError::precondition_failed(key));
            };
            let dir = parent.dir();
            if self.etag_in("put", key, dir, &parent.name)?.as_deref() != Some(expected) {
                return Err(BucketError::precondition_failed(key));
            }
            let tmp = self.tmp_dir("put", key)?;
            let scratch_rel = format!("{TMP_DIR}/{scratch}");
            // Overwritten from the start and cut to length, never truncated to nothing first:
            // ext4 flushes a file emptied by a truncate when it is closed, at the cost of a
            // disk write per renewal.
            let file = match rustix::fs::openat(
                &tmp,
                scratch.as_str(),
                OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(self.modes.file),
            ) {
                Ok(fd) => File::from(fd),
                Err(Errno::LOOP) => {
                    return Err(self.bad_bucket("put", key, &scratch_rel, FileType::Symlink));
                }
                Err(e) => return Err(err(e.into())),
            };
            let meta = file.metadata().map_err(err)?;
            if !meta.is_file() {
                let t = FileType::from_raw_mode(meta.permissions().mode());
                return Err(self.bad_bucket("put", key, &scratch_rel, t));
            }
            file.write_all_at(body, 0).map_err(err)?;
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
            match rustix::fs::renameat_with(
                &tmp,
                scratch.as_str(),
                dir,
                parent.name.as_str(),
                RenameFlags::EXCHANGE,
            ) {
                Ok(()) => Ok(Some(etag)),
                // No exchange here (NFS, say), or the scratch file was cleaned up meanwhile.
                Err(Errno::INVAL | Errno::NOSYS | Errno::NOENT) => Ok(None),
                Err(e) => Err(err(e.into())),
            }
        })();
        swapped.transpose()
    }

    /// Writes `body` to a new, fsynced temp file; returns it and the content's ETag.
    fn write_temp(&self, key: &str, body: &Body) -> Result<(Temp, String), BucketError> {
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = Temp {
            dir: self.tmp_dir("put", key)?,
            name: format!("{}-{n}-{nanos:09}.tmp", std::process::id()),
        };
        match write_file(&tmp, body, &self.modes) {
            Ok(etag) => Ok((tmp, etag)),
            Err(e) => {
                let _ = rustix::fs::unlinkat(&tmp.dir, tmp.name.as_str(), AtFlags::empty());
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
    fn commit(&self, key: &str, tmp: &Temp, cond: &PutCondition) -> Result<(), BucketError> {
        let _lock = self.lock("put", key)?;
        let err = |e: Errno| io_error("put", key, e.into(), false);
        let Some(parent) = self.parent("put", key, true)? else {
            return Err(err(Errno::NOENT)); // never: `create` makes every directory
        };
        let (dir, name) = (parent.dir(), parent.name.as_str());
        match kind_at(dir, name).map_err(err)? {
            None | Some(FileType::RegularFile) => {}
            Some(FileType::Directory) => return Err(prefix_conflict("put", key)),
            Some(t) => return Err(self.bad_bucket("put", key, key, t)),
        }
        let from = (&tmp.dir, tmp.name.as_str());
        match cond {
            PutCondition::IfNoneMatch => {
                match rustix::fs::linkat(from.0, from.1, dir, name, AtFlags::empty()) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => return Err(BucketError::precondition_failed(key)),
                    Err(e) => return Err(err(e)),
                }
            }
            PutCondition::IfMatch(expected) => {
                if self.etag_in("put", key, dir, name)?.as_deref() != Some(expected.as_str()) {
                    return Err(BucketError::precondition_failed(key));
                }
                rustix::fs::renameat(from.0, from.1, dir, name).map_err(err)?;
            }
            PutCondition::None => rustix::fs::renameat(from.0, from.1, dir, name).map_err(err)?,
        }
        // The object is visible now; only its durability is in question.
        rustix::fs::fsync(dir).map_err(|e| io_error("put", key, e.into(), true))
    }

    fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        let _lock = self.lock("delete", key)?;
        let parent = self.parent("delete", key, false)?;
        if let Some(expected) = if_match {
            let current = match &parent {
                Some(p) => self.etag_in("delete", key, p.dir(), &p.name)?,
                None => None,
            };
            if current.as_deref() != Some(expected) {
                return Err(BucketError::precondition_failed(key));
            }
        }
        let Some(parent) = parent else {
            return Ok(());
        };
        let err = |e: Errno, indeterminate| io_error("delete", key, e.into(), indeterminate);
        let (dir, name) = (parent.dir(), parent.name.as_str());
        match kind_at(dir, name).map_err(|e| err(e, false))? {
            Some(FileType::RegularFile) => {}
            // No such object (or only a directory prefix of other keys): deleting is a no-op.
            None | Some(FileType::Directory) => return Ok(()),
            Some(t) => return Err(self.bad_bucket("delete", key, key, t)),
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOENT | Errno::ISDIR) => return Ok(()),
            Err(e) => return Err(err(e, false)),
        }
        rustix::fs::fsync(dir).map_err(|e| err(e, true))?;
        self.remove_empty_parents(key, parent);
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
        let root = self.root_dir("list", prefix)?;
        walk(
            self,
            root.as_fd(),
            "",
            prefix,
            after,
            max_keys + 1,
            &mut found,
        )?;
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
