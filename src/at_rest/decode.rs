//! Stored bytes to plain bytes, pushed in as they arrive: counted stored bytes → open stage →
//! zstd decoder (or nothing, codec `none`) → [`PlainSink`] → the output.
//!
//! [`Decoder::finish`] checks what passed against the manifest entry: stored length and CRC,
//! plain length and CRC. It is [`Decoder::end`] (the stored bytes and plain length) then
//! [`Ended::check`] (the plain CRC); a consumer that computes the plain CRC itself while it
//! reads the plain bytes (restore's format reader) builds the decoder with
//! [`Decoder::plain_crc_by_caller`], which hashes no plain byte, and checks with
//! [`Ended::check_with`], so no byte is hashed twice. The plain sink refuses bytes past the
//! entry's plain length, so a corrupt or hostile object never writes more than the manifest
//! promised.

use std::io::{self, Write};

use super::seal::{OpenKey, OpenStage};
use super::sink::{PlainSink, StoredSink, Tally};
use super::{AtRestError, Codec};
use crate::manifest::ObjectEntry;

/// An error of the output writer, told apart from bad stored bytes as it comes back through
/// the decoder.
#[derive(Debug)]
struct OutputError(io::Error);

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OutputError {}

/// The output, its errors marked as [`OutputError`].
struct Out<W>(W);

impl<W: Write> Write for Out<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .write(buf)
            .map_err(|e| io::Error::new(e.kind(), OutputError(e)))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0
            .flush()
            .map_err(|e| io::Error::new(e.kind(), OutputError(e)))
    }
}

enum Inner<W: Write> {
    Raw(PlainSink<Out<W>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, PlainSink<Out<W>>>>),
}

impl<W: Write> Write for Inner<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Inner::Raw(w) => w.write(buf),
            Inner::Zstd(d) => d.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Inner::Raw(w) => w.flush(),
            Inner::Zstd(d) => d.flush(),
        }
    }
}

/// A push-based decoder of one object into `W`.
pub struct Decoder<W: Write> {
    entry: ObjectEntry,
    key: Option<OpenKey>,
    stages: StoredSink<OpenStage<Inner<W>>>,
}

/// What a finished decoder saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub stored: Tally,
    pub plain: Tally,
}

/// A decoder whose stream has ended ([`Decoder::end`]): every plain byte is in the output and
/// the stored bytes and plain length were checked; the plain CRC is still to be checked.
pub struct Ended<W> {
    entry: ObjectEntry,
    key: Option<OpenKey>,
    out: W,
    stored: Tally,
    plain: Tally,
}

impl<W> Ended<W> {
    /// Checks the plain CRC the decoder counted (a decoder of [`Decoder::new`]).
    pub fn check(self) -> Result<(W, Decoded), AtRestError> {
        let crc = self.plain.crc;
        self.check_with(crc)
    }

    /// Checks `plain_crc`, the CRC-32 of the plain bytes as the caller computed it, against
    /// the entry's `plain_crc` (a sealed entry's keyed tag of the plain length and CRC).
    pub fn check_with(self, plain_crc: u32) -> Result<(W, Decoded), AtRestError> {
        let Ended {
            entry,
            key,
            out,
            stored,
            plain,
        } = self;
        let check = match (&key, entry.encrypted) {
            (Some(k), true) => k.plain_tag(plain.len, plain_crc),
            _ => plain_crc,
        };
        if check != entry.plain_crc() {
            return Err(AtRestError::Corrupt {
                key: entry.key.clone(),
                detail: format!(
                    "{} mismatch of the decoded bytes (expected {:08x}, got {:08x})",
                    if entry.encrypted { "keyed tag" } else { "CRC" },
                    entry.plain_crc(),
                    check
                ),
            });
        }
        let plain = Tally {
            len: plain.len,
            crc: plain_crc,
        };
        Ok((out, Decoded { stored, plain }))
    }
}

impl<W: Write> Decoder<W> {
    /// A decoder for the object `entry` describes, writing its plain bytes to `out`. An
    /// encrypted object without a key is refused here, before any byte is written.
    pub fn new(entry: &ObjectEntry, key: Option<&OpenKey>, out: W) -> Result<Self, AtRestError> {
        Self::build(entry, key, out, true)
    }

    /// [`Decoder::new`] for a caller that computes the CRC-32 of the plain bytes itself as
    /// they reach it (restore's format reader does, over every byte): the decoder counts
    /// their length and keeps to the entry's plain length, but hashes nothing, and
    /// [`Ended::check_with`] takes the caller's CRC.
    pub fn plain_crc_by_caller(
        entry: &ObjectEntry,
        key: Option<&OpenKey>,
        out: W,
    ) -> Result<Self, AtRestError> {
        Self::build(entry, key, out, false)
    }

