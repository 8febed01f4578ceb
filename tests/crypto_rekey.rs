//! `rekey`: every generation re-wrapped for the new key, the old wrappers gone, no data object
//! touched; on a local directory, on S3 (moto), crashed at every request and re-run; and the
//! binary's key commands and fail-closed flags.

mod support;

use std::collections::BTreeMap;
use std::ops::Range;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use mushroom_backup::bucket::faults::{CrashKind, FaultPlan, FaultyBucket};
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::{
    self, Body, Bucket, BucketError, DynBucket, ListPage, ListQuery, Object, ObjectMeta,
    PutCondition, PutOpts,
};
use mushroom_backup::crypto::key_objects::{self, KeyObjectError};
use mushroom_backup::crypto::rekey::{RekeyError, RekeyReport, rekey};
use mushroom_backup::crypto::{
    AgeIdentity, Binding, DataKey, KeyFileKey, SealWriter, UnwrapKek, WrapKek,
};
use mushroom_backup::manifest::{self, GenerationClaim};
use support::keks::{age_kek, key_file_kek};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const LINEAGE: Uuid = Uuid::from_u128(0xabcdef);

fn binding(generation: u64) -> Binding {
    Binding {
        lineage: LINEAGE,
        generation,
    }
}

/// What a backup leaves: per generation a claim, its wrapper for `kek`, and sealed objects.
async fn populate(b: &dyn Bucket, kek: &WrapKek, generations: u64) -> BTreeMap<u64, DataKey> {
    let mut keys = BTreeMap::new();
    for g in 1..=generations {
        let claim = GenerationClaim {
            lineage: LINEAGE,
            generation: g,
            snapshot_id: None,
            wal_id: Uuid::from_u128(u128::from(g)),
            wal_number: g,
            created_at: manifest::now_rfc3339(),
        };
        b.put(
            &manifest::generation_key(g),
            Bytes::from(claim.encode()).into(),
            PutCondition::IfNoneMatch,
        )
        .await
        .unwrap();
        let dk = DataKey::generate();
        key_objects::wrap_generation_key(b, binding(g), &dk, std::slice::from_ref(kek))
            .await
            .unwrap();
        for (key, len) in [
            (manifest::snapshot_key(g), 70_000usize),
            (manifest::segment_key(g, 0, 300), 300),
        ] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 + g as usize) as u8).collect();
            let mut w = SealWriter::new(Vec::new(), &dk, &key).unwrap();
            std::io::Write::write_all(&mut w, &plain).unwrap();
            let sealed = w.finish().unwrap();
            b.put(&key, Bytes::from(sealed).into(), PutCondition::IfNoneMatch)
                .await
                .unwrap();
        }
        keys.insert(g, dk);
    }
    keys
}

/// Every object that is not a wrapper, with its content's CRC.
async fn data_objects(b: &dyn Bucket) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for o in bucket::list_all(b, "").await.unwrap() {
        if !key_objects::is_wrapper_key(&o.key) {
            let data = b.get(&o.key).await.unwrap().data;
            out.insert(o.key, crc32fast::hash(&data));
        }
    }
    out
}

async fn opens(b: &dyn Bucket, g: u64, kek: &UnwrapKek) -> Result<DataKey, KeyObjectError> {
    key_objects::open_generation_key(b, LINEAGE, g, std::slice::from_ref(kek))
        .await
        .map(|o| o.data_key)
}

/// After a complete rekey: the new key opens every generation to its data key, the old opens
/// none, and the data objects are what they were.
async fn check_rekeyed(
    b: &dyn Bucket,
    keys: &BTreeMap<u64, DataKey>,
    old: &UnwrapKek,
    new: &UnwrapKek,
    data_before: &BTreeMap<String, u32>,
) {
    for (&g, dk) in keys {
        assert_eq!(&opens(b, g, new).await.unwrap(), dk, "generation {g}");
        let e = opens(b, g, old).await.unwrap_err();
        assert!(
            matches!(e, KeyObjectError::NotWrappedFor { .. }),
            "generation {g}: {e}"
        );
        assert!(e.to_string().contains(old.id().as_str()), "{e}");
    }
    assert_eq!(&data_objects(b).await, data_before, "data objects changed");
}

