//! [`StoreDir`]: a store directory as the backup side opens it — once, and never through a link
//! it has not checked — and every file in it as the backup side reads it.
//!
//! The store directory is written by another process (the database node), which the service
//! trusts with the store's *content* but not with where the service's reads go: a link in the
//! directory must not make the service read (and so upload) a file the node could not, a FIFO
//! must not wedge a thread, and a huge file must not exhaust memory. So:
//!
//! - **The directory is opened once.** The first look opens it (`O_DIRECTORY`, the final
//!   component not followed), after its path — resolved, links and all — was found strictly
//!   inside one of the allowed roots, when the caller gave roots ([`StoreDir::confined`], the
//!   service). Every file is then opened relative to that descriptor (`openat`), so a directory
//!   renamed away or replaced by a link is never read through its path again.
//! - **The path is re-checked at every look** ([`StoreDir::check`], from
//!   [`super::disk::DiskState::look_in`], every read of the WAL source, and before the one
//!   write): it must still resolve inside a root and name the directory that was opened (same
//!   device and inode). Otherwise the check fails with a [`DirError`] that names the path and
//!   the root ("… now resolves to …, outside every allowed root", "… was replaced"), and the
//!   caller reads and writes nothing there. Every upload of store data follows such a look
//!   made after the data was read, so at worst data read from the opened directory in the
//!   moment before it left its root is not uploaded. Without roots ([`StoreDir::new`], the
//!   standalone `backup` command and tests) only the "same directory" part is checked.
//! - **Files are regular, not followed, and capped.** Every file is opened with `O_NOFOLLOW`
//!   and `O_NONBLOCK` (so opening a FIFO does not block), after an `lstat`-like look at its
//!   type, and checked with `fstat` once open: anything but a regular file (a link, FIFO,
//!   socket, device or directory) is refused, naming the file and what it is, and a device is
//!   never opened at all. Small files are read whole only below a cap ([`SIDE_FILE_CAP`] for
//!   side files, [`RECORD_CAP`] for `wal.position`, `backup.lineage`, `backup.parent`),
//!   through `take(cap + 1)`, so a file that lies about its size cannot exhaust memory either.
//! - **The one write** (`backup.lineage`, [`StoreDir::write_durably`]) goes to a temp name
//!   created afresh (`O_EXCL`, not followed), is fsynced, renamed into place relative to the
//!   descriptor and the directory fsynced: a crash leaves the old file or the whole new one, and
//!   at worst a stale temp file, which the next write replaces.
//!
//! What a crash leaves: nothing but what [`StoreDir::write_durably`] says.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::nofollow::{AtError, describe, open_dir_at, open_regular_at};

/// The largest side file (`store.meta`, `backup.lineage` as shipped) read into memory.
pub const SIDE_FILE_CAP: u64 = 16 << 20;
/// The largest small record read (`wal.position`, `backup.lineage`, `backup.parent`).
pub const RECORD_CAP: u64 = 64 << 10;

/// Why the store directory, or a file in it, was not read or written.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "store directory {path} now resolves to {resolved}, outside every allowed root ({roots}); \
         nothing is read or written there"
    )]
    OutsideRoots {
        path: PathBuf,
        resolved: PathBuf,
        roots: String,
    },
    #[error(
        "store directory {path} was replaced{now}: it is no longer the directory the worker \
         opened{under}; nothing is read or written there until {remedy}"
    )]
    Replaced {
        path: PathBuf,
        /// What the path names now, for the message.
        now: String,
        /// " under ROOTS" when confined.
        under: String,
        /// What makes the worker take the new directory.
        remedy: &'static str,
    },
    #[error("{path} is {what}; {rule}")]
    NotRegular {
        path: PathBuf,
        what: &'static str,
        /// "side files must be regular files", …
        rule: &'static str,
    },
    #[error("{path} is {len} bytes, over the limit of {cap} bytes for {kind}; it is not read")]
    TooLarge {
        path: PathBuf,
        len: u64,
        cap: u64,
        kind: &'static str,
    },
}

