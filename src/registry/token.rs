//! Node tokens: the secret a database node presents to report positions for its store.
//!
//! `Register` hands the token out once; the registry keeps only [`hash_token`] of it. A token
//! is 32 bytes from the operating system's CSPRNG (two v4 UUIDs, 244 random bits) written as
//! 64 hex digits, so an unsalted SHA-256 is enough: there is no dictionary to try. Tokens and
//! their hashes are never logged; [`token_matches`] compares in constant time.

use sha2::{Digest, Sha256};

/// A fresh node token: 64 lowercase hex digits.
pub fn new_node_token() -> String {
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    hex::encode(bytes)
}

/// The hash stored for `token`: SHA-256, 64 lowercase hex digits.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `token` hashes to `hash` (as [`hash_token`] writes it). The comparison takes the
/// same time wherever the first difference is.
pub fn token_matches(token: &str, hash: &str) -> bool {
    let actual = hash_token(token);
    let (a, b) = (actual.as_bytes(), hash.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}
