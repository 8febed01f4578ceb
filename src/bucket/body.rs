//! [`Body`]: what a write sends, re-readable so that a retry or a multipart upload can read any
//! part again.

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
            Body::Bytes(b) => Ok(b.slice(at as usize..end as usize)),
            Body::File { file, offset, .. } => {
                let file = file.clone();
                let pos = offset + at;
                tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt;
                    let mut buf = vec![0u8; len as usize];
                    file.read_exact_at(&mut buf, pos)?;
                    Ok::<_, std::io::Error>(Bytes::from(buf))
                })
                .await
                .map_err(|e| body_error(e.to_string()))?
                .map_err(|e| body_error(e.to_string()))
            }
        }
    }

    /// The whole body in memory.
    pub async fn to_bytes(&self) -> Result<Bytes, BucketError> {
        self.read(0, self.len()).await
    }

    /// Whether `other` is byte-for-byte this body.
    pub async fn same_content(&self, other: &[u8]) -> Result<bool, BucketError> {
        if other.len() as u64 != self.len() {
            return Ok(false);
        }
        Ok(self.to_bytes().await?.as_ref() == other)
    }
}

fn body_error(message: String) -> BucketError {
    BucketError::Permanent {
        op: "read body",
        key: String::new(),
        message,
    }
}