impl DirError {
    /// Whether this is a refusal (the directory or a file is not to be trusted), not an I/O
    /// error: it stays until someone fixes the store directory.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, DirError::Io { .. })
    }
}

/// Which rule a file is held to, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `store.meta`, `backup.lineage` as shipped.
    Side,
    /// Everything else the backup side reads.
    Store,
}

impl FileKind {
    fn words(self) -> &'static str {
        match self {
            FileKind::Side => "side files",
            FileKind::Store => "the store's files",
        }
    }

    fn rule(self) -> &'static str {
        match self {
            FileKind::Side => "side files must be regular files",
            FileKind::Store => "the store's files must be regular files",
        }
    }
}

/// A regular file's metadata, as an `lstat` saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    pub len: u64,
    pub ino: u64,
    pub mtime_ns: i128,
}

impl FileStat {
    fn of(st: &rustix::fs::Stat) -> FileStat {
        FileStat {
            len: u64::try_from(st.st_size).unwrap_or(0),
            ino: st.st_ino,
            mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
        }
    }
}

/// The directory as opened.
struct Opened {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

struct Inner {
    path: PathBuf,
    /// `Some` in the service: the resolved path must lie strictly under one of these.
    roots: Option<Vec<PathBuf>>,
    opened: Mutex<Option<Arc<Opened>>>,
}

/// A store directory; see the module docs. Clones share the one opened descriptor.
#[derive(Clone)]
pub struct StoreDir {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StoreDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreDir")
            .field("path", &self.inner.path)
            .field("roots", &self.inner.roots)
            .finish()
    }
}

impl From<PathBuf> for StoreDir {
    fn from(p: PathBuf) -> Self {
        StoreDir::new(p)
    }
}
impl From<&Path> for StoreDir {
    fn from(p: &Path) -> Self {
        StoreDir::new(p)
    }
}
impl From<&PathBuf> for StoreDir {
    fn from(p: &PathBuf) -> Self {
        StoreDir::new(p)
    }
}

fn io_at(path: &Path) -> impl FnOnce(Errno) -> DirError + '_ {
    move |e| DirError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

impl StoreDir {
    /// A store directory with no allowed roots: only "is it still the directory opened" is
    /// checked. Opens nothing yet.
    pub fn new(path: impl Into<PathBuf>) -> StoreDir {
        StoreDir::with_roots(path.into(), None)
    }

    /// A store directory that must stay strictly inside one of `roots` (each resolved here
    /// if it can be).
    pub fn confined(path: impl Into<PathBuf>, roots: Vec<PathBuf>) -> StoreDir {
        let roots = roots
            .into_iter()
            .map(|r| std::fs::canonicalize(&r).unwrap_or(r))
            .collect();
        StoreDir::with_roots(path.into(), Some(roots))
    }

    fn with_roots(path: PathBuf, roots: Option<Vec<PathBuf>>) -> StoreDir {
        StoreDir {
            inner: Arc::new(Inner {
                path,
                roots,
                opened: Mutex::new(None),
            }),
        }
    }

