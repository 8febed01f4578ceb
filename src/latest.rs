//! The pointer to a prefix's newest restore point, in its two forms, and the write-once layout
//! (issue 29; DESIGN.md sections 4, 7 and 8 as they apply to a write-once prefix).
//!
//! # The two forms
//!
//! - **Mutable** (every prefix before issue 29, and the default): one object, `LATEST`,
//!   rewritten with `If-Match` on the ETag last written or read.
//! - **Write-once** (`--object-lock governance|compliance`): no object is ever rewritten. Each
//!   move of the pointer creates a new object `latest/<!seq>.json` ([`manifest::pointer_key`])
//!   with `If-None-Match: *`, holding what `LATEST` would: `seq` counts the moves from 1 and
//!   `!seq` is `u64::MAX - seq`, so S3's ascending listing puts the newest pointer first. A
//!   reader lists `latest/` with `max-keys=1` and GETs the one key listed. Creating `seq + 1`
//!   is the compare-and-swap that `If-Match` is for `LATEST`: the number alone makes the key,
//!   so a writer that lost its lease finds it taken (412) and stops, as it would on
//!   `LATEST`'s ETag. A retried create that finds its own pointer already there (same body)
//!   is its own write ([`crate::bucket::put_immutable`]). A move costs one PUT in either form.
//!
//! A prefix holds one form. Readers ([`read`]) try `LATEST` first (the mutable form, at no
//! added cost: one GET as before) and, only when there is none, the pointers (a LIST and a
//! GET more). A writer ([`read_as`]) reads its own form and refuses a prefix holding
//! the other: a write-once writer never writes `LATEST` into it, and a mutable writer never
//! hides a write-once prefix's pointers behind a `LATEST`. Both forms in one prefix means
//! someone wrote `LATEST` into a write-once prefix (with the writer's credentials, say): the
//! writer refuses it ([`LatestError::BothForms`]) and its health says so.
//!
//! # The rest of the write-once layout
//!
//! - **Objects**: every object (data, manifests, generation claims, key wrappers, pointers) is
//!   created once with an Object Lock retention ([`crate::bucket::write_once`]): mode
//!   `GOVERNANCE` or `COMPLIANCE` as configured, retained until its write plus the lock
//!   period, which the worker derives from the retention policy (the longest any restore
//!   point is kept, plus a day for clocks; `crate::worker::retention`).
//! - **Retention deletes nothing**: a write-once worker's retention pass is a no-op (it
//!   reports 0 deleted, sends no request). The bucket expires what is no longer kept: a
//!   lifecycle rule expiring noncurrent versions and removing expired-object delete markers,
//!   plus an `Expiration` of current versions after the lock period, documented in docs/immutable.md
//!   ("Immutable backups and a second copy"). A version cannot be removed before its retain-until date, so an
//!   early expiry is refused by the bucket, never a loss.
//! - **The lease** is the one key rewritten: `lease` in the prefix, written as before
//!   (`If-Match`, hinted as a frequent rewrite), without a retention, and deleted with
//!   `If-Match` on release. The writer's IAM policy (`deploy/iam/`) allows `DeleteObject` on
//!   that key alone. It holds no data: an attacker who deletes or rewrites it can stop backups
//!   (which health shows), never remove one.
//!
//! # What a crash leaves
//!
//! As in the mutable form: the manifest is created before its pointer, so a crash between the
//! two leaves a valid restore point no pointer names yet, which the next run's resume finds by
//! listing `manifests/`. A crash after a pointer's create leaves it in place; the next run
//! reads it as the newest. Nothing is half written: each object is all or nothing.
//!
//! # What it guarantees
//!
//! Against an attacker holding the writer's credentials: no locked version can be deleted or
//! overwritten before its retain-until date (`COMPLIANCE`: by no one; `GOVERNANCE`: by no one
//! without `s3:BypassGovernanceRetention`, which the writer's policy does not grant). The
//! attacker can still add: new versions and delete markers over a key, a newer pointer naming
//! an older restore point, a `LATEST`. So after an attack the restore points are all there
//! (`ls`, `restore --at` name them by their manifests), and the pointer is a hint to check.

