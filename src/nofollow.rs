//! Opening what lies below a directory descriptor without ever following a symbolic link: the
//! one walk behind the store directory ([`crate::store::dir`]) and the local-directory bucket
//! ([`crate::bucket::fs`]).
//!
//! Both hold a directory opened once (a store directory, a bucket's root) and must not be led
//! out of it by whoever can write inside it. So every name is taken one component at a time
//! relative to a descriptor (`openat`), with `O_NOFOLLOW`: a link, wherever it stands, is
//! refused with what it is ([`AtError::Refused`]), never resolved, and the caller names the
//! path in its own error. A file is looked at (`lstat`-like) before it is opened, so a device
//! is never opened; it is opened `O_NONBLOCK` (a FIFO does not block), checked again with
//! `fstat` once open, then made blocking.
//!
//! Nothing here creates, removes or caches anything: a crash mid-call leaves nothing behind.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a name below a directory was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtError {
    /// It is there, but not what was asked for: a link, a FIFO, a directory where a file was
    /// wanted, … ([`describe`] puts it in words).
    Refused(FileType),
    /// The system call failed.
    Io(Errno),
}

impl From<Errno> for AtError {
    fn from(e: Errno) -> AtError {
        AtError::Io(e)
    }
}

/// What a file is, in words ("a symbolic link", …).
pub fn describe(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "not a regular file",
    }
}

/// What `name` in `dir` is, not following a link; `None` when absent.
pub fn kind_at(dir: impl AsFd, name: &str) -> Result<Option<FileType>, Errno> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the directory `name` (one component) in `dir`, not following it; `None` when absent.
/// Anything there that is not a directory is [`AtError::Refused`] with its kind.
pub fn open_dir_at(dir: impl AsFd, name: &str) -> Result<Option<OwnedFd>, AtError> {
    let dir = dir.as_fd();
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e @ (Errno::LOOP | Errno::NOTDIR)) => match kind_at(dir, name)? {
            Some(t) if t != FileType::Directory => Err(AtError::Refused(t)),
            // Gone, or a directory again, since the open: report what the open said.
            _ => Err(AtError::Io(e)),
        },
        Err(e) => Err(AtError::Io(e)),
    }
}

/// Opens the regular file `name` (one component) in `dir` with `flags` (`RDONLY`, or `WRONLY`
/// and `APPEND`, …; never `CREATE`): looked at first without following (a device is never
/// opened), opened with `O_NOFOLLOW | O_NONBLOCK`, checked again once open, then made
/// blocking. `None` when absent; anything but a regular file is [`AtError::Refused`].
pub fn open_regular_at(dir: impl AsFd, name: &str, flags: OFlags) -> Result<Option<File>, AtError> {
    let dir = dir.as_fd();
    match kind_at(dir, name)? {
        None => return Ok(None),
        Some(FileType::RegularFile) => {}
        Some(t) => return Err(AtError::Refused(t)),
    }
    let fd = match rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        // Replaced by a link since the look.
        Err(Errno::LOOP) => return Err(AtError::Refused(FileType::Symlink)),
        Err(e) => return Err(AtError::Io(e)),
    };
    let t = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
    if t != FileType::RegularFile {
        return Err(AtError::Refused(t));
    }
    let flags = rustix::fs::fcntl_getfl(&fd)?;
    rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)?;
    Ok(Some(File::from(fd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_refused_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dir")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("file"))
            .unwrap();
        std::fs::create_dir(root.path().join("real")).unwrap();
        std::fs::write(root.path().join("plain"), b"y").unwrap();
        let fd = rustix::fs::open(
            root.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        assert_eq!(
            open_dir_at(&fd, "dir").err(),
            Some(AtError::Refused(FileType::Symlink))
        );
        assert_eq!(
            open_regular_at(&fd, "file", OFlags::RDONLY).err(),
            Some(AtError::Refused(FileType::Symlink))
        );
        assert_eq!(
            open_dir_at(&fd, "plain").err(),
            Some(AtError::Refused(FileType::RegularFile))
        );
        assert_eq!(
            open_regular_at(&fd, "real", OFlags::RDONLY).err(),
            Some(AtError::Refused(FileType::Directory))
        );
        assert!(open_dir_at(&fd, "real").unwrap().is_some());
        assert!(
            open_regular_at(&fd, "plain", OFlags::RDONLY)
                .unwrap()
                .is_some()
        );
        assert!(open_dir_at(&fd, "missing").unwrap().is_none());
        assert!(
            open_regular_at(&fd, "missing", OFlags::RDONLY)
                .unwrap()
                .is_none()
        );
    }
}