    /// The path as given.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn roots_text(&self) -> String {
        match &self.inner.roots {
            None => "no allowed root".into(),
            Some(r) => r
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    fn in_roots(&self, p: &Path) -> bool {
        self.inner
            .roots
            .as_ref()
            .is_none_or(|roots| roots.iter().any(|r| p != r.as_path() && p.starts_with(r)))
    }

    fn outside(&self, resolved: PathBuf) -> DirError {
        DirError::OutsideRoots {
            path: self.inner.path.clone(),
            resolved,
            roots: self.roots_text(),
        }
    }

    fn replaced(&self, now: String) -> DirError {
        DirError::Replaced {
            path: self.inner.path.clone(),
            now,
            under: match &self.inner.roots {
                None => String::new(),
                Some(_) => format!(" under {}", self.roots_text()),
            },
            remedy: match &self.inner.roots {
                None => "the backup is started again",
                Some(_) => "the store is registered again or the service restarts",
            },
        }
    }

    /// Checks the directory (see the module docs), opening it on the first call that finds
    /// it. `Ok(false)`: there is no directory at the path yet (nothing was opened).
    ///
    /// The path must resolve strictly inside a root and name the opened directory (same
    /// device and inode), and the opened directory itself — where the kernel says it is
    /// (`/proc/self/fd`), which no link can fake — must lie inside a root too. The first open
    /// is of the resolved path with its last component not followed, and is kept only if
    /// those hold after it: a link planted while it was opened is caught.
    pub fn check(&self) -> Result<bool, DirError> {
        let path = &self.inner.path;
        let opened = self.inner.opened.lock().expect("not poisoned").clone();
        let resolved = match std::fs::canonicalize(path) {
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return match opened {
                    None => Ok(false),
                    Some(_) => Err(self.replaced(" (nothing is there now)".into())),
                };
            }
            Err(source) => {
                return Err(DirError::Io {
                    path: path.clone(),
                    source,
                });
            }
        };
        if !self.in_roots(&resolved) {
            return Err(self.outside(resolved));
        }
        let fresh = opened.is_none();
        let o = match opened {
            Some(o) => o,
            None => {
                let fd = match rustix::fs::open(
                    &resolved,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) => return Ok(false),
                    // What the path resolved to is not a directory (or became a link since).
                    Err(Errno::NOTDIR)
                        if resolved
                            .symlink_metadata()
                            .is_ok_and(|m| !m.is_dir() && !m.is_symlink()) =>
                    {
                        return Err(DirError::NotRegular {
                            path: path.clone(),
                            what: "not a directory",
                            rule: "a store directory must be a directory",
                        });
                    }
                    Err(Errno::LOOP | Errno::NOTDIR) => {
                        return Err(self.replaced(" (it changed while it was opened)".into()));
                    }
                    Err(e) => return Err(io_at(path)(e)),
                };
                let st = rustix::fs::fstat(&fd).map_err(io_at(path))?;
                Arc::new(Opened {
                    fd,
                    dev: st.st_dev,
                    ino: st.st_ino,
                })
            }
        };
        let here = match rustix::fs::stat(&resolved) {
            Ok(st) => st,
            Err(Errno::NOENT) if fresh => return Ok(false),
            Err(Errno::NOENT) => return Err(self.replaced(" (nothing is there now)".into())),
            Err(e) => return Err(io_at(path)(e)),
        };
        if (here.st_dev, here.st_ino) != (o.dev, o.ino) {
            return Err(self.replaced(format!(" (it names {} now)", resolved.display())));
        }
        if self.inner.roots.is_some()
            && let Ok(located) = std::fs::read_link(format!("/proc/self/fd/{}", o.fd.as_raw_fd()))
            && !self.in_roots(&located)
        {
            return Err(self.outside(located));
        }
        if fresh {
            let mut slot = self.inner.opened.lock().expect("not poisoned");
            if slot.is_none() {
                *slot = Some(o);
            }
        }
        Ok(true)
    }

    /// The opened directory; opens it (with [`StoreDir::check`]) if it is not yet.
    fn opened(&self) -> Result<Arc<Opened>, DirError> {
        if let Some(o) = self.inner.opened.lock().expect("not poisoned").clone() {
            return Ok(o);
        }
        if !self.check()? {
            return Err(DirError::Io {
                path: self.inner.path.clone(),
                source: std::io::Error::new(ErrorKind::NotFound, "no such directory"),
            });
        }
        Ok(self
            .inner
            .opened
            .lock()
            .expect("not poisoned")
            .clone()
            .expect("opened by the check"))
    }

    /// `rel` (one name, or `archive/<name>`) as a path, for messages.
    pub fn display_path(&self, rel: &str) -> PathBuf {
        self.inner.path.join(rel)
    }

    /// Opens the directory `sub` (one name) of the store directory, not following it; `None`
    /// when absent.
    fn open_subdir(&self, o: &Opened, sub: &str) -> Result<Option<OwnedFd>, DirError> {
        let path = self.display_path(sub);
        open_dir_at(&o.fd, sub).map_err(|e| match e {
            AtError::Refused(t) => DirError::NotRegular {
                path,
                what: describe(t),
                rule: "the store's subdirectories must be directories, not links",
            },
            AtError::Io(Errno::LOOP | Errno::NOTDIR) => DirError::NotRegular {
                path,
                what: "not a directory",
                rule: "the store's subdirectories must be directories, not links",
            },
            AtError::Io(e) => io_at(&path)(e),
        })
    }

    /// Splits `rel` into its directory (if any) and its name.
    fn split(rel: &str) -> (Option<&str>, &str) {
        match rel.rsplit_once('/') {
            Some((d, n)) => (Some(d), n),
            None => (None, rel),
        }
    }

    /// Runs `f` with the descriptor of the directory holding `rel`; `None` when that
    /// directory is absent.
    fn in_parent<T>(
        &self,
        rel: &str,
        f: impl FnOnce(std::os::fd::BorrowedFd<'_>, &str) -> Result<Option<T>, DirError>,
    ) -> Result<Option<T>, DirError> {
        let o = self.opened()?;
        match Self::split(rel) {
            (None, name) => f(o.fd.as_fd(), name),
            (Some(sub), name) => match self.open_subdir(&o, sub)? {
                None => Ok(None),
                Some(d) => f(d.as_fd(), name),
            },
        }
    }

    /// The metadata of the regular file `rel`, not following a link; `None` when absent.
    pub fn stat(&self, rel: &str, kind: FileKind) -> Result<Option<FileStat>, DirError> {
        let path = self.display_path(rel);
        self.in_parent(rel, |dir, name| {
            match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => {
                    regular(&path, FileType::from_raw_mode(st.st_mode), kind)?;
                    Ok(Some(FileStat::of(&st)))
                }
                Err(Errno::NOENT) => Ok(None),
                Err(e) => Err(io_at(&path)(e)),
            }
        })
    }

    /// Opens the regular file `rel` for reading (see the module docs); `None` when absent.
    pub fn open(&self, rel: &str, kind: FileKind) -> Result<Option<File>, DirError> {
        let path = self.display_path(rel);
        self.in_parent(rel, |dir, name| open_regular(dir, name, &path, kind))
    }

    /// Reads the regular file `rel` whole if it is at most `cap` bytes; `None` when absent.
    pub fn read_capped(
        &self,
        rel: &str,
        kind: FileKind,
        cap: u64,
    ) -> Result<Option<Vec<u8>>, DirError> {
        let Some(f) = self.open(rel, kind)? else {
            return Ok(None);
        };
        let path = self.display_path(rel);
        read_capped(f, &path, kind, cap).map(Some)
    }

    /// The entries of the directory `sub` that are regular files, with their metadata, in no
    /// order; `None` when `sub` is absent. An entry that is anything else is refused.
    /// `keep` picks the names wanted (others are not looked at).
    pub fn list(
        &self,
        sub: &str,
        kind: FileKind,
        mut keep: impl FnMut(&str) -> bool,
    ) -> Result<Option<Vec<(String, FileStat)>>, DirError> {
        let o = self.opened()?;
        let Some(d) = self.open_subdir(&o, sub)? else {
            return Ok(None);
        };
        let dir_path = self.display_path(sub);
        let entries = rustix::fs::Dir::read_from(&d).map_err(io_at(&dir_path))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_at(&dir_path))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            let Some(name) = name.to_str() else { continue };
            if name == "." || name == ".." || !keep(name) {
                continue;
            }
            let path = dir_path.join(name);
            match rustix::fs::statat(&d, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => {
                    regular(&path, FileType::from_raw_mode(st.st_mode), kind)?;
                    out.push((name.to_string(), FileStat::of(&st)));
                }
                // Deleted since it was listed.
                Err(Errno::NOENT) => {}
                Err(e) => return Err(io_at(&path)(e)),
            }
        }
        Ok(Some(out))
    }

    /// Appends `data` to the regular file `name` (created `0600` when absent, never through
    /// a link; anything but a regular file is refused), without an fsync: for a cache whose
    /// lines check themselves (`worker::journal`). A file already `max_len` bytes long or
    /// longer is left as it is (`Ok(false)`). Checks the directory first.
    pub fn append(&self, name: &str, data: &[u8], max_len: u64) -> Result<bool, DirError> {
        use std::io::Write;
        self.check()?;
        let o = self.opened()?;
        let path = self.display_path(name);
        let fd = rustix::fs::openat(
            &o.fd,
            name,
            OFlags::WRONLY
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(io_at(&path))?;
        let st = rustix::fs::fstat(&fd).map_err(io_at(&path))?;
        regular(&path, FileType::from_raw_mode(st.st_mode), FileKind::Store)?;
        if u64::try_from(st.st_size).unwrap_or(0) >= max_len {
            return Ok(false);
        }
        let mut f = File::from(fd);
        f.write_all(data).map_err(|source| DirError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(true)
    }

    /// Writes `name` so that a crash leaves either the old file or the whole new one (see
    /// the module docs); checks the directory first.
    pub fn write_durably(&self, name: &str, data: &[u8]) -> Result<(), DirError> {
        use std::io::Write;
        self.check()?;
        let o = self.opened()?;
        let tmp = format!(".{name}.tmp");
        let tmp_path = self.display_path(&tmp);
        match rustix::fs::unlinkat(&o.fd, tmp.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(io_at(&tmp_path)(e)),
        }
        let fd = rustix::fs::openat(
            &o.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(io_at(&tmp_path))?;
        let mut f = File::from(fd);
        let io = |source| DirError::Io {
            path: tmp_path.clone(),
            source,
        };
        f.write_all(data).map_err(io)?;
        f.sync_all().map_err(io)?;
        drop(f);
        rustix::fs::renameat(&o.fd, tmp.as_str(), &o.fd, name)
            .map_err(io_at(&self.display_path(name)))?;
        rustix::fs::fsync(&o.fd).map_err(io_at(&self.inner.path))
    }
}

/// Refuses anything but a regular file.
fn regular(path: &Path, t: FileType, kind: FileKind) -> Result<(), DirError> {
    if t == FileType::RegularFile {
        Ok(())
    } else {
        Err(DirError::NotRegular {
            path: path.to_path_buf(),
            what: describe(t),
            rule: kind.rule(),
        })
    }
}

/// Opens `name` in `dir` with [`open_regular_at`]: never a link, a device is never opened,
/// a FIFO does not block.
fn open_regular(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &str,
    path: &Path,
    kind: FileKind,
) -> Result<Option<File>, DirError> {
    open_regular_at(dir, name, OFlags::RDONLY).map_err(|e| match e {
        AtError::Refused(t) => DirError::NotRegular {
            path: path.to_path_buf(),
            what: describe(t),
            rule: kind.rule(),
        },
        AtError::Io(e) => io_at(path)(e),
    })
}

/// Reads `f` whole if it holds at most `cap` bytes, refusing it (unread) when its size says
/// more, and stopping at `cap + 1` bytes whatever its size says.
fn read_capped(f: File, path: &Path, kind: FileKind, cap: u64) -> Result<Vec<u8>, DirError> {
    let io = |source| DirError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = |len| DirError::TooLarge {
        path: path.to_path_buf(),
        len,
        cap,
        kind: kind.words(),
    };
    let len = f.metadata().map_err(io)?.len();
    if len > cap {
        return Err(too_large(len));
    }
    let mut buf = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.take(cap + 1).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 > cap {
        return Err(too_large(buf.len() as u64));
    }
    Ok(buf)
}