use crate::bucket::{self, Body, Bucket, BucketError, Created, ListQuery};
use crate::manifest::{self, LATEST_KEY, Latest, ManifestError};

/// Which form of the pointer a prefix is written in (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    #[default]
    Mutable,
    WriteOnce,
}

/// Which version of the pointer was read or written: what the next move is conditional on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// `LATEST`'s ETag.
    Etag(String),
    /// The sequence number of the newest pointer.
    Pointer(u64),
}

/// The pointer as read.
#[derive(Debug, Clone)]
pub struct Found {
    /// The object it was read from (`LATEST`, or a pointer's key), for messages.
    pub key: String,
    pub version: Version,
    /// What it names, or why it does not decode.
    pub latest: Result<Latest, ManifestError>,
}

/// Why the pointer could not be read or moved.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LatestError {
    #[error(transparent)]
    Bucket(#[from] BucketError),
    /// The pointer was moved by someone else since it was read.
    #[error("{key}: moved by another writer")]
    Moved { key: String },
    /// The prefix holds the other form of the pointer.
    #[error(
        "the prefix holds {found}, the {form} form of the pointer to its newest restore point; \
         this writer writes the other form and refuses to mix them"
    )]
    OtherForm { found: String, form: &'static str },
    /// A write-once prefix with a `LATEST` beside its pointers.
    #[error(
        "the write-once prefix holds {LATEST_KEY} beside its pointers ({pointer}): written by \
         someone else; remove it (its writer's credentials may be compromised)"
    )]
    BothForms { pointer: String },
    /// A write-once prefix whose newest pointer leaves no number for the next one: one no
    /// writer made (a writer moving its pointer every second reaches [`POINTER_SEQ_MAX`] in
    /// nine million years).
    #[error(
        "the write-once prefix's newest pointer {key} has the number {seq}, past any a writer \
         reaches ({POINTER_SEQ_MAX}): written by someone else (its writer's credentials may be \
         compromised), and no later pointer can be made; the restore points are all there (`ls` \
         names them): back up to a new prefix, or remove that pointer with the permission to \
         bypass its lock"
    )]
    NoNextPointer { key: String, seq: u64 },
}

/// The largest pointer number a write-once writer creates (2^48): a pointer past it was
/// planted, and is refused by name rather than taken as a move by another writer.
pub const POINTER_SEQ_MAX: u64 = 1 << 48;

/// The newest pointer of a write-once prefix: a LIST of `latest/` for one key, and a GET of
/// it. A first key that is not a pointer's, or a pointer deleted between the two (under a
/// lifecycle rule), reads as a pointer that does not decode.
pub async fn newest_pointer(bucket: &dyn Bucket) -> Result<Option<Found>, BucketError> {
    let page = bucket
        .list(ListQuery::new(manifest::POINTERS_PREFIX, None, 1))
        .await?;
    let Some(o) = page.objects.into_iter().next() else {
        return Ok(None);
    };
    let bad = |detail: &str| {
        Err(ManifestError::Parse {
            key: o.key.clone(),
            detail: detail.into(),
        })
    };
    let Some(seq) = manifest::parse_pointer_key(&o.key) else {
        return Ok(Some(Found {
            latest: bad("not a pointer's key"),
            key: o.key,
            version: Version::Pointer(0),
        }));
    };
    let latest = match bucket.get(&o.key).await {
        Ok(got) => Latest::decode(&got.data).map_err(|e| ManifestError::Parse {
            key: o.key.clone(),
            detail: e.to_string(),
        }),
        Err(BucketError::NotFound { .. }) => bad("listed, then gone"),
        Err(e) => return Err(e),
    };
    Ok(Some(Found {
        key: o.key,
        version: Version::Pointer(seq),
        latest,
    }))
}

