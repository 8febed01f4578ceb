//! Wrapped data keys in the bucket: one small object per generation and key-encryption key.
//!
//! ```text
//! gen/<generation:010>/keys/<kek-id>.key     a WrappedKey (JSON); written once
//! ```
//!
//! A generation is encrypted exactly when it has at least one wrapper. Wrappers are
//! write-once (`If-None-Match: *`); a 412 is accepted when the object there is the same
//! wrapper (a retry, or an earlier run that crashed before hearing the answer): byte for byte,
//! or (age wrappers are randomized) the same KEK id, binding and data key id, and for a key
//! file's wrapper one that opens to the same data key. Anything else there is refused.
//!
//! A writer of a generation writes its wrappers right after its GENERATION claim and before
//! any data object of it (so a generation with data always has its key in the bucket);
//! [`wrap_generation_key`] writes one per KEK. Retention treats `keys/` like the claim:
//! part of the generation, deleted only with it (`worker::retention`).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use uuid::Uuid;

use crate::bucket::{self, Bucket, BucketError, PutCondition};
use crate::manifest;

use super::keys::{DataKey, KekId, list_ids};
use super::wrapper::{Binding, UnwrapKek, WrapError, WrapKek, WrappedKey};

/// The generations (with their lineages) whose keys open the encrypted ones of `entries`:
/// each once, in order, whatever number of entries name it.
pub fn generations_to_open<'e>(
    entries: impl IntoIterator<Item = &'e manifest::ObjectEntry>,
) -> BTreeSet<(u64, Uuid)> {
    entries
        .into_iter()
        .filter(|e| e.encrypted)
        .map(|e| (e.generation, e.lineage))
        .collect()
}

/// The folder of a generation's wrappers.
pub fn keys_prefix(generation: u64) -> String {
    format!("{}keys/", manifest::generation_prefix(generation))
}

/// The object key of a generation's wrapper for one KEK.
pub fn wrapper_key(generation: u64, kek: &KekId) -> String {
    format!("{}{kek}.key", keys_prefix(generation))
}

/// The generation and KEK id a wrapper's object key names, if it is one.
pub fn parse_wrapper_key(key: &str) -> Option<(u64, KekId)> {
    let generation = manifest::parse_generation(key)?;
    let id = key
        .strip_prefix(&keys_prefix(generation))?
        .strip_suffix(".key")?;
    Some((generation, KekId::parse(id)?))
}

/// Whether `key` is a wrapper's (for retention and scans that must leave wrappers alone).
pub fn is_wrapper_key(key: &str) -> bool {
    parse_wrapper_key(key).is_some()
}

/// Why a generation's key could not be written or opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KeyObjectError {
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error(transparent)]
    Wrapper(#[from] WrapError),
    #[error("generation {generation} has no wrapped data key: it is not encrypted")]
    NotEncrypted { generation: u64 },
    #[error(
        "no key given for encrypted generation {generation} (wrapped for key ids {})",
        list_ids(wrapped_for)
    )]
    NoKeyGiven {
        generation: u64,
        wrapped_for: Vec<KekId>,
    },
    #[error(
        "the key given (id {}) is not one generation {generation} is wrapped for ({})",
        list_ids(given),
        list_ids(wrapped_for)
    )]
    NotWrappedFor {
        generation: u64,
        given: Vec<KekId>,
        wrapped_for: Vec<KekId>,
    },
    #[error("{key}: another wrapper is already there (for another data key or binding)")]
    Conflict { key: String },
}

/// How [`write_wrapper`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    New,
    AlreadyThere,
}

