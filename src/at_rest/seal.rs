//! The seam of the encryption stage, identity today.
//!
//! Encryption (`src/crypto/`, landing later) provides push-based `SealWriter<W: Write>` and
//! `OpenWriter<W: Write>` (`Write`, with `finish()` returning the inner writer; `finish` on
//! an open stage errors if the stream was truncated), keyed per generation and bound to the
//! object key. Integrating it is a change to this file alone, plus the key in the options:
//! - give [`SealKey`] and [`OpenKey`] their real content (today they are uninhabited, so
//!   `Option<SealKey>` is always `None` and every match on `Some` is statically impossible);
//! - add `Sealed(SealWriter<W>)` to [`SealStage`] and `Opened(OpenWriter<W>)` to
//!   [`OpenStage`], made in [`SealStage::new`] / [`OpenStage::new`];
//! - [`super::encode`] then records `encrypted: true` (it already does when a key is given)
//!   and never falls back to raw storage for a sealed object.
//!
//! A manifest entry's `plain_crc` is a CRC of the plain bytes: with encryption on it would
//! let a reader of the manifest confirm a guess of a small object's content, so the crypto
//! stage should replace it by a keyed MAC (or encrypt it) for sealed objects.

use std::io::{self, Write};

use super::AtRestError;

/// The key a seal stage encrypts with. Uninhabited until encryption lands.
#[derive(Debug, Clone)]
pub enum SealKey {}

/// The key an open stage decrypts with. Uninhabited until encryption lands.
#[derive(Debug, Clone)]
pub enum OpenKey {}

/// Between the compressor and the stored bytes.
pub enum SealStage<W: Write> {
    Identity(W),
}

impl<W: Write> SealStage<W> {
    /// The stage for `object_key` (which a real seal binds the ciphertext to).
    pub fn new(key: Option<&SealKey>, _object_key: &str, inner: W) -> SealStage<W> {
        match key {
            None => SealStage::Identity(inner),
            Some(k) => match *k {},
        }
    }

    pub fn finish(self) -> io::Result<W> {
        match self {
            SealStage::Identity(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for SealStage<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            SealStage::Identity(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            SealStage::Identity(w) => w.flush(),
        }
    }
}

/// Between the stored bytes and the decompressor.
pub enum OpenStage<W: Write> {
    Identity(W),
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
            (true, Some(k)) => match *k {},
        }
    }

    /// Ends the stream; a real open stage errors here when the stream was truncated.
    pub fn finish(self) -> io::Result<W> {
        match self {
            OpenStage::Identity(w) => Ok(w),
        }
    }
}

impl<W: Write> Write for OpenStage<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            OpenStage::Identity(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            OpenStage::Identity(w) => w.flush(),
        }
    }
}
