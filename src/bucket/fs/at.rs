//! How a local-directory bucket reaches what lies below its root: from the root's descriptor,
//! one directory at a time, never through a link (see the module docs of [`super`], "Links").
//! The lock file and the temp directory are reached the same way.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{BucketError, Inner, LOCK_FILE, STALE_TMP_AGE, TMP_DIR, io_error, prefix_conflict};
use crate::nofollow::{AtError, describe, open_dir_at, open_regular_at};

/// The directories holding a key, each opened from the one above it without following a link
/// (the root's descriptor above the first), and the key's last segment.
pub(super) struct Parent {
    /// The root, as this request opened it ([`Inner::root_dir`]).
    pub root: OwnedFd,
    pub chain: Vec<OwnedFd>,
    pub name: String,
}

impl Parent {
    /// The directory holding the key's file.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.chain.last().unwrap_or(&self.root).as_fd()
    }
}

/// A temp file under [`TMP_DIR`]: that directory, as opened, and the file's name in it.
pub(super) struct Temp {
    pub dir: OwnedFd,
    pub name: String,
}

impl Inner {
    /// The root, opened for one request (following the links of its own path, which the
    /// operator names) and checked to be the very directory the bucket opened (device and
    /// inode): a root replaced or moved since fails the request, naming it, and nothing is
    /// written elsewhere. Opened per request rather than held, so an idle bucket holds no
    /// descriptor (a service hosting 10,000 stores would otherwise hold 10,000 more).
    pub(super) fn root_dir(&self, op: &'static str, key: &str) -> Result<OwnedFd, BucketError> {
        let dir = open_root(&self.root, self.root_link).map_err(|e| io_error(op, key, e, false))?;
        if identity(&dir).map_err(|e| io_error(op, key, e, false))? != self.id {
            return Err(BucketError::Permanent {
                op,
                key: key.to_string(),
                message: format!(
                    "bad bucket: {} is no longer the directory this bucket opened (replaced or \
                     moved since); reopen the bucket",
                    self.root.display()
                ),
            });
        }
        Ok(dir)
    }

    /// The error for `t` standing at `rel` below the root, where only directories and regular
    /// files may (see the module docs, "Links").
    pub(super) fn bad_bucket(
        &self,
        op: &'static str,
        key: &str,
        rel: &str,
        t: FileType,
    ) -> BucketError {
        BucketError::Permanent {
            op,
            key: key.to_string(),
            message: format!(
                "bad bucket: {} is {}; below its root a local-directory bucket holds only \
                 directories and regular files, and follows no link",
                self.root.join(rel).display(),
                describe(t)
            ),
        }
    }

    /// Maps a failure to open `rel` (below the root) for a request on `key`.
    pub(super) fn at_error(
        &self,
        op: &'static str,
        key: &str,
        rel: &str,
        e: AtError,
    ) -> BucketError {
        match e {
            AtError::Refused(t) => self.bad_bucket(op, key, rel, t),
            AtError::Io(e) => io_error(op, key, e.into(), false),
        }
    }

    /// The directories holding `key` ([`Parent`]). Without `create`, `None` when one of them
    /// is missing (or is a file: no key lies below a file); with `create` never `None`: the
    /// missing ones are made, each made durable in its parent, and a file in the way is a
    /// prefix conflict.
    pub(super) fn parent(
        &self,
        op: &'static str,
        key: &str,
        create: bool,
    ) -> Result<Option<Parent>, BucketError> {
        let (dirs, name) = key
            .rsplit_once('/')
            .map_or((None, key), |(d, n)| (Some(d), n));
        let root = self.root_dir(op, key)?;
        let mut chain: Vec<OwnedFd> = Vec::new();
        let mut walked = 0;
        for segment in dirs.into_iter().flat_map(|d| d.split('/')) {
            walked += segment.len() + usize::from(walked > 0);
            let here = chain.last().unwrap_or(&root).as_fd();
            let opened = match open_dir_at(here, segment) {
                Ok(None) if create => self.modes.create_dir_at(here, segment),
                other => other,
            };
            match opened {
                Ok(Some(fd)) => chain.push(fd),
                Ok(None) | Err(AtError::Refused(FileType::RegularFile)) if !create => {
                    return Ok(None);
                }
                Ok(None) => {
                    let e = io::Error::new(io::ErrorKind::NotFound, "removed as it was made");
                    return Err(io_error(op, key, e, false));
                }
                Err(AtError::Refused(FileType::RegularFile)) => {
                    return Err(prefix_conflict(op, key));
                }
                Err(e) => return Err(self.at_error(op, key, &key[..walked], e)),
            }
        }
        Ok(Some(Parent {
            root,
            chain,
            name: name.to_string(),
        }))
    }

