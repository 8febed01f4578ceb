//! [`Body`]: what a write sends, re-readable so that a retry or a multipart upload can read any
//! part again.
//!
//! A file range may come with the CRC-32 its caller computed when it checked the bytes (the
//! worker's check of an archive or a snapshot). Every backend then makes the CRC a condition of
//! the write: a body whose bytes no longer match (a file changed after its check) is refused
//! and leaves no object, so the CRC a manifest records is the CRC of what the bucket holds.

use std::sync::Arc;

use bytes::Bytes;

use super::BucketError;

/// The content of a write: bytes in memory, or a range of an open file read with `pread`
/// (so a file renamed or replaced meanwhile still yields the content it had when opened).
#[derive(Debug, Clone)]
pub enum Body {
    Bytes(Bytes),
    File {
        file: Arc<std::fs::File>,
        offset: u64,
        len: u64,
        /// The CRC-32 of the range, when the caller knows it: the write is refused, and leaves
        /// nothing, unless the bytes read match it (see the module docs).
        crc32: Option<u32>,
    },
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Bytes(b)
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Self {
        Body::Bytes(Bytes::from(v))
    }
}

impl Body {
    pub fn len(&self) -> u64 {
        match self {
            Body::Bytes(b) => b.len() as u64,
            Body::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads `len` bytes starting `at` bytes into the body.
    pub async fn read(&self, at: u64, len: u64) -> Result<Bytes, BucketError> {
        let end = at
            .checked_add(len)
            .filter(|e| *e <= self.len())
            .ok_or_else(|| BucketError::Permanent {
                op: "read body",
                key: String::new(),
                message: format!("range {at}+{len} past the body's {} bytes", self.len()),
            })?;
        match self {
            Body::Bytes(b) => Ok(b.slice(crate::units::usize_of(at)..crate::units::usize_of(end))),
            Body::File { file, offset, .. } => {
                let file = file.clone();
                let pos = offset + at;
                tokio::task::spawn_blocking(move || pread(&file, pos, len))
                    .await
                    .map_err(|e| body_error(e.to_string()))?
                    .map_err(|e| body_error(e.to_string()))
            }
        }
    }

    /// The CRC-32 the body was given with, if any.
    pub fn stated_crc32(&self) -> Option<u32> {
        match self {
            Body::Bytes(_) => None,
            Body::File { crc32, .. } => *crc32,
        }
    }

    /// The whole body in memory; an error if it does not match its stated CRC-32.
    pub async fn to_bytes(&self) -> Result<Bytes, BucketError> {
        let data = self.read(0, self.len()).await?;
        if let Some(stated) = self.stated_crc32() {
            check_crc32(stated, crc32fast::hash(&data)).map_err(body_error)?;
        }
        Ok(data)
    }

    /// Whether `other` is byte-for-byte this body.
    pub async fn same_content(&self, other: &[u8]) -> Result<bool, BucketError> {
        if other.len() as u64 != self.len() {
            return Ok(false);
        }
        Ok(self.to_bytes().await?.as_ref() == other)
    }
}

/// `len` bytes of `file` from `at`, with `pread`. Blocking.
pub(crate) fn pread(file: &std::fs::File, at: u64, len: u64) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; crate::units::usize_of(len)];
    file.read_exact_at(&mut buf, at)?;
    Ok(Bytes::from(buf))
}

/// `Err` with the reason when the CRC-32 of the bytes read (`actual`) is not the one the body
/// was given with (`stated`).
pub(crate) fn check_crc32(stated: u32, actual: u32) -> Result<(), String> {
    if stated == actual {
        return Ok(());
    }
    Err(format!(
        "the bytes read have CRC-32 {actual:08x}, not the {stated:08x} they were checked with: \
         the file changed after its check"
    ))
}

/// Puts `key` on an error that came from reading a body (which knows no key).
pub(crate) fn with_key(e: BucketError, key: &str) -> BucketError {
    match e {
        BucketError::Permanent { op, message, .. } => BucketError::Permanent {
            op,
            key: key.to_string(),
            message,
        },
        e => e,
    }
}

fn body_error(message: String) -> BucketError {
    BucketError::Permanent {
        op: "read body",
        key: String::new(),
        message,
    }
}