    fn build(
        entry: &ObjectEntry,
        key: Option<&OpenKey>,
        out: W,
        hash_plain: bool,
    ) -> Result<Self, AtRestError> {
        if let Some(detail) = super::bounds::plain_len_problem(entry) {
            return Err(AtRestError::Corrupt {
                key: entry.key.clone(),
                detail,
            });
        }
        let plain = if hash_plain {
            PlainSink::new(Out(out), entry.plain_len())
        } else {
            PlainSink::uncounted(Out(out), entry.plain_len())
        };
        let inner = match entry.codec {
            Codec::None => Inner::Raw(plain),
            Codec::Zstd => {
                let start = |source| AtRestError::Io {
                    key: entry.key.clone(),
                    what: "start zstd",
                    source,
                };
                let mut raw = zstd::stream::raw::Decoder::new().map_err(start)?;
                raw.set_parameter(zstd::stream::raw::DParameter::WindowLogMax(
                    super::bounds::ZSTD_WINDOW_LOG_MAX,
                ))
                .map_err(start)?;
                Inner::Zstd(Box::new(zstd::stream::write::Decoder::with_decoder(
                    plain, raw,
                )))
            }
        };
        let open = OpenStage::new(entry.encrypted, key, &entry.key, inner)?;
        Ok(Decoder {
            entry: entry.clone(),
            key: key.cloned(),
            stages: StoredSink::new(open),
        })
    }

    fn error(&self, what: &'static str, e: io::Error) -> AtRestError {
        Self::error_of(&self.entry, what, e)
    }

    /// Pushes the next stored bytes in.
    pub fn write_stored(&mut self, buf: &[u8]) -> Result<(), AtRestError> {
        self.stages
            .write_all(buf)
            .map_err(|e| self.error("decode", e))
    }

    /// Ends the stream and checks it against the entry; returns the output and the tallies.
    pub fn finish(self) -> Result<(W, Decoded), AtRestError> {
        self.end()?.check()
    }

    /// Ends the stream (the last plain bytes reach the output) and checks what needs no plain
    /// CRC: the stored length and CRC, and the plain length. [`Ended::check`] or
    /// [`Ended::check_with`] then checks the plain CRC (or a sealed entry's keyed tag).
    pub fn end(self) -> Result<Ended<W>, AtRestError> {
        let Decoder { entry, key, stages } = self;
        let fail = |what: &'static str, e: io::Error| Decoder::<W>::error_of(&entry, what, e);
        let (open, stored) = stages.into_parts();
        let inner = open.finish().map_err(|e| fail("open", e))?;
        let plain = match inner {
            Inner::Raw(p) => p,
            Inner::Zstd(d) => d.finish().map_err(|e| fail("decode whole", e))?,
        };
        let (Out(out), plain) = plain.into_parts();
        let corrupt = |detail: String| AtRestError::Corrupt {
            key: entry.key.clone(),
            detail,
        };
        if stored.len != entry.len {
            return Err(corrupt(format!(
                "{} stored bytes, the manifest states {}",
                stored.len, entry.len
            )));
        }
        if stored.crc != entry.crc {
            return Err(corrupt(format!(
                "CRC mismatch of the stored bytes (expected {:08x}, got {:08x})",
                entry.crc, stored.crc
            )));
        }
        if plain.len != entry.plain_len() {
            return Err(corrupt(format!(
                "decodes to {} bytes, the manifest states {}",
                plain.len,
                entry.plain_len()
            )));
        }
        Ok(Ended {
            entry,
            key,
            out,
            stored,
            plain,
        })
    }

    fn error_of(entry: &ObjectEntry, what: &'static str, e: io::Error) -> AtRestError {
        if let Some(s) = crate::crypto::StreamError::of(&e) {
            return AtRestError::Corrupt {
                key: entry.key.clone(),
                detail: format!("does not open: {s}"),
            };
        }
        if e.get_ref().is_some_and(|i| i.is::<OutputError>()) {
            return AtRestError::Io {
                key: entry.key.clone(),
                what: "write the plain bytes",
                source: e,
            };
        }
        AtRestError::Corrupt {
            key: entry.key.clone(),
            detail: format!(
                "the stored bytes do not {what} as {} ({e})",
                entry.codec.name()
            ),
        }
    }
}

/// Decodes a whole object held in memory (verify, resume, cached extension segments); `key`
/// is the entry's generation's, for a sealed object. The plain bytes grow to at most the
/// entry's plain length (refused beyond [`super::bounds`]): a caller keeps that small, or
/// decodes into a file ([`Decoder`]) instead. The first allocation is sized by the bytes
/// there are, never by the length an entry claims.
pub fn decode_bytes(
    entry: &ObjectEntry,
    key: Option<&OpenKey>,
    stored: &[u8],
) -> Result<Vec<u8>, AtRestError> {
    let cap = crate::units::usize_of(
        entry
            .plain_len()
            .min(crate::units::u64_len(stored.len()).saturating_mul(4))
            .min(64 << 20),
    );
    let mut d = Decoder::new(entry, key, Vec::with_capacity(cap))?;
    d.write_stored(stored)?;
    Ok(d.finish()?.0)
}

