//! Plain bytes to stored bytes: the sample decision, then plain → zstd → seal → counted
//! stored bytes → [`Spool`]. Blocking (CPU and `pread`): run it on the blocking pool.

use std::io::Write;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use super::seal::{SealKey, SealStage};
use super::sink::{StoredSink, Tally};
use super::spool::Spool;
use super::{AtRestError, Codec, Compression};
use crate::bucket::Body;

/// Bytes compressed first to decide whether an object is worth compressing.
pub const SAMPLE_LEN: usize = 128 << 10;
/// An object is compressed only when its sample compresses to at most this percentage of
/// its length (and kept compressed only when the whole object came out smaller).
pub const WORTH_IT_PERCENT: usize = 90;
/// Plain bytes read from a file per `pread` while encoding.
const READ_CHUNK: usize = 1 << 20;

/// How to encode.
#[derive(Debug, Clone, Default)]
pub struct EncodeOptions {
    pub compression: Compression,
    /// The generation's data key: every object is sealed with it (see [`super::seal`]).
    pub seal: Option<SealKey>,
}

/// An object ready to upload.
#[derive(Debug)]
pub struct Encoded {
    pub codec: Codec,
    pub encrypted: bool,
    /// What goes up: the plain body itself when stored raw, else the spool.
    pub body: Body,
    pub stored: Tally,
    pub plain: Tally,
    /// What the entry records as `plain_crc`: the plain CRC, or for a sealed object its
    /// keyed tag ([`super::seal::GenerationKey::plain_tag`]).
    pub plain_check: u32,
}

impl Encoded {
    /// The manifest entry's encoding fields on `entry` (whose key, lineage and generation
    /// the caller sets).
    pub fn entry(
        &self,
        key: String,
        lineage: uuid::Uuid,
        generation: u64,
    ) -> crate::manifest::ObjectEntry {
        let mut e = crate::manifest::ObjectEntry::raw(
            key,
            self.stored.len,
            self.stored.crc,
            lineage,
            generation,
        );
        if self.codec != Codec::None || self.encrypted {
            e.codec = self.codec;
            e.encrypted = self.encrypted;
            e.plain_len = Some(self.plain.len);
            e.plain_crc = Some(self.plain_check);
        }
        e
    }
}

/// The plain bytes of one object: in memory, or a range of an open file whose CRC-32 the
/// caller checked (`crc`).
pub enum Plain {
    Bytes(Bytes),
    File {
        file: std::sync::Arc<std::fs::File>,
        offset: u64,
        len: u64,
        crc: u32,
    },
}

impl Plain {
    fn len(&self) -> u64 {
        match self {
            Plain::Bytes(b) => b.len() as u64,
            Plain::File { len, .. } => *len,
        }
    }

    /// The bytes from `at`, at most `max` of them.
    fn read(&self, at: u64, max: usize, key: &str) -> Result<Bytes, AtRestError> {
        let n = crate::units::usize_of((self.len() - at).min(max as u64));
        match self {
            Plain::Bytes(b) => {
                let at = crate::units::usize_of(at);
                Ok(b.slice(at..at + n))
            }
            Plain::File { file, offset, .. } => {
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, offset + at)
                    .map_err(|source| AtRestError::Io {
                        key: key.to_string(),
                        what: "read the plain bytes",
                        source,
                    })?;
                Ok(Bytes::from(buf))
            }
        }
    }

    /// The raw upload: the bytes, or the file range stating its checked CRC (so the backend
    /// refuses it if the file changed since).
    fn into_raw(self, key: &str) -> Result<Encoded, AtRestError> {
        Ok(match self {
            Plain::Bytes(b) => {
                let t = Tally {
                    len: b.len() as u64,
                    crc: crc32fast::hash(&b),
                };
                Encoded {
                    codec: Codec::None,
                    encrypted: false,
                    body: Body::Bytes(b),
                    stored: t,
                    plain: t,
                    plain_check: t.crc,
                }
            }
            Plain::File {
                file,
                offset,
                len,
                crc,
            } => {
                let _ = key;
                let t = Tally { len, crc };
                Encoded {
                    codec: Codec::None,
                    encrypted: false,
                    body: Body::File {
                        file,
                        offset,
                        len,
                        crc32: Some(crc),
                    },
                    stored: t,
                    plain: t,
                    plain_check: t.crc,
                }
            }
        })
    }
}

