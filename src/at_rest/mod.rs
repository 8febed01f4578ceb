//! How an object's stored bytes are made from its plain bytes, and back.
//!
//! Every object of a generation (snapshot, archives, WAL segments, side files) goes through
//! one pipeline of `std::io::Write` stages, so it streams and is never held whole:
//!
//! ```text
//! encode: plain ──▶ zstd encoder ──▶ seal stage ──▶ StoredSink (length, CRC-32) ──▶ spool
//! decode: stored ──▶ StoredSink  ──▶ open stage ──▶ zstd decoder ──▶ PlainSink (length, CRC-32, limit) ──▶ file
//! ```
//!
//! - [`encode`]: samples the first [`encode::SAMPLE_LEN`] bytes; data that does not shrink
//!   to at most [`encode::WORTH_IT_PERCENT`] percent of the sample is stored raw (codec
//!   `none`), and so is an object whose whole encoding came out no smaller than its plain
//!   bytes. So incompressible data costs one small compression of its sample and no space.
//! - [`spool`]: where the encoded bytes wait for their upload: memory up to
//!   [`spool::MEMORY_LIMIT`], else an unnamed temporary file (`O_TMPFILE`) in the system's
//!   temporary directory (`TMPDIR`). The upload is a re-readable [`crate::bucket::Body`]
//!   (retries and multipart parts read it again) carrying the stored CRC, which every backend
//!   makes a condition of the write. A crash leaves nothing: an unnamed file is gone with its
//!   last descriptor.
//! - [`decode`]: a push-based decoder for restore and verify; it checks the stored length and
//!   CRC and the plain length and CRC against the manifest entry, and refuses to write more
//!   plain bytes than the entry states (a corrupt or hostile object cannot fill a disk).
//! - [`bounds`]: the plain length stored bytes can decode to (the zstd format's ratio, the
//!   writer's segment cap, the zstd window); the decoder refuses an entry claiming more before
//!   it decodes a byte, naming the object.
//! - [`chain`]: which listed objects can be segments past a restore point (their stored length
//!   bounded by what an encoding makes of their range) and the chain of them that reaches
//!   furthest: one choice for restore, the standby and the worker's resume.
//! - [`seal`]: the encryption stage: sealing with the generation's data key, opening, and the
//!   keyed tag a sealed entry records instead of its plain CRC (see there).
//!
//! Invariants: the plain bytes an encoder reads are CRC-checked against the CRC the caller
//! checked them with (an archive or snapshot changed after its check is refused, nothing is
//! uploaded); the manifest's `len`/`crc` are the stored bytes', `plain_len`/`plain_crc` the
//! plain bytes' ([`crate::manifest::ObjectEntry`]).
//!
//! Beyond DESIGN.md: the manifest records `plain_crc` as well as the codec and `plain_len`,
//! because the worker decides reuse (an archive, snapshot or side file already in the prefix)
//! and divergence of `wal.bin` by the plain CRC of the local file; for a sealed object the
//! field holds a keyed tag of the plain length and CRC instead ([`seal`]).

pub mod bounds;
pub mod chain;
pub mod decode;
pub mod encode;
pub mod seal;
pub mod sink;
pub mod spool;

pub use crate::manifest::Codec;

/// zstd levels accepted by `--compression-level` (zstd's own range without its "ultra"
/// levels, which need a window more memory than a restore should spend per object).
pub const LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// The default zstd level: zstd's own default, fast with a good ratio.
pub const DEFAULT_LEVEL: i32 = 3;

/// What a worker does to the objects it uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Every object stored raw.
    None,
    /// zstd at `level`, for objects whose sample compresses.
    Zstd { level: i32 },
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd {
            level: DEFAULT_LEVEL,
        }
    }
}

impl Compression {
    /// From the flags' words: `kind` is `zstd` or `none`; `level` (zstd only) must be in
    /// [`LEVELS`]. The error names the flag and what it takes.
    pub fn parse(kind: &str, level: Option<i64>) -> Result<Compression, AtRestError> {
        let bad = |detail: String| AtRestError::Settings { detail };
        match kind {
            "none" => Ok(Compression::None),
            "zstd" => {
                let level = level.unwrap_or(i64::from(DEFAULT_LEVEL));
                match i32::try_from(level) {
                    Ok(l) if LEVELS.contains(&l) => Ok(Compression::Zstd { level: l }),
                    _ => Err(bad(format!(
                        "--compression-level {level} is out of range: zstd levels are {} to {}",
                        LEVELS.start(),
                        LEVELS.end()
                    ))),
                }
            }
            other => Err(bad(format!(
                "--compression {other:?} is not a codec: use zstd or none"
            ))),
        }
    }
}

/// Why encoding or decoding an object failed.
#[derive(Debug, thiserror::Error)]
pub enum AtRestError {
    #[error("{detail}")]
    Settings { detail: String },
    #[error("{key}: {what}: {source}")]
    Io {
        key: String,
        what: &'static str,
        source: std::io::Error,
    },
    /// The plain bytes read do not match the CRC they were checked with.
    #[error(
        "{key}: the bytes read have CRC-32 {actual:08x}, not the {stated:08x} they were checked \
         with: the file changed after its check"
    )]
    Changed {
        key: String,
        stated: u32,
        actual: u32,
    },
    /// Stored bytes that do not decode to what the manifest states.
    #[error("{key}: {detail}")]
    Corrupt { key: String, detail: String },
    /// An encrypted object, and no key for its generation was given.
    #[error(
        "{key}: the object is encrypted and this build has no key to open it (nothing is written \
         from it)"
    )]
    Sealed { key: String },
}
