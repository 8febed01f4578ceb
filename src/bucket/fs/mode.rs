//! [`FileModes`]: the permissions of what a local-directory bucket creates.
//!
//! A backup holds a store's whole content, so by default only the service's own user may read
//! it: objects (and the bucket's `.lock` and temp files) are created `0600`, directories `0700`.
//! [`FILE_MODE_ENV`] widens that for a group (`0640`, `0660`); each read bit of the file mode
//! gives the directories the matching search bit (`0640` makes directories `0750`). The value
//! is parsed strictly: three octal digits with an optional leading `0`, the owner able to read
//! and write, no execute bits (objects are not programs) and nothing writable by others;
//! anything else is refused with a reason, never guessed at.
//!
//! The modes are set explicitly on everything the bucket creates, so the process's umask
//! neither widens nor narrows them. What exists already (a root directory an operator made,
//! objects written by an earlier version) is left as it is.

use std::fs::{self, File, Permissions};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use rustix::fs::Mode;
use rustix::io::Errno;

use crate::nofollow::{AtError, open_dir_at};

/// The variable that sets the mode of objects (directories follow; see the module docs).
pub const FILE_MODE_ENV: &str = "MUSHROOMDB_BACKUP_FILE_MODE";

/// The modes a local-directory bucket creates files and directories with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileModes {
    pub file: u32,
    pub dir: u32,
}

impl Default for FileModes {
    /// `0600` and `0700`: the service's user only.
    fn default() -> Self {
        FileModes::for_files(0o600)
    }
}

impl FileModes {
    /// The modes for objects created `file` (directories get a search bit per read bit).
    fn for_files(file: u32) -> FileModes {
        FileModes {
            file,
            dir: file | ((file & 0o444) >> 2),
        }
    }

    /// From [`FILE_MODE_ENV`], or the default when it is not set; an error names the variable.
    pub fn from_env() -> Result<FileModes, String> {
        match std::env::var(FILE_MODE_ENV) {
            Ok(value) => {
                FileModes::parse(&value).map_err(|why| format!("{FILE_MODE_ENV}={value:?}: {why}"))
            }
            Err(std::env::VarError::NotPresent) => Ok(FileModes::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{FILE_MODE_ENV} is not UTF-8")),
        }
    }

    /// Parses an object file mode such as `0640`; see the module docs for what is refused.
    pub fn parse(value: &str) -> Result<FileModes, String> {
        let digits = match value.len() {
            4 => value
                .strip_prefix('0')
                .ok_or("a four-digit mode starts with 0")?,
            3 => value,
            _ => return Err("not an octal file mode like 0600 or 0640".into()),
        };
        if !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err("not an octal file mode like 0600 or 0640".into());
        }
        let mode = u32::from_str_radix(digits, 8).map_err(|e| e.to_string())?;
        if mode & 0o600 != 0o600 {
            return Err(
                "the owner must be able to read and write the objects (0600 at least)".into(),
            );
        }
        if mode & 0o111 != 0 {
            return Err("objects are not programs: no execute bits".into());
        }
        if mode & 0o002 != 0 {
            return Err("objects must not be writable by others".into());
        }
        Ok(FileModes::for_files(mode))
    }

    /// Gives a file this bucket just created its mode.
    pub(super) fn set_file(&self, file: &File) -> io::Result<()> {
        file.set_permissions(Permissions::from_mode(self.file))
    }

    /// Creates the directory `dir` (its parent exists) with the directory mode.
    pub(super) fn create_dir(&self, dir: &Path) -> io::Result<()> {
        fs::DirBuilder::new().mode(self.dir).create(dir)?;
        fs::set_permissions(dir, Permissions::from_mode(self.dir))
    }

    /// Creates the directory `name` in `dir` with the directory mode and makes it durable
    /// there; returns it opened (not followed). One made meanwhile by another writer is
    /// opened as it is; `None` when it was removed again before it could be opened.
    pub(super) fn create_dir_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<Option<OwnedFd>, AtError> {
        let mode = Mode::from_raw_mode(self.dir);
        match rustix::fs::mkdirat(dir, name, mode) {
            Ok(()) => {}
            Err(Errno::EXIST) => return open_dir_at(dir, name),
            Err(e) => return Err(AtError::Io(e)),
        }
        let made = open_dir_at(dir, name)?;
        if let Some(fd) = &made {
            rustix::fs::fchmod(fd, mode)?;
        }
        rustix::fs::fsync(dir)?;
        Ok(made)
    }

    /// Creates `dir` and its missing ancestors, each with the directory mode.
    pub(super) fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            self.create_dir_all(parent)?;
        }
        match self.create_dir(dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_strictly() {
        assert_eq!(
            FileModes::default(),
            FileModes {
                file: 0o600,
                dir: 0o700
            }
        );
        for (value, file, dir) in [
            ("0600", 0o600, 0o700),
            ("600", 0o600, 0o700),
            ("0640", 0o640, 0o750),
            ("0660", 0o660, 0o770),
            ("0644", 0o644, 0o755),
        ] {
            assert_eq!(
                FileModes::parse(value),
                Ok(FileModes { file, dir }),
                "{value}"
            );
        }
        for bad in [
            "",
            "0",
            "60",
            "06400",
            "1600",
            "0o640",
            "0x1a0",
            "0800",
            "-600",
            " 0600",
            "0600 ",
            "0400",
            "0200",
            "0700",
            "0610",
            "0602",
            "0666",
            "rw-------",
        ] {
            assert!(FileModes::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
