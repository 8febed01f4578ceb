//! The sealed object format: a streaming AEAD (RustCrypto's STREAM construction over
//! XChaCha20-Poly1305, big-endian 32-bit counter) as two push-based [`Write`] stages.
//!
//! ```text
//! header (35 bytes)  magic "MBSEAL" (6) | format version u16 LE = 1 (2)
//!                    | data key id (8) | nonce prefix (19, random per object)
//! chunk 0 .. n-1     ciphertext of CHUNK plain bytes + 16-byte tag   (flag "not last")
//! chunk n            ciphertext of 0..=CHUNK plain bytes + 16-byte tag (flag "last")
//! ```
//!
//! Every chunk's associated data is the whole header followed by the object's key (relative
//! to the prefix, e.g. `gen/0000000003/snapshot.bin`), so an object copied under another key,
//! a header edited, a chunk moved, dropped, duplicated or reordered, a stream cut at a chunk
//! boundary or extended past its last chunk all fail authentication: STREAM puts the chunk's
//! counter and the last-chunk flag in each nonce. There is always exactly one last chunk
//! (an empty object is a header and one empty last chunk), and a full chunk is sealed as
//! "not last" only once a byte past it arrives, so a plain length that is an exact multiple
//! of [`CHUNK`] ends in a full last chunk, never an extra empty one.
//!
//! The stored length is a function of the plain length alone ([`sealed_len`]), so a manifest
//! that records both can be checked without the key.
//!
//! Memory: each stage holds one chunk (64 KiB + tag), whatever the object's size.
//!
//! [`OpenWriter`] passes a chunk's plaintext on only after that chunk authenticated; an
//! object is whole only when [`OpenWriter::finish`] succeeds (a stream cut short has passed
//! on its authenticated chunks and then fails at `finish`). A consumer writes into a
//! temporary it discards on any error, as restore does. After any error a stage refuses
//! every further write.
//!
//! The data key id in the header (a hash of the data key, [`DataKey::id`]) tells "sealed with
//! another generation's key" apart from "damaged" in the error; it reveals nothing usable
//! about the key.

use std::io::{self, Write};

use chacha20poly1305::aead::KeyInit;
use chacha20poly1305::aead::generic_array::GenericArray;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::{Key, XChaCha20Poly1305};

use super::keys::DataKey;

/// Plain bytes per chunk.
pub const CHUNK: usize = 64 * 1024;
/// The AEAD tag each chunk carries.
pub const TAG: usize = 16;
/// The header's magic.
pub const MAGIC: &[u8; 6] = b"MBSEAL";
/// The format version this code writes and reads.
pub const VERSION: u16 = 1;
/// STREAM's nonce prefix for XChaCha20 (24 bytes less the 5 of counter and flag).
pub const NONCE_PREFIX: usize = 19;
/// Header bytes: magic, version, data key id, nonce prefix.
pub const HEADER: usize = 6 + 2 + 8 + NONCE_PREFIX;

/// The stored length of an object of `plain_len` plain bytes: header, every chunk's bytes
/// and one tag per chunk (at least one chunk). `None` past `u64`.
pub fn sealed_len(plain_len: u64) -> Option<u64> {
    let chunk = CHUNK as u64;
    let chunks = plain_len.div_ceil(chunk).max(1);
    (HEADER as u64)
        .checked_add(plain_len)?
        .checked_add(chunks.checked_mul(TAG as u64)?)
}

/// The plain length of a sealed object of `stored_len` bytes, or `None` when no plain length
/// seals to it (the inverse of [`sealed_len`]).
pub fn plain_len(stored_len: u64) -> Option<u64> {
    let body = stored_len.checked_sub(HEADER as u64)?;
    let full = (CHUNK + TAG) as u64;
    let chunks = body.div_ceil(full).max(1);
    let plain = body.checked_sub(chunks * TAG as u64)?;
    (sealed_len(plain) == Some(stored_len)).then_some(plain)
}