/// The first bytes of every zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// An object no manifest describes yet (a segment shipped after the newest restore point),
/// recognised from its bytes: raw when it is exactly `plain_len` bytes (an encoded object is
/// always shorter than its plain bytes, or the encoder stores it raw), else zstd when it
/// decodes to exactly `plain_len` bytes. Returns the entry (stored and plain length and CRC,
/// lineage and generation left to the caller) and the plain bytes, or `None`.
///
/// With `open`, the key of an encrypted generation, only a sealed object (it starts with the
/// seal's magic) is recognised: it must open, and its content be raw `plain_len` bytes or zstd
/// decoding to them; its entry records the keyed tag. Raw or zstd bytes are not: in an
/// encrypted generation they are what someone without the key wrote. Without `open`, a
/// sealed object is not recognised.
pub fn recognise(
    key: &str,
    stored: &bytes::Bytes,
    plain_len: u64,
    open: Option<&OpenKey>,
) -> Option<(ObjectEntry, bytes::Bytes)> {
    if super::bounds::segment_len_problem(plain_len).is_some() {
        return None;
    }
    let crc = crc32fast::hash(stored);
    if let Some(open) = open {
        if !stored.starts_with(crate::crypto::stream::MAGIC) {
            return None;
        }
        return recognise_sealed(key, stored, crc, plain_len, open);
    }
    if stored.starts_with(crate::crypto::stream::MAGIC) {
        return None;
    }
    if stored.len() as u64 == plain_len {
        return Some((
            ObjectEntry::raw(key.to_string(), plain_len, crc, uuid::Uuid::nil(), 0),
            stored.clone(),
        ));
    }
    let (mut probe, plain, plain_crc) = zstd_of_len(key, stored, crc, plain_len)?;
    probe.plain_crc = Some(plain_crc);
    Some((probe, bytes::Bytes::from(plain)))
}

/// The plain bytes of the zstd stream `stored` (CRC `crc`), when it decodes to exactly
/// `plain_len` bytes, with an entry for it (no plain CRC yet) and their CRC. The decoder keeps to
/// `plain_len` and to [`super::bounds`]: a bomb costs at most `plain_len` bytes, which the
/// caller bounds (a segment's length).
fn zstd_of_len(
    key: &str,
    stored: &[u8],
    crc: u32,
    plain_len: u64,
) -> Option<(ObjectEntry, Vec<u8>, u32)> {
    if !stored.starts_with(&ZSTD_MAGIC) || stored.len() as u64 > plain_len {
        return None;
    }
    let mut probe = ObjectEntry::raw(
        key.to_string(),
        stored.len() as u64,
        crc,
        uuid::Uuid::nil(),
        0,
    );
    probe.codec = Codec::Zstd;
    probe.plain_len = Some(plain_len);
    let mut d = Decoder::new(&probe, None, Vec::new()).ok()?;
    d.write_stored(stored).ok()?;
    // The plain CRC is not known yet: finish checks it, so take it from the bytes instead.
    let Decoder { stages, .. } = d;
    let (open, _) = stages.into_parts();
    let plain = match open.finish().ok()? {
        Inner::Zstd(z) => z.finish().ok()?,
        Inner::Raw(_) => return None,
    };
    let (Out(plain), tally) = plain.into_parts();
    (tally.len == plain_len).then_some((probe, plain, tally.crc))
}

/// [`recognise`] of a sealed object.
fn recognise_sealed(
    key: &str,
    stored: &bytes::Bytes,
    crc: u32,
    plain_len: u64,
    open: &OpenKey,
) -> Option<(ObjectEntry, bytes::Bytes)> {
    let mut o = crate::crypto::OpenWriter::new(Vec::new(), open.data_key(), key);
    o.write_all(stored).ok()?;
    let inner = o.finish().ok()?;
    let (codec, plain) = if inner.len() as u64 == plain_len {
        (Codec::None, inner)
    } else if inner.starts_with(&ZSTD_MAGIC) && (inner.len() as u64) < plain_len {
        let crc = crc32fast::hash(&inner);
        (Codec::Zstd, zstd_of_len(key, &inner, crc, plain_len)?.1)
    } else {
        return None;
    };
    if plain.len() as u64 != plain_len {
        return None;
    }
    let mut e = ObjectEntry::raw(
        key.to_string(),
        stored.len() as u64,
        crc,
        uuid::Uuid::nil(),
        0,
    );
    e.codec = codec;
    e.encrypted = true;
    e.plain_len = Some(plain_len);
    e.plain_crc = Some(open.plain_tag(plain_len, crc32fast::hash(&plain)));
    Some((e, bytes::Bytes::from(plain)))
}
