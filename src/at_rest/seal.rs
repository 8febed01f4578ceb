//! The encryption stage: between the compressor and the stored bytes (`crypto::stream`).
//!
//! - [`SealKey`] / [`OpenKey`]: a generation's data key ([`crate::crypto::DataKey`]); every
//!   object of the generation is sealed with it, bound to its object key (relative to the
//!   prefix). The data key itself lives only wrapped, in `gen/<g>/keys/` (`crypto::key_objects`).
//! - [`SealStage`]: `Identity` (no key) or `Sealed` ([`crate::crypto::SealWriter`]);
//!   [`OpenStage`]: `Identity` (a plain object) or `Opened` ([`crate::crypto::OpenWriter`]),
//!   which passes a chunk on only once it authenticated and fails at `finish` on a stream cut
//!   short. An encrypted object with no key is refused before any byte is written.
//!
//! # The keyed `plain_crc`
//! A manifest entry of a plain (or only compressed) object records `plain_crc`, the CRC-32
//! of its plain bytes. For a sealed object that would let anyone who reads the manifest
//! confirm a guess at a small object's content (a side file, a short segment). So a sealed
//! object's entry records instead the **plain tag** ([`plain_tag`]): the first 32 bits of
//! SHA-256 over a label, a MAC key derived from the generation's data key, the plain length
//! and the plain CRC-32. Without the data key it says nothing about the content; with it,
//! every comparison the worker made on plain CRCs still works at the same cost (the worker
//! knows the local file's length and CRC and computes the tag of them), and a decoder checks
//! it like a CRC. Why a tag of (length, CRC) and not a MAC over the bytes: reuse and resume
//! compare a local file against an entry by the CRC they already computed while checking the
//! file, and a second pass over every archive with a MAC would double that read; the tag has
//! the CRC's collision strength, which is what those comparisons relied on before, while
//! authenticity of the bytes comes from the AEAD of every chunk, not from this field.
//!
//! The tag is keyed per generation, so comparing against an entry of an earlier generation
//! needs that generation's data key: the worker opens it with its key file (or, in public-key
//! mode, where it cannot, it re-uploads instead of reusing).

use std::io::{self, Write};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::AtRestError;
use crate::crypto::{DataKey, OpenWriter, SealWriter};

/// A generation's data key as the at-rest stages use it.
#[derive(Clone)]
pub struct GenerationKey {
    data_key: Arc<DataKey>,
    mac_key: [u8; 32],
}

impl std::fmt::Debug for GenerationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GenerationKey(data key id {})", self.data_key.id())
    }
}

impl GenerationKey {
    pub fn new(data_key: DataKey) -> GenerationKey {
        let mut h = Sha256::new();
        h.update(b"mushroom-backup plain tag key v1\0");
        h.update(data_key.bytes());
        GenerationKey {
            mac_key: h.finalize().into(),
            data_key: Arc::new(data_key),
        }
    }

    pub fn data_key(&self) -> &DataKey {
        &self.data_key
    }

    /// The keyed value a sealed object's entry records as `plain_crc` (see the module docs).
    pub fn plain_tag(&self, plain_len: u64, plain_crc: u32) -> u32 {
        let mut h = Sha256::new();
        h.update(b"mushroom-backup plain tag v1\0");
        h.update(self.mac_key);
        h.update(plain_len.to_le_bytes());
        h.update(plain_crc.to_le_bytes());
        let d = h.finalize();
        u32::from_le_bytes([d[0], d[1], d[2], d[3]])
    }
}

/// The key a seal stage encrypts with.
pub type SealKey = GenerationKey;
/// The key an open stage decrypts with.
pub type OpenKey = GenerationKey;

/// Whether an entry's plain length and (possibly keyed) CRC are those of plain bytes of
/// `len` and CRC-32 `crc`: a plain entry compares the CRC, a sealed one the tag under `key`
/// (its generation's); a sealed entry without its key matches nothing.
pub fn plain_matches(
    entry: &crate::manifest::ObjectEntry,
    len: u64,
    crc: u32,
    key: Option<&GenerationKey>,
) -> bool {
    if entry.plain_len() != len {
        return false;
    }
    if !entry.encrypted {
        return entry.plain_crc() == crc;
    }
    key.is_some_and(|k| entry.plain_crc() == k.plain_tag(len, crc))
}

/// Between the compressor and the stored bytes.
pub enum SealStage<W: Write> {
    Identity(W),
    Sealed(SealWriter<W>),
}

impl<W: Write> SealStage<W> {
    /// The stage for `object_key`, which a seal binds the ciphertext to (its header is
    /// written to `inner` here).
    pub fn new(key: Option<&SealKey>, object_key: &str, inner: W) -> io::Result<SealStage<W>> {
        Ok(match key {
            None => SealStage::Identity(inner),
            Some(k) => SealStage::Sealed(SealWriter::new(inner, k.data_key(), object_key)?),
        })
    }

    pub fn finish(self) -> io::Result<W> {
        match self {
            SealStage::Identity(w) => Ok(w),
            SealStage::Sealed(s) => s.finish(),
        }
    }
}

impl<W: Write> Write for SealStage<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SealStage::Identity(w) => w.write(buf),
            SealStage::Sealed(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SealStage::Identity(w) => w.flush(),
            SealStage::Sealed(s) => s.flush(),
        }
    }
}

/// Between the stored bytes and the decompressor.
pub enum OpenStage<W: Write> {
    Identity(W),
    Opened(OpenWriter<W>),
}

impl<W: Write> OpenStage<W> {
    /// The stage for an object; an encrypted one with no key is refused before any byte of
    /// it is written anywhere.
    pub fn new(
        encrypted: bool,
        key: Option<&OpenKey>,
        object_key: &str,
        inner: W,
    ) -> Result<OpenStage<W>, AtRestError> {
        match (encrypted, key) {
            (false, _) => Ok(OpenStage::Identity(inner)),
            (true, None) => Err(AtRestError::Sealed {
                key: object_key.to_string(),
            }),
            (true, Some(k)) => Ok(OpenStage::Opened(OpenWriter::new(
                inner,
                k.data_key(),
                object_key,
            ))),
        }
    }

    /// Ends the stream; errors when a sealed stream was truncated.
    pub fn finish(self) -> io::Result<W> {
        match self {
            OpenStage::Identity(w) => Ok(w),
            OpenStage::Opened(o) => o.finish(),
        }
    }
}

impl<W: Write> Write for OpenStage<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            OpenStage::Identity(w) => w.write(buf),
            OpenStage::Opened(o) => o.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            OpenStage::Identity(w) => w.flush(),
            OpenStage::Opened(o) => o.flush(),
        }
    }
}
