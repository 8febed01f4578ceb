//! Fresh key-encryption keys for the crypto tests, each as the pair a backup wraps with and a
//! restore unwraps with: a key file's symmetric key, or an age identity and its recipient.

use std::sync::Arc;

use mushroom_backup::crypto::{AgeIdentity, KeyFileKey, UnwrapKek, WrapKek};

/// A new key file's key, on both sides.
pub fn key_file_kek() -> (WrapKek, UnwrapKek) {
    let k = Arc::new(KeyFileKey::generate());
    (WrapKek::KeyFile(k.clone()), UnwrapKek::KeyFile(k))
}

/// A new age identity: its recipient wraps, the identity unwraps.
pub fn age_kek() -> (WrapKek, UnwrapKek) {
    let id = AgeIdentity::generate();
    (
        WrapKek::Recipient(id.recipient().clone()),
        UnwrapKek::Identity(id),
    )
}
