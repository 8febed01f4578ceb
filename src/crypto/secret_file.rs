//! Reading a small secret file (a key file, an age identity file; `serve`'s TLS files,
//! `service::tls_files`) without trusting it.
//!
//! The file is opened non-blocking (a FIFO cannot hang the process), then checked on the open
//! descriptor (no race between a check and the open): it must be a regular file (a directory,
//! FIFO, socket or device is refused), at most a cap in size (checked on the descriptor and
//! again while reading, for a file that grows), and not empty. A symlink is followed (secret
//! mounts are symlinks), a symlink loop is named as such. A file that group or others may
//! read is accepted with a warning: refusing it would break the common case of a secret
//! mounted 0644 in a container; the warning says how to fix it. The bytes read are zeroized
//! when dropped.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use zeroize::Zeroizing;

/// Why a secret file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFileError {
    #[error("{path}: no such file")]
    NotFound { path: String },
    #[error("{path}: permission denied")]
    PermissionDenied { path: String },
    #[error("{path}: symlink loop")]
    SymlinkLoop { path: String },
    #[error("{path}: is {kind}, not a regular file")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path}: {len} bytes or more; a key file holds at most {max}")]
    TooLarge { path: String, len: u64, max: u64 },
    #[error("{path}: empty")]
    Empty { path: String },
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
}

/// A secret file's bytes, and the warnings its permissions earned.
pub struct SecretFile {
    pub bytes: Zeroizing<Vec<u8>>,
    pub warnings: Vec<String>,
}

/// Reads `path` (at most `max` bytes) as the module docs say.
pub fn read(path: &Path, max: u64) -> Result<SecretFile, SecretFileError> {
    let p = || path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match (e.kind(), e.raw_os_error()) {
            (std::io::ErrorKind::NotFound, _) => SecretFileError::NotFound { path: p() },
            (std::io::ErrorKind::PermissionDenied, _) => {
                SecretFileError::PermissionDenied { path: p() }
            }
            (_, Some(libc::ELOOP)) => SecretFileError::SymlinkLoop { path: p() },
            _ => SecretFileError::Io {
                path: p(),
                detail: e.to_string(),
            },
        })?;
    let meta = file.metadata().map_err(|e| SecretFileError::Io {
        path: p(),
        detail: e.to_string(),
    })?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_block_device() || ft.is_char_device() {
            "a device"
        } else {
            "not a file"
        };
        return Err(SecretFileError::NotRegular { path: p(), kind });
    }
    if meta.len() > max {
        return Err(SecretFileError::TooLarge {
            path: p(),
            len: meta.len(),
            max,
        });
    }
    let mut bytes = Zeroizing::new(Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0)));
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| SecretFileError::Io {
            path: p(),
            detail: e.to_string(),
        })?;
    let len = bytes.len() as u64;
    if len > max {
        return Err(SecretFileError::TooLarge {
            path: p(),
            len,
            max,
        });
    }
    if bytes.is_empty() {
        return Err(SecretFileError::Empty { path: p() });
    }
    let mode = meta.permissions().mode() & 0o777;
    let mut warnings = Vec::new();
    if mode & 0o077 != 0 {
        warnings.push(format!(
            "{}: a secret readable or writable by group or others (mode {mode:04o}); chmod 600 it",
            path.display()
        ));
    }
    Ok(SecretFile { bytes, warnings })
}
