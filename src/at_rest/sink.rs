//! The counting ends of the pipelines: [`StoredSink`] (length and CRC-32 of the stored
//! bytes, passed on) and [`PlainSink`] (the same of the plain bytes, refusing more than a
//! limit; or its length alone, [`PlainSink::uncounted`], where the consumer of the plain bytes
//! computes their CRC itself, as restore's format reader does).

use std::io::{self, Write};

/// Length and CRC-32 of a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub len: u64,
    pub crc: u32,
}

/// Passes bytes on to `inner`, counting their length and CRC-32.
pub struct StoredSink<W> {
    inner: W,
    len: u64,
    /// `None`: the length alone is counted (the CRC a tally reports is then that of no bytes).
    hasher: Option<crc32fast::Hasher>,
}

impl<W: Write> StoredSink<W> {
    pub fn new(inner: W) -> Self {
        StoredSink {
            inner,
            len: 0,
            hasher: Some(crc32fast::Hasher::new()),
        }
    }

    pub fn tally(&self) -> Tally {
        Tally {
            len: self.len,
            crc: self.hasher.clone().map_or(0, |h| h.finalize()),
        }
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    pub fn into_parts(self) -> (W, Tally) {
        let t = self.tally();
        (self.inner, t)
    }
}

impl<W: Write> Write for StoredSink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.len += n as u64;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// [`StoredSink`] for the plain end of a decoder: a write past `limit` bytes is an error
/// (`InvalidData`), and nothing past the limit reaches `inner`.
pub struct PlainSink<W> {
    sink: StoredSink<W>,
    limit: u64,
}

impl<W: Write> PlainSink<W> {
    pub fn new(inner: W, limit: u64) -> Self {
        PlainSink {
            sink: StoredSink::new(inner),
            limit,
        }
    }

    /// A sink that counts the length and enforces the limit but computes no CRC: its tally's
    /// `crc` means nothing, and the caller supplies the plain CRC from its own pass.
    pub fn uncounted(inner: W, limit: u64) -> Self {
        let mut sink = StoredSink::new(inner);
        sink.hasher = None;
        PlainSink { sink, limit }
    }

    pub fn into_parts(self) -> (W, Tally) {
        self.sink.into_parts()
    }
}

impl<W: Write> Write for PlainSink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.sink.len + buf.len() as u64 > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "decodes to more than the {} bytes the manifest states",
                    self.limit
                ),
            ));
        }
        self.sink.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }
}