/// Why a sealed stream was refused. Carried inside the `io::Error` of the stages (kind
/// `InvalidData`); `StreamError::of` gets it back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error(
        "{key}: not a sealed object (no {} header)",
        String::from_utf8_lossy(MAGIC)
    )]
    NotSealed { key: String },
    #[error("{key}: sealed object format {version}, this build reads only {VERSION}")]
    UnknownVersion { key: String, version: u16 },
    #[error("{key}: sealed with another data key (id {found}; the generation's key is {expected})")]
    OtherDataKey {
        key: String,
        found: String,
        expected: String,
    },
    #[error(
        "{key}: chunk {chunk} does not authenticate: the object is damaged, reordered, or stored under another key"
    )]
    Tampered { key: String, chunk: u64 },
    #[error("{key}: truncated: the stream ends before its last chunk")]
    Truncated { key: String },
    #[error("{key}: more than 2^32 chunks")]
    TooLong { key: String },
    #[error("{key}: the stream failed earlier; it takes no more writes")]
    Poisoned { key: String },
}

impl StreamError {
    /// The stream error inside an `io::Error` of [`SealWriter`] or [`OpenWriter`], if it is one.
    pub fn of(e: &io::Error) -> Option<&StreamError> {
        e.get_ref()?.downcast_ref::<StreamError>()
    }
}

impl From<StreamError> for io::Error {
    fn from(e: StreamError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

fn cipher(key: &DataKey) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(Key::from_slice(key.bytes()))
}

fn associated_data(header: &[u8], object_key: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(header.len() + object_key.len());
    aad.extend_from_slice(header);
    aad.extend_from_slice(object_key.as_bytes());
    aad
}

/// Plaintext in, sealed bytes out to `W`. Call [`SealWriter::finish`]: without it the last
/// chunk is never written and the object cannot be opened.
pub struct SealWriter<W: Write> {
    inner: W,
    key: String,
    aad: Vec<u8>,
    encryptor: Option<EncryptorBE32<XChaCha20Poly1305>>,
    buf: Vec<u8>,
    failed: bool,
}

impl<W: Write> SealWriter<W> {
    /// Starts a sealed object under `object_key` (its key relative to the prefix) with a fresh
    /// random nonce prefix, and writes its header to `inner`.
    pub fn new(mut inner: W, data_key: &DataKey, object_key: &str) -> io::Result<SealWriter<W>> {
        let mut nonce = [0u8; NONCE_PREFIX];
        chacha20poly1305::aead::OsRng.fill_bytes(&mut nonce);
        let mut header = Vec::with_capacity(HEADER);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&data_key.id_bytes());
        header.extend_from_slice(&nonce);
        inner.write_all(&header)?;
        let encryptor =
            EncryptorBE32::from_aead(cipher(data_key), GenericArray::from_slice(&nonce));
        Ok(SealWriter {
            inner,
            key: object_key.to_string(),
            aad: associated_data(&header, object_key),
            encryptor: Some(encryptor),
            buf: Vec::with_capacity(CHUNK + TAG),
            failed: false,
        })
    }

    fn seal_chunk(&mut self) -> io::Result<()> {
        let Some(enc) = self.encryptor.as_mut() else {
            return Err(self.poisoned());
        };
        if enc.encrypt_next_in_place(&self.aad, &mut self.buf).is_err() {
            self.failed = true;
            return Err(StreamError::TooLong {
                key: self.key.clone(),
            }
            .into());
        }
        let r = self.inner.write_all(&self.buf);
        self.buf.clear();
        r.inspect_err(|_| self.failed = true)
    }

    fn poisoned(&self) -> io::Error {
        StreamError::Poisoned {
            key: self.key.clone(),
        }
        .into()
    }