    /// The temp directory, opened (not followed).
    pub(super) fn tmp_dir(&self, op: &'static str, key: &str) -> Result<OwnedFd, BucketError> {
        match open_dir_at(&self.root_dir(op, key)?, TMP_DIR) {
            Ok(Some(dir)) => Ok(dir),
            Ok(None) => {
                let e = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} is missing", self.root.join(TMP_DIR).display()),
                );
                Err(io_error(op, key, e, false))
            }
            Err(e) => Err(self.at_error(op, key, TMP_DIR, e)),
        }
    }

    /// Takes the bucket-wide lock; it is released when the returned file is dropped.
    pub(super) fn lock(&self, op: &'static str, key: &str) -> Result<File, BucketError> {
        let file = self.open_lock_file(op, key)?;
        file.lock().map_err(|e| io_error(op, key, e, false))?;
        Ok(file)
    }

    /// Opens the lock file (not followed), creating it (with the file mode) if it is not there.
    pub(super) fn open_lock_file(&self, op: &'static str, key: &str) -> Result<File, BucketError> {
        let flags = OFlags::WRONLY | OFlags::APPEND;
        let root = self.root_dir(op, key)?;
        let open = || {
            open_regular_at(&root, LOCK_FILE, flags)
                .map_err(|e| self.at_error(op, key, LOCK_FILE, e))
        };
        if let Some(file) = open()? {
            return Ok(file);
        }
        match rustix::fs::openat(
            &root,
            LOCK_FILE,
            flags | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(self.modes.file),
        ) {
            Ok(fd) => {
                let file = File::from(fd);
                self.modes
                    .set_file(&file)
                    .map_err(|e| io_error(op, key, e, false))?;
                Ok(file)
            }
            // Created meanwhile by another process.
            Err(Errno::EXIST) => open()?.ok_or_else(|| {
                let e = io::Error::new(io::ErrorKind::NotFound, "the lock file was removed");
                io_error(op, key, e, false)
            }),
            Err(e) => Err(io_error(op, key, e.into(), false)),
        }
    }

    /// Removes the directories above `key` (opened as `parent`) that the delete left empty
    /// (best effort).
    pub(super) fn remove_empty_parents(&self, key: &str, parent: Parent) {
        let Parent {
            root, mut chain, ..
        } = parent;
        let segments: Vec<&str> = key.split('/').collect();
        while let Some(emptied) = chain.pop() {
            drop(emptied);
            let above = chain.last().unwrap_or(&root);
            let name = segments[chain.len()];
            if rustix::fs::unlinkat(above, name, AtFlags::REMOVEDIR).is_err() {
                return;
            }
        }
    }

    pub(super) fn remove_stale_temp_files(&self) {
        let Ok(root) = self.root_dir("open", "") else {
            return;
        };
        let Ok(Some(tmp)) = open_dir_at(&root, TMP_DIR) else {
            return;
        };
        let Ok(entries) = rustix::fs::Dir::read_from(&tmp) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            let stale = rustix::fs::statat(&tmp, name, AtFlags::SYMLINK_NOFOLLOW)
                .ok()
                .filter(|st| FileType::from_raw_mode(st.st_mode) != FileType::Directory)
                .and_then(|st| u64::try_from(st.st_mtime).ok())
                .map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP_AGE);
            if stale {
                let path = self.root.join(TMP_DIR).join(name);
                match rustix::fs::unlinkat(&tmp, name, AtFlags::empty()) {
                    Ok(()) => tracing::info!(path = %path.display(), "removed a stale temp file"),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "cannot remove a stale temp file: {e}")
                    }
                }
            }
        }
    }
}

/// What names a directory for as long as it exists: its device and inode.
pub(super) fn identity(dir: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(dir)?;
    Ok((st.st_dev, st.st_ino))
}

/// Opens the bucket's root directory, following the links of its own path: the operator
/// names it (see the module docs, "Links"); with [`RootLink::Refuse`], not its last component
/// (`O_NOFOLLOW`: a link there is [`root_is_a_link`]).
pub(super) fn open_root(root: &Path, link: RootLink) -> io::Result<OwnedFd> {
    let mut flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    if link == RootLink::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    match rustix::fs::open(root, flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        // `O_NOFOLLOW` with `O_DIRECTORY` answers a link `ENOTDIR` (or `ELOOP`): say what it is.
        Err(e) => {
            check_root_link(root, link)?;
            Err(e.into())
        }
    }
}

/// Whether a bucket's root may itself be a symbolic link (the last component of its path).
///
/// A root the service places itself (a lease root, `<parent>/.mushroom-backup`) is opened
/// with [`RootLink::Refuse`]: whoever can write the parent could otherwise plant a link there
/// and have the bucket's files created where it points. Its last component is checked not to
/// be a link before anything is created ([`check_root_link`]), and opened with `O_NOFOLLOW` at
/// the open and at every request, so a link planted at any time fails the open or the
/// request, naming the root; nothing is created, read or written through it. A dangling link
/// is refused too, never taken for a missing root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootLink {
    /// Followed: a destination the operator names.
    Follow,
    /// Refused, naming it.
    Refuse,
}

/// With [`RootLink::Refuse`], refuses a root that is a link now (before `create_dir_all`,
/// which would follow it).
pub(super) fn check_root_link(root: &Path, link: RootLink) -> io::Result<()> {
    match std::fs::symlink_metadata(root) {
        Ok(m) if link == RootLink::Refuse && m.file_type().is_symlink() => {
            Err(root_is_a_link(root))
        }
        _ => Ok(()),
    }
}

/// The error for a root that is a link where [`RootLink::Refuse`] holds, naming it.
pub(super) fn root_is_a_link(root: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is a symbolic link: this directory is never followed through a link (remove the \
         link)",
        root.display()
    ))
}
