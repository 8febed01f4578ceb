//! Where encoded bytes wait for their upload: memory up to [`MEMORY_LIMIT`], then an unnamed
//! temporary file.
//!
//! The file is made with `tempfile::tempfile()` (`O_TMPFILE` on Linux, else created and
//! unlinked at once) in the system's temporary directory (`TMPDIR`, default `/tmp`), so it
//! has no name: a crash leaves nothing, and the space is freed when the upload's [`Body`]
//! (which holds the descriptor) is dropped.

use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;

use bytes::Bytes;

use crate::bucket::Body;

/// Encoded bytes kept in memory per object before the spool moves to a file. Uploads run
/// a few at once (the generation uploads in flight and one segment), so this
/// bounds the encoder's memory to a few times it.
pub const MEMORY_LIMIT: usize = 8 << 20;

/// A `Write` that holds what it is given, re-readable as a [`Body`].
pub struct Spool {
    mem: Vec<u8>,
    file: Option<File>,
    len: u64,
    limit: usize,
}

impl Spool {
    pub fn new() -> Spool {
        Spool::with_limit(MEMORY_LIMIT)
    }

    /// A spool that moves to a file past `limit` bytes (tests use a small one).
    pub fn with_limit(limit: usize) -> Spool {
        Spool {
            mem: Vec::new(),
            file: None,
            len: 0,
            limit,
        }
    }

    /// Whether the bytes went to a file.
    pub fn on_disk(&self) -> bool {
        self.file.is_some()
    }

    /// The bytes as a body that states `crc` (their CRC-32) when they are in a file, so the
    /// backends check every re-read against it.
    pub fn into_body(self, crc: u32) -> Body {
        match self.file {
            None => Body::Bytes(Bytes::from(self.mem)),
            Some(file) => Body::File {
                file: Arc::new(file),
                offset: 0,
                len: self.len,
                crc32: Some(crc),
            },
        }
    }
}

impl Default for Spool {
    fn default() -> Self {
        Spool::new()
    }
}

impl Write for Spool {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.file.is_none() && self.mem.len() + buf.len() > self.limit {
            let mut f = tempfile::tempfile()?;
            f.write_all(&self.mem)?;
            self.mem = Vec::new();
            self.file = Some(f);
        }
        match &mut self.file {
            Some(f) => f.write_all(buf)?,
            None => self.mem.extend_from_slice(buf),
        }
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}
