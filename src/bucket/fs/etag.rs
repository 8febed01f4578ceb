//! The ETag of a local-directory bucket's object: quoted hex of the first 16 bytes of the
//! content's SHA-256, cached with the length in the extended attribute [`ETAG_XATTR`] so that
//! HEAD and LIST need not read whole objects. Where extended attributes are not supported, or
//! were lost by a copy, it is computed from the content: the ETag is the same either way.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

use super::CHUNK;

/// The extended attribute caching `<len>:<etag>` (NUL-terminated for the C call).
const ETAG_XATTR: &[u8] = b"user.mushroom-backup.etag\0";

/// The ETag of an object file: the cached one, else hashed from its content.
pub(super) fn etag_of_file(file: &File, len: u64) -> io::Result<String> {
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

pub(super) fn etag_of_digest(digest: [u8; 32]) -> String {
    format!("\"{}\"", hex::encode(&digest[..16]))
}

/// Caches `len:etag` in the file's extended attribute (best effort).
pub(super) fn cache_etag(file: &File, len: u64, etag: &str) {
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
pub(super) fn cached_etag(file: &File, len: u64) -> Option<String> {
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
