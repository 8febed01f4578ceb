//! The worker's generation keys (`src/crypto/`, `src/at_rest/seal.rs`): making a new
//! generation's data key and writing its wrappers, opening an existing generation's key on
//! resume or for reuse, and refusing a prefix of the other kind (plaintext vs encrypted).
//!
//! Invariants:
//! - A new generation's wrappers (one per wrapping key configured) are written right after
//!   its GENERATION claim and before any data object of it ([`new_generation_key`] is called
//!   by `generation::start` between the two), so no data object exists without its key in
//!   the bucket. A crash in between leaves a claim with wrappers and no data: retention
//!   removes it (and its wrappers) as an orphan.
//! - A configured writer never uploads plaintext: without a key for the current generation
//!   (public-key mode after a restart: the worker can wrap but not unwrap) it does not
//!   continue that generation but starts a new one, re-uploading what it cannot compare.
//! - [`check_mixing`] refuses (a refusal: nothing uploaded or deleted) a plaintext writer on a
//!   prefix with encrypted generations and an encrypting writer on one with plaintext
//!   generations, unless `allow_mixed_encryption` is set.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::WorkerError;
use super::ctx::Ctx;
use super::view::View;
use crate::at_rest::seal::GenerationKey;
use crate::bucket::ObjectMeta;
use crate::crypto::key_objects::{self, KeyObjectError};
use crate::crypto::{Binding, DataKey, Encryption};
use crate::manifest;

fn key_error(e: KeyObjectError) -> WorkerError {
    match e {
        KeyObjectError::Bucket(b) => WorkerError::Bucket(b),
        // A wrapper there that is not this run's, or that does not decode.
        other => WorkerError::BadBucket {
            key: "gen/*/keys/".into(),
            detail: other.to_string(),
        },
    }
}

/// Makes generation `number`'s data key and writes its wrappers; `None` when the worker
/// writes plaintext.
pub(super) async fn new_generation_key(
    cx: &Ctx<'_>,
    view: &mut View,
    number: u64,
) -> Result<Option<GenerationKey>, WorkerError> {
    let Some(enc) = &cx.encryption.keys else {
        return Ok(None);
    };
    let data_key = DataKey::generate();
    let binding = Binding {
        lineage: view.lineage,
        generation: number,
    };
    key_objects::wrap_generation_key(cx.bucket.as_ref(), binding, &data_key, &enc.wrap)
        .await
        .map_err(key_error)?;
    let key = GenerationKey::new(data_key);
    view.keys.insert(number, Some(key.clone()));
    Ok(Some(key))
}

/// Generation `generation`'s key, opened with the configured unwrapping keys and cached in
/// the view; `None` when the worker writes plaintext, has no key that opens it (public-key
/// mode), or the generation is not encrypted.
pub(super) async fn open_key(
    cx: &Ctx<'_>,
    view: &mut View,
    lineage: Uuid,
    generation: u64,
) -> Result<Option<GenerationKey>, WorkerError> {
    if let Some(k) = view.keys.get(&generation) {
        return Ok(k.clone());
    }
    let enc = cx.encryption.keys.as_ref();
    let key = open_uncached(cx.bucket.as_ref(), enc, lineage, generation).await?;
    view.keys.insert(generation, key.clone());
    Ok(key)
}

/// [`open_key`] without a view (resume, before the view exists).
pub(super) async fn open_uncached(
    bucket: &dyn crate::bucket::Bucket,
    encryption: Option<&Encryption>,
    lineage: Uuid,
    generation: u64,
) -> Result<Option<GenerationKey>, WorkerError> {
    let Some(enc) = encryption else {
        return Ok(None);
    };
    if enc.unwrap.is_empty() {
        return Ok(None);
    }
    match key_objects::open_generation_key(bucket, lineage, generation, &enc.unwrap).await {
        Ok(opened) => Ok(Some(GenerationKey::new(opened.data_key))),
        Err(KeyObjectError::Bucket(b)) => Err(WorkerError::Bucket(b)),
        Err(e) => {
            tracing::info!(generation, error = %e, "no key opens this generation: not reused");
            Ok(None)
        }
    }
}

/// Opens the keys of the earlier generations `entries` name (for reuse comparisons).
pub(super) async fn open_keys_of<'e>(
    cx: &Ctx<'_>,
    view: &mut View,
    entries: impl IntoIterator<Item = &'e manifest::ObjectEntry>,
) -> Result<(), WorkerError> {
    for (g, lineage) in key_objects::generations_to_open(entries) {
        open_key(cx, view, lineage, g).await?;
    }
    Ok(())
}

/// Refuses a prefix of the other kind (see the module docs), from the listing of `gen/`: a
/// generation is encrypted when it has a wrapper, plaintext when it has data objects and no
/// wrapper (a claim alone is neither).
pub(super) fn check_mixing(
    listing: &[ObjectMeta],
    encrypting: bool,
    allow_mixed: bool,
) -> Result<(), WorkerError> {
    if allow_mixed {
        return Ok(());
    }
    let mut wrapped = BTreeSet::new();
    let mut with_data = BTreeSet::new();
    for o in listing {
        let Some(g) = manifest::parse_generation(&o.key) else {
            continue;
        };
        if key_objects::is_wrapper_key(&o.key) {
            wrapped.insert(g);
        } else if o.key != manifest::generation_key(g) {
            with_data.insert(g);
        }
    }
    let plaintext: Vec<u64> = with_data.difference(&wrapped).copied().collect();
    let reason = match (encrypting, wrapped.first(), plaintext.first()) {
        (false, Some(g), _) => format!(
            "the prefix holds encrypted generations (generation {g} and {} in all) and this \
             backup has no encryption key: give the prefix's key (--encryption-key-file or \
             --encryption-recipient), or --allow-mixed-encryption to write plaintext beside them",
            wrapped.len()
        ),
        (true, _, Some(g)) => format!(
            "the prefix holds plaintext generations (generation {g} and {} in all) and this \
             backup encrypts: back up to a new prefix, or give --allow-mixed-encryption",
            plaintext.len()
        ),
        _ => return Ok(()),
    };
    Err(WorkerError::Refused { reason })
}