/// Writes a wrapper once; see the module docs for what an existing one must be. `check`,
/// when given, is a key that must open an existing wrapper to `data_key` (a key file's).
pub async fn write_wrapper(
    bucket: &dyn Bucket,
    wrapped: &WrappedKey,
    data_key: &DataKey,
    check: Option<&UnwrapKek>,
) -> Result<Written, KeyObjectError> {
    let key = wrapper_key(wrapped.generation, &wrapped.kek_id);
    let body = Bytes::from(wrapped.encode());
    match bucket
        .put(&key, body.clone().into(), PutCondition::IfNoneMatch)
        .await
    {
        Ok(_) => return Ok(Written::New),
        Err(BucketError::PreconditionFailed { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let there = bucket.get(&key).await?;
    if there.data == body {
        return Ok(Written::AlreadyThere);
    }
    let conflict = || KeyObjectError::Conflict { key: key.clone() };
    let Ok(other) = WrappedKey::decode(&key, &there.data) else {
        return Err(conflict());
    };
    let same = other.kek_id == wrapped.kek_id
        && other.kind == wrapped.kind
        && other.lineage == wrapped.lineage
        && other.generation == wrapped.generation
        && other.data_key_id == data_key.id();
    if !same {
        return Err(conflict());
    }
    if let Some(kek) = check {
        let binding = Binding {
            lineage: wrapped.lineage,
            generation: wrapped.generation,
        };
        match other.unwrap(&key, kek, binding) {
            Ok(k) if &k == data_key => {}
            _ => return Err(conflict()),
        }
    }
    Ok(Written::AlreadyThere)
}

/// Wraps a generation's data key for every KEK and writes the wrappers (what a writer does
/// right after claiming the generation).
pub async fn wrap_generation_key(
    bucket: &dyn Bucket,
    binding: Binding,
    data_key: &DataKey,
    keks: &[WrapKek],
) -> Result<(), KeyObjectError> {
    for kek in keks {
        let wrapped = kek.wrap(data_key, binding)?;
        let check = match kek {
            WrapKek::KeyFile(k) => Some(UnwrapKek::KeyFile(k.clone())),
            WrapKek::Recipient(_) => None,
        };
        write_wrapper(bucket, &wrapped, data_key, check.as_ref()).await?;
    }
    Ok(())
}

/// The KEK ids a generation is wrapped for, in order.
pub async fn list_wrappers(
    bucket: &dyn Bucket,
    generation: u64,
) -> Result<Vec<KekId>, BucketError> {
    Ok(bucket::list_all(bucket, &keys_prefix(generation))
        .await?
        .into_iter()
        .filter_map(|o| parse_wrapper_key(&o.key))
        .filter(|(g, _)| *g == generation)
        .map(|(_, id)| id)
        .collect())
}

/// Every generation under the prefix that has wrappers, with their KEK ids. Lists all of
/// `gen/` (segments included): a cost for `rekey` and scans, never for the steady state.
pub async fn generations_with_wrappers(
    bucket: &dyn Bucket,
) -> Result<BTreeMap<u64, BTreeSet<KekId>>, BucketError> {
    let mut out: BTreeMap<u64, BTreeSet<KekId>> = BTreeMap::new();
    for o in bucket::list_all(bucket, manifest::GEN_PREFIX).await? {
        if let Some((g, id)) = parse_wrapper_key(&o.key) {
            out.entry(g).or_default().insert(id);
        }
    }
    Ok(out)
}

/// Reads and parses one wrapper; `None` when it is not there.
pub async fn read_wrapper(
    bucket: &dyn Bucket,
    generation: u64,
    kek: &KekId,
) -> Result<Option<WrappedKey>, KeyObjectError> {
    let key = wrapper_key(generation, kek);
    match bucket.get(&key).await {
        Ok(o) => Ok(Some(WrappedKey::decode(&key, &o.data)?)),
        Err(BucketError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A generation's data key, and the KEK that opened it.
#[derive(Debug, Clone)]
pub struct OpenedKey {
    pub data_key: DataKey,
    pub kek_id: KekId,
}

/// Opens generation `generation` of `lineage` with the first of `keks` it is wrapped for.
pub async fn open_generation_key(
    bucket: &dyn Bucket,
    lineage: Uuid,
    generation: u64,
    keks: &[UnwrapKek],
) -> Result<OpenedKey, KeyObjectError> {
    let wrapped_for = list_wrappers(bucket, generation).await?;
    if wrapped_for.is_empty() {
        return Err(KeyObjectError::NotEncrypted { generation });
    }
    if keks.is_empty() {
        return Err(KeyObjectError::NoKeyGiven {
            generation,
            wrapped_for,
        });
    }
    let binding = Binding {
        lineage,
        generation,
    };
    let mut last = None;
    for kek in keks.iter().filter(|k| wrapped_for.contains(k.id())) {
        let key = wrapper_key(generation, kek.id());
        let opened = match read_wrapper(bucket, generation, kek.id()).await? {
            // Deleted since the listing (a rekey finishing): try the next key.
            None => continue,
            Some(w) => w.unwrap(&key, kek, binding),
        };
        match opened {
            Ok(data_key) => {
                return Ok(OpenedKey {
                    data_key,
                    kek_id: kek.id().clone(),
                });
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e.into()),
        None => Err(KeyObjectError::NotWrappedFor {
            generation,
            given: keks.iter().map(|k| k.id().clone()).collect(),
            wrapped_for,
        }),
    }
}
