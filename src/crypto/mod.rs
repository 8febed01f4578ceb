//! Client-side envelope encryption of a prefix's objects (issue 13; this extends DESIGN.md,
//! which has no encryption yet).
//!
//! # Envelope
//! Each **generation** has one random 256-bit **data key** ([`keys::DataKey`]). Every object
//! of the generation (snapshot, archives, segments, side files) is stored sealed with it in a
//! streaming, chunked AEAD ([`stream`]: STREAM over XChaCha20-Poly1305, 64 KiB chunks, a
//! 35-byte header with a random per-object nonce prefix, the object's key bound as associated
//! data). The data key is stored only **wrapped** by one or more key-encryption keys (KEKs),
//! each wrapper in its own small object beside the generation
//! (`gen/<generation:010>/keys/<kek-id>.key`, [`key_objects`], format in [`wrapper`]). KEKs
//! are a symmetric key file, or an age X25519 recipient (wrap) / identity (unwrap)
//! ([`keys`]). Manifests, GENERATION claims, LATEST and the lease stay in the clear: they name
//! objects, lengths and CRCs (of the stored, sealed bytes) and carry nothing of the store's
//! content.
//!
//! **Why a key per generation, not per object.** A generation is the unit a writer claims
//! and retention deletes, so its key lives and dies with it; one wrapper per generation and
//! KEK keeps the wrappers few (re-keying a prefix costs a few requests per generation, not
//! per object), and a restore opens one key per generation its restore point names (a
//! manifest entry may name an object of an earlier generation: it is opened with that
//! generation's key). One key over many objects is safe because every object has its own
//! random 152-bit nonce prefix (XChaCha20's 192-bit nonces leave room for it next to STREAM's
//! counter), so nonces do not repeat across objects; binding each object's key as associated
//! data stops objects being swapped within the generation. A per-object key would add a
//! wrapper per object (or a key table that is itself per generation) for no gain in what an
//! attacker without the KEK can do.
//!
//! **Object keys as associated data** are relative to the prefix, so a prefix copied to
//! another bucket or prefix still restores, while an object moved under another key of the
//! prefix does not.
//!
//! # Key ids
//! [`keys::KekId`]: 16 hex digits of SHA-256 over a label and the key (key file) or the
//! recipient (age; an identity has its recipient's id). They name keys in object keys and
//! errors ("wrapped for key ids X, Y") and reveal nothing usable.
//!
//! # Fail closed
//! [`config::EncryptionSettings::load`] reads and checks every key before a command touches
//! the bucket; a key that cannot be had is an error naming the flag and the file, never a
//! fallback to plaintext.
//!
//! # What a crash leaves
//! - A writer writes a generation's wrappers right after its GENERATION claim and before any
//!   of its data objects; a crash in between leaves a claim with some wrappers and no data
//!   (retention's orphan handling removes it with the claim). So every generation holding
//!   data has its key in the bucket.
//! - A sealed object is written whole or not at all (the bucket's own guarantee); a stream
//!   cut short is refused by [`stream::OpenWriter::finish`].
//! - `rekey` ([`rekey`]) keeps, at every request, a wrapper each generation opens with under
//!   the old or the new key; see its docs.
//!
//! # Where it is used
//! - The data path seals and opens through `at_rest::seal` (a sealed object's manifest entry
//!   records a keyed tag instead of its plain CRC; see there).
//! - The worker (`worker::keys`) makes a generation's data key and writes its wrappers right
//!   after the claim; on resume it opens the current generation's key with a key file, and
//!   in public-key mode (recipients only) starts a new generation instead. It refuses a
//!   prefix of the other kind (plaintext vs encrypted) unless `--allow-mixed-encryption`.
//! - Retention keeps a generation's wrappers while any object of it is named and deletes
//!   them after its last data object, before its claim.
//! - Restore (`restore::keys`) opens every generation key a restore point needs before it
//!   stages anything; verify reports each restore point's key ids, and with a key
//!   authenticates every chunk.

pub mod config;
pub mod key_objects;
pub mod keys;
pub mod rekey;
pub mod secret_file;
pub mod stream;
pub mod wrapper;

pub use config::{ConfigError, Encryption, EncryptionSettings, WriterEncryption};
pub use key_objects::{KeyObjectError, OpenedKey, open_generation_key, wrap_generation_key};
pub use keys::{AgeIdentity, AgeRecipient, DataKey, KekId, KeyError, KeyFileKey};
pub use secret_file::SecretFileError;
pub use stream::{OpenWriter, SealWriter, StreamError, sealed_len};
pub use wrapper::{Binding, UnwrapKek, WrapKek, WrappedKey};