/// One [`rekey`] of `b` from `old` to `new`, never cancelled.
async fn rekey_once(
    b: &dyn Bucket,
    old: &UnwrapKek,
    new: &WrapKek,
) -> Result<RekeyReport, RekeyError> {
    rekey(
        b,
        std::slice::from_ref(old),
        std::slice::from_ref(new),
        &CancellationToken::new(),
    )
    .await
}

async fn rekey_round_trip(b: &dyn Bucket, old: (WrapKek, UnwrapKek), new: (WrapKek, UnwrapKek)) {
    let keys = populate(b, &old.0, 3).await;
    let before = data_objects(b).await;
    let report = rekey_once(b, &old.1, &new.0).await.unwrap();
    assert_eq!(
        (report.generations, report.wrapped, report.deleted),
        (3, 3, 3)
    );
    check_rekeyed(b, &keys, &old.1, &new.1, &before).await;
    // A second run has nothing to do and says so.
    let again = rekey_once(b, &old.1, &new.0).await.unwrap();
    assert_eq!((again.wrapped, again.deleted), (0, 0));
}

#[tokio::test]
async fn rekey_on_a_local_directory_between_both_kinds_of_key() {
    for (old, new) in [
        (key_file_kek(), key_file_kek()),
        (key_file_kek(), age_kek()),
        (age_kek(), key_file_kek()),
        (age_kek(), age_kek()),
    ] {
        let (_dir, b) = support::fs_bucket();
        rekey_round_trip(b.as_ref(), old, new).await;
    }
}

#[tokio::test]
async fn rekey_on_s3() {
    let Some(b) = support::s3::bucket("rekey").await else {
        return;
    };
    rekey_round_trip(b.as_ref(), key_file_kek(), age_kek()).await;
}

#[tokio::test]
async fn a_rekey_crashed_at_every_request_leaves_every_generation_openable_and_a_rerun_finishes() {
    for kind in [CrashKind::Before, CrashKind::After] {
        for new_kind in ["key file", "age"] {
            let mut k = 1;
            loop {
                let (old_w, old) = key_file_kek();
                let (new_w, new) = if new_kind == "age" {
                    age_kek()
                } else {
                    key_file_kek()
                };
                let inner: DynBucket = Arc::new(MemBucket::new());
                let keys = populate(inner.as_ref(), &old_w, 3).await;
                let before = data_objects(inner.as_ref()).await;
                let faulty = FaultyBucket::new(inner.clone(), FaultPlan::crash_at(k, kind));
                let result = rekey_once(&faulty, &old, &new_w).await;
                let crashed = faulty.has_crashed();
                for (&g, dk) in &keys {
                    let with_old = opens(inner.as_ref(), g, &old).await;
                    let with_new = opens(inner.as_ref(), g, &new).await;
                    let opened = with_old.as_ref().ok().or(with_new.as_ref().ok());
                    assert_eq!(
                        opened,
                        Some(dk),
                        "crash {kind:?} at request {k} ({new_kind}): generation {g}: old {with_old:?}, new {with_new:?}"
                    );
                }
                if !crashed {
                    result.unwrap();
                    check_rekeyed(inner.as_ref(), &keys, &old, &new, &before).await;
                    assert!(k > 10, "the rekey made only {} requests", k - 1);
                    break;
                }
                assert!(result.is_err(), "a crashed rekey reported success");
                rekey_once(inner.as_ref(), &old, &new_w)
                    .await
                    .unwrap_or_else(|e| panic!("re-run after a crash at request {k}: {e}"));
                check_rekeyed(inner.as_ref(), &keys, &old, &new, &before).await;
                k += 1;
            }
        }
    }
}

#[tokio::test]
async fn a_rekey_that_cannot_rewrap_every_generation_deletes_nothing() {
    let (_dir, b) = support::fs_bucket();
    let (old_w, old) = key_file_kek();
    let (third_w, _) = key_file_kek();
    let (new_w, _) = key_file_kek();
    populate(b.as_ref(), &old_w, 2).await;
    // Generation 3 is wrapped only for a third key.
    key_objects::wrap_generation_key(b.as_ref(), binding(3), &DataKey::generate(), &[third_w])
        .await
        .unwrap();
    let e = rekey_once(b.as_ref(), &old, &new_w).await.unwrap_err();
    assert!(
        matches!(e, RekeyError::Incomplete(ref p) if p.len() == 1),
        "{e}"
    );
    assert!(e.to_string().starts_with("nothing deleted"), "{e}");
    assert!(e.to_string().contains("generation 3"), "{e}");
    for g in [1, 2] {
        opens(b.as_ref(), g, &old).await.unwrap();
    }
    // The same key as old and new.
    let e = rekey_once(b.as_ref(), &old, &old_w).await.unwrap_err();
    assert!(matches!(e, RekeyError::SameKey(_)), "{e}");
}

