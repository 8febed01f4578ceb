//! Unit tests of the local-directory bucket's private parts.

use super::walk::walk;
use super::*;

#[test]
fn bad_keys_are_refused() {
    for key in [
        "", "/abs", ".lock", ".tmp/x", "a//b", "a/", "a/./b", "a/../b", "..", "a\0b",
    ] {
        assert!(
            matches!(check_key("put", key), Err(BucketError::Permanent { .. })),
            "{key:?} was accepted"
        );
    }
    for key in [
        "a",
        "a/b.c",
        "gen/0000000001/side/store.meta.0badf00d",
        "a/.b",
    ] {
        assert!(check_key("put", key).is_ok(), "{key:?} was refused");
    }
}

#[test]
fn walk_visits_keys_in_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBucket::open(dir.path()).unwrap();
    let root = b.inner.root_dir("list", "").unwrap();
    let root = root.as_fd();
    let keys = ["a-b", "a/b", "a/c/d", "a0", "b", "ab/x"];
    for key in keys {
        let path = dir.path().join(key);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, key).unwrap();
    }
    let mut sorted = keys.to_vec();
    sorted.sort();
    let mut out = Vec::new();
    walk(&b.inner, root, "", "", None, 100, &mut out).unwrap();
    assert_eq!(out, sorted);
    out.clear();
    walk(&b.inner, root, "", "a", Some("a/b"), 100, &mut out).unwrap();
    assert_eq!(out, ["a/c/d", "a0", "ab/x"]);
}

#[tokio::test]
async fn create_cas_delete_smoke() {
    use crate::bucket::Bucket;
    let dir = tempfile::tempdir().unwrap();
    let b = FsBucket::open(dir.path()).unwrap();
    let body = |s: &'static str| Body::from(Bytes::from_static(s.as_bytes()));
    let e1 = b
        .put("x/y", body("one"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let again = b.put("x/y", body("two"), PutCondition::IfNoneMatch).await;
    assert!(matches!(again, Err(BucketError::PreconditionFailed { .. })));
    let e2 = b
        .put("x/y", body("two"), PutCondition::IfMatch(e1.clone()))
        .await
        .unwrap();
    let stale = b.put("x/y", body("three"), PutCondition::IfMatch(e1)).await;
    assert!(matches!(stale, Err(BucketError::PreconditionFailed { .. })));
    assert_eq!(b.get("x/y").await.unwrap().etag, e2);
    b.delete("x/y", Some(&e2)).await.unwrap();
    assert!(b.head("x/y").await.unwrap().is_none());
    assert!(
        !dir.path().join("x").exists(),
        "the emptied directory was left"
    );
    assert_eq!(fs::read_dir(dir.path().join(TMP_DIR)).unwrap().count(), 0);
}

#[tokio::test]
async fn the_lease_is_renewed_by_exchange_with_no_inode_churn() {
    use crate::bucket::Bucket;
    use crate::bucket::{PutHint, PutOpts};
    use std::os::unix::fs::MetadataExt;
    const LEASE_KEY: &str = "lease";
    let hinted = |cond| PutOpts {
        cond,
        hint: PutHint::FrequentRewrite,
        retain: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let b = FsBucket::open(dir.path()).unwrap();
    let record = |n: u32| Body::from(Bytes::from(format!("{{\"renewals\":{n}}}")));
    let mut etag = b
        .put_with(LEASE_KEY, record(0), hinted(PutCondition::IfNoneMatch))
        .await
        .unwrap();
    let mut inodes = std::collections::BTreeSet::new();
    for n in 1..=20u32 {
        let next = b
            .put_with(
                LEASE_KEY,
                record(n),
                hinted(PutCondition::IfMatch(etag.clone())),
            )
            .await
            .unwrap();
        assert_ne!(next, etag);
        let got = b.get(LEASE_KEY).await.unwrap();
        assert_eq!(got.data, format!("{{\"renewals\":{n}}}").as_bytes());
        assert_eq!(
            got.etag, next,
            "the ETag is the content's, as on every other path"
        );
        let meta = b.head(LEASE_KEY).await.unwrap().unwrap();
        assert_eq!(
            (meta.len, meta.etag.as_str()),
            (got.data.len() as u64, next.as_str())
        );
        // A stale ETag is refused and changes nothing.
        let stale = b
            .put_with(LEASE_KEY, record(99), hinted(PutCondition::IfMatch(etag)))
            .await;
        assert!(matches!(stale, Err(BucketError::PreconditionFailed { .. })));
        assert_eq!(b.get(LEASE_KEY).await.unwrap().etag, next);
        inodes.insert(fs::metadata(dir.path().join(LEASE_KEY)).unwrap().ino());
        etag = next;
    }
    assert!(inodes.len() <= 2, "two inodes take turns: {inodes:?}");
    // The scratch is the bucket's own file: never listed, never an object.
    let listed = b
        .list(crate::bucket::ListQuery::new("", None, 100))
        .await
        .unwrap();
    let keys: Vec<_> = listed.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(keys, [LEASE_KEY]);
    b.delete(LEASE_KEY, Some(&etag)).await.unwrap();
    assert!(b.head(LEASE_KEY).await.unwrap().is_none());
}

/// The root is opened per request, not held: a bucket holds no descriptor between requests,
/// and a root replaced since it was opened is refused, naming it, with nothing written to the
/// directory now standing at its path.
#[tokio::test]
async fn a_bucket_holds_no_descriptor_and_refuses_a_replaced_root() {
    use crate::bucket::Bucket;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bucket");
    let fds = || fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    let buckets: Vec<FsBucket> = (0..64).map(|_| FsBucket::open(&root).unwrap()).collect();
    assert!(
        fds() < before + 8,
        "64 open buckets hold {} descriptors",
        fds() - before
    );
    let b = &buckets[0];
    b.put(
        "a/k",
        Body::from(Bytes::from_static(b"one")),
        PutCondition::IfNoneMatch,
    )
    .await
    .unwrap();
    assert_eq!(&b.get("a/k").await.unwrap().data[..], b"one");
    fs::rename(&root, dir.path().join("moved")).unwrap();
    fs::create_dir(&root).unwrap();
    let err = b
        .put(
            "a/k2",
            Body::from(Bytes::from_static(b"two")),
            PutCondition::IfNoneMatch,
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("is no longer the directory this bucket opened"),
        "{err}"
    );
    assert!(b.get("a/k").await.is_err());
    assert_eq!(fs::read_dir(&root).unwrap().count(), 0, "nothing written");
}