    /// Seals the last chunk, writes it, flushes and returns `W`.
    pub fn finish(mut self) -> io::Result<W> {
        if self.failed {
            return Err(self.poisoned());
        }
        let Some(enc) = self.encryptor.take() else {
            return Err(self.poisoned());
        };
        if enc.encrypt_last_in_place(&self.aad, &mut self.buf).is_err() {
            return Err(StreamError::TooLong {
                key: self.key.clone(),
            }
            .into());
        }
        self.inner.write_all(&self.buf)?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for SealWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(self.poisoned());
        }
        if data.is_empty() {
            return Ok(0);
        }
        // A full buffer is sealed as "not last" only now that a byte past it has come.
        if self.buf.len() == CHUNK {
            self.seal_chunk()?;
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    /// Flushes what is already sealed; a partial chunk stays buffered until it fills or
    /// [`SealWriter::finish`].
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Sealed bytes in, authenticated plaintext out to `W`; see the module docs for what is
/// passed on when.
pub struct OpenWriter<W: Write> {
    inner: W,
    key: String,
    data_key: DataKey,
    header: Vec<u8>,
    aad: Vec<u8>,
    decryptor: Option<DecryptorBE32<XChaCha20Poly1305>>,
    buf: Vec<u8>,
    chunk: u64,
    failed: bool,
}

impl<W: Write> OpenWriter<W> {
    /// Opens the sealed object stored under `object_key` with its generation's data key.
    pub fn new(inner: W, data_key: &DataKey, object_key: &str) -> OpenWriter<W> {
        OpenWriter {
            inner,
            key: object_key.to_string(),
            data_key: data_key.clone(),
            header: Vec::with_capacity(HEADER),
            aad: Vec::new(),
            decryptor: None,
            buf: Vec::with_capacity(CHUNK + TAG),
            chunk: 0,
            failed: false,
        }
    }

    fn fail(&mut self, e: StreamError) -> io::Error {
        self.failed = true;
        e.into()
    }

    fn read_header(&mut self) -> Result<(), StreamError> {
        let key = self.key.clone();
        let h = &self.header;
        if &h[..6] != MAGIC {
            return Err(StreamError::NotSealed { key });
        }
        let version = u16::from_le_bytes([h[6], h[7]]);
        if version != VERSION {
            return Err(StreamError::UnknownVersion { key, version });
        }
        let expected = self.data_key.id_bytes();
        if h[8..16] != expected {
            return Err(StreamError::OtherDataKey {
                key,
                found: hex::encode(&h[8..16]),
                expected: hex::encode(expected),
            });
        }
        let nonce = GenericArray::clone_from_slice(&h[16..HEADER]);
        self.decryptor = Some(DecryptorBE32::from_aead(cipher(&self.data_key), &nonce));
        self.aad = associated_data(&self.header, &self.key);
        Ok(())
    }

    /// Opens the full chunk in the buffer (more bytes follow it).
    fn open_chunk(&mut self) -> io::Result<()> {
        let Some(dec) = self.decryptor.as_mut() else {
            return Err(self.fail(StreamError::Poisoned {
                key: self.key.clone(),
            }));
        };
        if dec.decrypt_next_in_place(&self.aad, &mut self.buf).is_err() {
            let e = StreamError::Tampered {
                key: self.key.clone(),
                chunk: self.chunk,
            };
            return Err(self.fail(e));
        }
        self.chunk += 1;
        let r = self.inner.write_all(&self.buf);
        self.buf.clear();
        r.inspect_err(|_| self.failed = true)
    }

    /// Opens the last chunk, flushes and returns `W`; fails when the stream was cut short.
    pub fn finish(mut self) -> io::Result<W> {
        let key = self.key.clone();
        if self.failed {
            return Err(StreamError::Poisoned { key }.into());
        }
        let Some(dec) = self.decryptor.take() else {
            // Fewer bytes than a header: cut short, unless they are not a header at all.
            let n = self.header.len().min(MAGIC.len());
            return Err(if self.header[..n] == MAGIC[..n] {
                StreamError::Truncated { key }
            } else {
                StreamError::NotSealed { key }
            }
            .into());
        };
        if self.buf.len() < TAG {
            return Err(StreamError::Truncated { key }.into());
        }
        if dec.decrypt_last_in_place(&self.aad, &mut self.buf).is_err() {
            // A stream cut at a chunk boundary ends in a chunk sealed as "not last".
            return Err(StreamError::Tampered {
                key,
                chunk: self.chunk,
            }
            .into());
        }
        self.inner.write_all(&self.buf)?;
        self.inner.flush()?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for OpenWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(StreamError::Poisoned {
                key: self.key.clone(),
            }
            .into());
        }
        if data.is_empty() {
            return Ok(0);
        }
        if self.decryptor.is_none() {
            let n = data.len().min(HEADER - self.header.len());
            self.header.extend_from_slice(&data[..n]);
            if self.header.len() == HEADER {
                self.read_header().map_err(|e| self.fail(e))?;
            }
            return Ok(n);
        }
        // A full sealed chunk is opened as "not last" only once a byte past it has come.
        if self.buf.len() == CHUNK + TAG {
            self.open_chunk()?;
        }
        let n = data.len().min(CHUNK + TAG - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    /// Flushes what is already authenticated and passed on.
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