/// A bucket that, at its first delete, has "a backup still configured with the old key"
/// write a new generation with a wrapper for that key.
struct WriterDuringRekey {
    inner: DynBucket,
    old: WrapKek,
    fired: AtomicBool,
}

#[async_trait::async_trait]
impl Bucket for WriterDuringRekey {
    fn url(&self) -> String {
        self.inner.url()
    }
    async fn get_at_most(&self, key: &str, at_most: u64) -> Result<Object, BucketError> {
        self.inner.get_at_most(key, at_most).await
    }
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BucketError> {
        self.inner.get_range(key, range).await
    }
    async fn head(&self, key: &str) -> Result<Option<ObjectMeta>, BucketError> {
        self.inner.head(key).await
    }
    async fn put_with(&self, key: &str, body: Body, opts: PutOpts) -> Result<String, BucketError> {
        self.inner.put_with(key, body, opts).await
    }
    async fn delete(&self, key: &str, if_match: Option<&str>) -> Result<(), BucketError> {
        if !self.fired.swap(true, Ordering::SeqCst) {
            key_objects::wrap_generation_key(
                self.inner.as_ref(),
                binding(99),
                &DataKey::generate(),
                std::slice::from_ref(&self.old),
            )
            .await
            .unwrap();
        }
        self.inner.delete(key, if_match).await
    }
    async fn list(&self, query: ListQuery<'_>) -> Result<ListPage, BucketError> {
        self.inner.list(query).await
    }
}

#[tokio::test]
async fn a_generation_wrapped_with_the_old_key_during_the_rekey_is_reported_and_a_rerun_catches_it()
{
    let (_dir, b) = support::fs_bucket();
    let (old_w, old) = key_file_kek();
    let (new_w, new) = key_file_kek();
    populate(b.as_ref(), &old_w, 2).await;
    let racing = WriterDuringRekey {
        inner: b.clone(),
        old: old_w,
        fired: AtomicBool::new(false),
    };
    let e = rekey_once(&racing, &old, &new_w).await.unwrap_err();
    assert!(
        matches!(e, RekeyError::OldKeyStillUsed(ref g) if g == &[99]),
        "{e}"
    );
    rekey_once(b.as_ref(), &old, &new_w).await.unwrap();
    for g in [1, 2, 99] {
        opens(b.as_ref(), g, &new).await.unwrap();
        assert!(opens(b.as_ref(), g, &old).await.is_err());
    }
}

// ---------------------------------------------------------------------------------------------
// The binary.

fn bin() -> Command {
    let mut c = Command::new(support::binary::BIN);
    c.env_remove("MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE")
        .env_remove("MUSHROOMDB_BACKUP_ENCRYPTION_IDENTITY_FILE")
        .env("MUSHROOMDB_BACKUP_LOG", "warn");
    c
}