/// `LATEST` as it is, if there is one.
async fn mutable(bucket: &dyn Bucket) -> Result<Option<Found>, BucketError> {
    match bucket.get(LATEST_KEY).await {
        Ok(o) => Ok(Some(Found {
            key: LATEST_KEY.into(),
            version: Version::Etag(o.etag),
            latest: Latest::decode(&o.data),
        })),
        Err(BucketError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The pointer to the newest restore point, in whichever form the prefix holds: `LATEST`,
/// or (none there) the newest pointer. `None`: neither.
pub async fn read(bucket: &dyn Bucket) -> Result<Option<Found>, BucketError> {
    match mutable(bucket).await? {
        Some(found) => Ok(Some(found)),
        None => newest_pointer(bucket).await,
    }
}

/// The pointer as a writer of `form` reads it: its own form, the other refused (module docs).
/// A write-once writer pays a GET of `LATEST` more than a reader (at resume). A mutable
/// writer reads `LATEST` alone, as it always has: where there is none, it calls
/// [`refuse_pointers`] only if the prefix holds manifests (never for an empty prefix), so the
/// mutable layout costs no request more.
pub async fn read_as(bucket: &dyn Bucket, form: Form) -> Result<Option<Found>, LatestError> {
    match form {
        Form::Mutable => Ok(mutable(bucket).await?),
        Form::WriteOnce => {
            let pointer = newest_pointer(bucket).await?;
            match (mutable(bucket).await?, pointer) {
                (Some(_), Some(p)) => Err(LatestError::BothForms { pointer: p.key }),
                (Some(_), None) => Err(LatestError::OtherForm {
                    found: LATEST_KEY.into(),
                    form: "mutable",
                }),
                (None, pointer) => Ok(pointer),
            }
        }
    }
}

/// For a mutable writer that found manifests but no `LATEST`: refuses a write-once prefix
/// (one holding pointers). One LIST.
pub async fn refuse_pointers(bucket: &dyn Bucket) -> Result<(), LatestError> {
    match newest_pointer(bucket).await? {
        Some(p) => Err(LatestError::OtherForm {
            found: p.key,
            form: "write-once",
        }),
        None => Ok(()),
    }
}

/// Moves the pointer to `latest`, conditional on `prev` (the version read or last written;
/// `None`: there was none), in the form `prev` is of, or `form` for a first pointer. With
/// `conditional` off (object stores without conditional writes; mutable form only) `LATEST`
/// is written plainly. Returns the version written.
pub async fn write(
    bucket: &dyn Bucket,
    latest: &Latest,
    prev: Option<&Version>,
    form: Form,
    conditional: bool,
) -> Result<Version, LatestError> {
    use crate::bucket::PutCondition as C;
    let mutable_cond = match (prev, form) {
        (Some(Version::Etag(_)), Form::WriteOnce) | (Some(Version::Pointer(_)), Form::Mutable) => {
            return Err(LatestError::OtherForm {
                found: "a pointer of the other form".into(),
                form: match form {
                    Form::Mutable => "write-once",
                    Form::WriteOnce => "mutable",
                },
            });
        }
        (_, Form::WriteOnce) => None,
        (_, Form::Mutable) if !conditional => Some(C::None),
        (Some(Version::Etag(etag)), Form::Mutable) => Some(C::IfMatch(etag.clone())),
        (_, Form::Mutable) => Some(C::IfNoneMatch),
    };
    if let Some(cond) = mutable_cond {
        return match bucket
            .put(LATEST_KEY, Body::from(latest.encode()), cond)
            .await
        {
            Ok(etag) => Ok(Version::Etag(etag)),
            Err(BucketError::PreconditionFailed { .. }) => Err(LatestError::Moved {
                key: LATEST_KEY.into(),
            }),
            Err(e) => Err(e.into()),
        };
    }
    let seq = match prev {
        Some(Version::Pointer(n)) if *n >= POINTER_SEQ_MAX => {
            return Err(LatestError::NoNextPointer {
                key: manifest::pointer_key(*n),
                seq: *n,
            });
        }
        Some(Version::Pointer(n)) => n + 1,
        _ => 1,
    };
    let key = manifest::pointer_key(seq);
    let body = Body::from(latest.encode());
    match bucket::put_immutable(bucket, &key, body, &C::IfNoneMatch).await {
        Ok(Created::New(_) | Created::AlreadyThere(_)) => Ok(Version::Pointer(seq)),
        Err(BucketError::PreconditionFailed { .. }) => Err(LatestError::Moved { key }),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::mem::MemBucket;

    fn at(commit_seq: u64) -> Latest {
        Latest {
            manifest: manifest::manifest_key(commit_seq),
            commit_seq,
            lineage: uuid::Uuid::from_u128(7),
            adopted_by: None,
            adopted_at: None,
        }
    }

    #[tokio::test]
    async fn pointers_move_by_creating_the_next_number_and_the_newest_is_read() {
        let b = MemBucket::new();
        assert!(read(&b).await.unwrap().is_none());
        let v1 = write(&b, &at(10), None, Form::WriteOnce, true)
            .await
            .unwrap();
        assert_eq!(v1, Version::Pointer(1));
        let v2 = write(&b, &at(20), Some(&v1), Form::WriteOnce, true)
            .await
            .unwrap();
        let found = read(&b).await.unwrap().unwrap();
        assert_eq!((found.version, found.latest.unwrap()), (v2.clone(), at(20)));
        // A pointer numbered past any writer's (security review 4, finding 6: u64::MAX made
        // every later move fail as "moved by another writer", for good): refused by name.
        let planted = Version::Pointer(u64::MAX);
        let e = write(&b, &at(30), Some(&planted), Form::WriteOnce, true)
            .await
            .unwrap_err();
        assert!(
            matches!(e, LatestError::NoNextPointer { seq: u64::MAX, .. })
                && e.to_string().contains("written by someone else"),
            "{e}"
        );
        // A writer still at pointer 1 finds 2 taken by other content: moved.
        let e = write(&b, &at(15), Some(&v1), Form::WriteOnce, true)
            .await
            .unwrap_err();
        assert!(matches!(e, LatestError::Moved { .. }), "{e}");
        // A retry of its own create (same content) is its own write.
        assert_eq!(
            write(&b, &at(20), Some(&v1), Form::WriteOnce, true)
                .await
                .unwrap(),
            v2
        );
        assert!(b.head(LATEST_KEY).await.unwrap().is_none());
        assert!(read_as(&b, Form::Mutable).await.unwrap().is_none());
        let e = refuse_pointers(&b).await.unwrap_err();
        assert!(e.to_string().contains("write-once form"), "{e}");
        // A LATEST written beside the pointers: readers see it, the writer refuses.
        b.put(
            LATEST_KEY,
            Body::from(at(1).encode()),
            crate::bucket::PutCondition::None,
        )
        .await
        .unwrap();
        let e = read_as(&b, Form::WriteOnce).await.unwrap_err();
        assert!(matches!(e, LatestError::BothForms { .. }), "{e}");
    }

    #[tokio::test]
    async fn the_mutable_form_is_latest_rewritten_by_etag() {
        let b = MemBucket::new();
        let v1 = write(&b, &at(10), None, Form::Mutable, true).await.unwrap();
        let found = read_as(&b, Form::Mutable).await.unwrap().unwrap();
        assert_eq!(found.version, v1);
        let v2 = write(&b, &at(20), Some(&v1), Form::Mutable, true)
            .await
            .unwrap();
        let e = write(&b, &at(30), Some(&v1), Form::Mutable, true)
            .await
            .unwrap_err();
        assert!(matches!(e, LatestError::Moved { .. }), "{e}");
        let e = write(&b, &at(30), Some(&v2), Form::WriteOnce, true)
            .await
            .unwrap_err();
        assert!(matches!(e, LatestError::OtherForm { .. }), "{e}");
        let e = read_as(&b, Form::WriteOnce).await.unwrap_err();
        assert!(e.to_string().contains("mutable form"), "{e}");
        assert_eq!(read(&b).await.unwrap().unwrap().latest.unwrap(), at(20));
    }
}