/// Whether zstd at `level` shrinks `sample` to at most [`WORTH_IT_PERCENT`] of it.
fn worth_compressing(sample: &[u8], level: i32) -> bool {
    match zstd::bulk::compress(sample, level) {
        Ok(c) => c.len() * 100 <= sample.len() * WORTH_IT_PERCENT,
        Err(_) => false,
    }
}

/// Encodes the object `key` for upload (see the module docs of [`super`]). Blocking.
pub fn encode(key: &str, plain: Plain, opts: &EncodeOptions) -> Result<Encoded, AtRestError> {
    encode_into(key, plain, opts, Spool::new())
}

/// [`encode`] into a given spool (tests use one with a small memory limit).
pub fn encode_into(
    key: &str,
    plain: Plain,
    opts: &EncodeOptions,
    spool: Spool,
) -> Result<Encoded, AtRestError> {
    let sealed = opts.seal.is_some();
    let level = match opts.compression {
        Compression::Zstd { level } if plain.len() > 0 => {
            let sample = plain.read(0, SAMPLE_LEN, key)?;
            worth_compressing(&sample, level).then_some(level)
        }
        _ => None,
    };
    if level.is_none() && !sealed {
        return plain.into_raw(key);
    }
    let io = |what: &'static str| {
        move |source: std::io::Error| AtRestError::Io {
            key: key.to_string(),
            what,
            source,
        }
    };
    let stored = StoredSink::new(spool);
    let seal = SealStage::new(opts.seal.as_ref(), key, stored).map_err(io("start the seal"))?;
    let mut stage: Stage<_> = match level {
        Some(l) => {
            Stage::Zstd(zstd::stream::write::Encoder::new(seal, l).map_err(io("start zstd"))?)
        }
        None => Stage::Raw(seal),
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut at = 0u64;
    while at < plain.len() {
        let chunk = plain.read(at, READ_CHUNK, key)?;
        hasher.update(&chunk);
        stage.write_all(&chunk).map_err(io("encode"))?;
        at += chunk.len() as u64;
    }
    let plain_tally = Tally {
        len: plain.len(),
        crc: hasher.finalize(),
    };
    if let Plain::File { crc, .. } = &plain
        && *crc != plain_tally.crc
    {
        return Err(AtRestError::Changed {
            key: key.to_string(),
            stated: *crc,
            actual: plain_tally.crc,
        });
    }
    let seal = match stage {
        Stage::Zstd(e) => e.finish().map_err(io("finish zstd"))?,
        Stage::Raw(s) => s,
    };
    let (spool, stored) = seal.finish().map_err(io("seal"))?.into_parts();
    if !sealed && stored.len >= plain_tally.len {
        // It did not shrink after all: the raw bytes cost less.
        return plain.into_raw(key);
    }
    Ok(Encoded {
        codec: if level.is_some() {
            Codec::Zstd
        } else {
            Codec::None
        },
        encrypted: sealed,
        body: spool.into_body(stored.crc),
        stored,
        plain: plain_tally,
        plain_check: match &opts.seal {
            Some(k) => k.plain_tag(plain_tally.len, plain_tally.crc),
            None => plain_tally.crc,
        },
    })
}

/// The compression stage, or none (a sealed object that did not compress).
enum Stage<W: Write> {
    Zstd(zstd::stream::write::Encoder<'static, W>),
    Raw(W),
}

impl<W: Write> Write for Stage<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stage::Zstd(e) => e.write(buf),
            Stage::Raw(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stage::Zstd(e) => e.flush(),
            Stage::Raw(w) => w.flush(),
        }
    }
}