fn run(c: &mut Command) -> (bool, String, String) {
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_binary_makes_keys_and_rekeys_a_destination() {
    let dir = tempfile::tempdir().unwrap();
    let old_path = dir.path().join("old.key");
    let new_path = dir.path().join("new.age");
    let (ok, out, err) = run(bin().args(["key", "new"]));
    assert!(ok, "{err}");
    std::fs::write(&old_path, &out).unwrap();
    let (ok, out, err) = run(bin().args(["key", "new", "--age"]));
    assert!(ok, "{err}");
    assert!(out.contains("# public key: age1"), "{out}");
    std::fs::write(&new_path, &out).unwrap();
    for p in [&old_path, &new_path] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    }
    let (ok, recipient, err) = run(bin()
        .args(["key", "recipient", "--identity-file"])
        .arg(&new_path));
    assert!(ok, "{err}");
    let recipient = recipient.trim().to_string();

    let old = UnwrapKek::KeyFile(Arc::new(KeyFileKey::load(&old_path).unwrap().0));
    let new = UnwrapKek::Identity(AgeIdentity::load(&new_path).unwrap().0.remove(0));
    let (ok, ids, err) = run(bin()
        .args(["key", "id", "--encryption-key-file"])
        .arg(&old_path));
    assert!(ok, "{err}");
    assert_eq!(ids.trim(), format!("{} key file", old.id()));

    let bucket_dir = dir.path().join("bucket");
    let b = mushroom_backup::bucket::fs::FsBucket::open(&bucket_dir).unwrap();
    let keys = populate(&b, &old.to_wrap(), 2).await;
    let before = data_objects(&b).await;
    let url = support::file_url(&bucket_dir);
    let (ok, out, err) = run(bin()
        .args(["rekey", "--from", &url, "--encryption-key-file"])
        .arg(&old_path)
        .args(["--new-encryption-recipient", &recipient]));
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["wrapped"], 2, "{report}");
    assert_eq!(report["deleted"], 2, "{report}");
    check_rekeyed(&b, &keys, &old, &new, &before).await;

    // Bad invocations stop before the bucket, naming the problem.
    let missing = dir.path().join("missing.key");
    let (identity, missing) = (new_path.to_str().unwrap(), missing.to_str().unwrap());
    // `rekey --from URL` and each row's flags.
    for (flags, says) in [
        (
            vec!["--new-encryption-recipient", &recipient],
            "rekey needs the old key",
        ),
        (
            vec!["--encryption-identity-file", identity],
            "rekey needs a new key",
        ),
        (
            vec![
                "--encryption-key-file",
                missing,
                "--new-encryption-recipient",
                &recipient,
            ],
            "--encryption-key-file: ",
        ),
        (
            vec![
                "--encryption-identity-file",
                identity,
                "--new-encryption-recipient",
                "age1bad",
            ],
            "--new-encryption-recipient: \"age1bad\"",
        ),
    ] {
        let args = [vec!["rekey", "--from", &url], flags].concat();
        let (ok, _, err) = run(bin().args(&args));
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn bucket_commands_with_a_bad_key_fail_before_touching_anything() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = Command::new(support::binary::BIN)
        .args(["store", "write"])
        .arg(&store)
        .args(["--commits", "5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dest = dir.path().join("dest");
    let target = dir.path().join("target");
    let missing = dir.path().join("missing.key");
    std::fs::write(dir.path().join("blank.key"), "\n").unwrap();
    let blank = dir.path().join("blank.key");
    let dest_url = support::file_url(&dest);
    // `backup --once` of the store to the destination with the key flag `flag`.
    let backup_with = |flag: &str, value: String| -> Vec<String> {
        let store = store.display().to_string();
        [
            "backup", "--once", "--store", &store, "--to", &dest_url, flag, &value,
        ]
        .map(String::from)
        .to_vec()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            backup_with("--encryption-key-file", missing.display().to_string()),
            "no such file",
        ),
        (
            backup_with("--encryption-recipient", "age1notarecipient".into()),
            "not an age X25519 recipient",
        ),
        (
            vec![
                "restore".into(),
                "--from".into(),
                dest_url.clone(),
                "--to".into(),
                target.display().to_string(),
                "--encryption-key-file".into(),
                blank.display().to_string(),
            ],
            "not a key file: blank",
        ),
        (
            vec![
                "verify".into(),
                "--from".into(),
                dest_url.clone(),
                "--encryption-identity-file".into(),
                dir.path().display().to_string(),
            ],
            "is a directory",
        ),
    ];
    for (args, says) in cases {
        let (ok, _, err) = run(bin().args(&args));
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!dest.exists(), "{args:?} created the destination");
        assert!(!target.exists(), "{args:?} created the target");
    }
    // The environment variable is the key file flag.
    let (ok, _, err) = run(bin()
        .env("MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE", &missing)
        .args(["backup", "--once", "--store"])
        .arg(&store)
        .args(["--to", &dest_url]));
    assert!(!ok);
    assert!(
        err.contains("--encryption-key-file: ") && err.contains("no such file"),
        "{err}"
    );
    // An identity file alone cannot wrap a new generation's key: `backup` refuses it.
    let identity = dir.path().join("alone.age");
    std::fs::write(&identity, AgeIdentity::generate().file_content().as_bytes()).unwrap();
    let (ok, _, err) = run(bin()
        .args(["backup", "--once", "--store"])
        .arg(&store)
        .args(["--to", &dest_url, "--encryption-identity-file"])
        .arg(&identity));
    assert!(!ok);
    assert!(err.contains("only unwraps"), "{err}");
    assert!(!dest.exists());
}
