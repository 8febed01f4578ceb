//! One conformance suite for every bucket: the local directory, memory, S3 (on moto and on
//! SeaweedFS, whose listing order is the one deviation it is allowed: see
//! [`support::s3_servers::ListOrder`]), the fault
//! wrapper, and the retry layer over a lossy fault wrapper (which passes only if the retry
//! layer reads its indeterminate failures right). Then races on one directory from two
//! buckets and two processes, opening S3 from the environment, and read-only views of every
//! backend (reads pass, writes are refused, nothing is created, a missing destination is named).
//! The wrappers' own behaviour is tested in `bucket_wrappers.rs`.

mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use mushroom_backup::bucket::faults::{Fault, FaultPlan, FaultyBucket, SeededFaults};
use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::read_only::ReadOnly;
use mushroom_backup::bucket::retry::Retrying;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{
    Body, Bucket, BucketError, Created, DynBucket, ListQuery, Open, OpenError, Part, PutCondition,
    list_all, put_immutable,
};
use support::s3_servers::{ListOrder, S3Server};
use support::{body, fast_retries, fs_bucket, is_precondition_failed};
use tokio_util::sync::CancellationToken;

/// Every backend must pass this, whatever it wraps.
async fn conformance(b: DynBucket) {
    conformance_listing_in(b, ListOrder::Binary).await
}

/// [`conformance`], with listings expected in `order`: S3 promises UTF-8 binary order of keys,
/// and only SeaweedFS deviates from it (keys along their `/` components).
async fn conformance_listing_in(b: DynBucket, order: ListOrder) {
    eprintln!("conformance of {} (listing in {order:?} order)", b.url());
    put_get_head(&*b).await;
    create_only(&*b).await;
    compare_and_swap(&*b).await;
    deletes(&*b).await;
    listing(&*b, order).await;
    listing_start_after(&*b).await;
    ranges(&*b).await;
    whole_reads_are_bounded(&*b).await;
    large_file_body(&*b).await;
    checked_file_bodies(&*b).await;
    immutable(&*b).await;
    bad_keys(&*b).await;
    fresh_objects_are_young(&*b).await;
    racing_cas(b).await;
}

/// The most a freshly written object's age may read: generous, as the machine may be busy,
/// and far below the ages the tests below make (an hour for a file, whose mtime is set).
const YOUNG: Duration = Duration::from_secs(60);

/// Every backend here tells an object's age by its clock, and a fresh object's is small.
async fn fresh_objects_are_young(b: &dyn Bucket) {
    b.put("age/fresh", body("new"), PutCondition::None)
        .await
        .unwrap();
    let age = b.get("age/fresh").await.unwrap().age;
    let age = age.unwrap_or_else(|| panic!("{}: a get without an age", b.url()));
    assert!(age < YOUNG, "{}: a fresh object is {age:?} old", b.url());
}

async fn put_get_head(b: &dyn Bucket) {
    let e1 = b
        .put("basic/a", body("hello"), PutCondition::None)
        .await
        .unwrap();
    let got = b.get("basic/a").await.unwrap();
    assert_eq!((&got.data[..], &got.etag), (&b"hello"[..], &e1));
    let meta = b.head("basic/a").await.unwrap().expect("head of an object");
    assert_eq!(
        (meta.key.as_str(), meta.len, &meta.etag),
        ("basic/a", 5, &e1)
    );

    let e2 = b
        .put("basic/a", body("hello, again"), PutCondition::None)
        .await
        .unwrap();
    assert_ne!(e1, e2, "new content, same ETag");
    assert_eq!(&b.get("basic/a").await.unwrap().data[..], b"hello, again");

    let empty = b
        .put("basic/empty", body(""), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let got = b.get("basic/empty").await.unwrap();
    assert!(got.data.is_empty());
    assert_eq!(got.etag, empty);
    assert_eq!(b.head("basic/empty").await.unwrap().unwrap().len, 0);

    assert!(b.head("basic/missing").await.unwrap().is_none());
    assert!(matches!(
        b.get("basic/missing").await,
        Err(BucketError::NotFound { .. })
    ));
}

async fn create_only(b: &dyn Bucket) {
    let etag = b
        .put("create/x", body("first"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let again = b
        .put("create/x", body("second"), PutCondition::IfNoneMatch)
        .await;
    assert!(is_precondition_failed(&again), "{again:?}");
    let got = b.get("create/x").await.unwrap();
    assert_eq!((&got.data[..], got.etag), (&b"first"[..], etag));
}

async fn compare_and_swap(b: &dyn Bucket) {
    let e1 = b
        .put("cas/x", body("v1"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let e2 = b
        .put("cas/x", body("v2"), PutCondition::IfMatch(e1.clone()))
        .await
        .unwrap();
    let stale = b.put("cas/x", body("v3"), PutCondition::IfMatch(e1)).await;
    assert!(is_precondition_failed(&stale), "{stale:?}");
    let got = b.get("cas/x").await.unwrap();
    assert_eq!((&got.data[..], got.etag), (&b"v2"[..], e2.clone()));

    let missing = b
        .put("cas/missing", body("v1"), PutCondition::IfMatch(e2))
        .await;
    assert!(is_precondition_failed(&missing), "{missing:?}");
    assert!(b.head("cas/missing").await.unwrap().is_none());
}

async fn deletes(b: &dyn Bucket) {
    b.delete("del/never-was", None).await.unwrap();
    b.put("del/a", body("a"), PutCondition::None).await.unwrap();
    b.delete("del/a", None).await.unwrap();
    assert!(b.head("del/a").await.unwrap().is_none());
    b.delete("del/a", None).await.unwrap();

    let etag = b.put("del/b", body("b"), PutCondition::None).await.unwrap();
    let other = b.put("del/c", body("c"), PutCondition::None).await.unwrap();
    let wrong = b.delete("del/b", Some(&other)).await;
    assert!(is_precondition_failed(&wrong), "{wrong:?}");
    assert!(b.head("del/b").await.unwrap().is_some());
    b.delete("del/b", Some(&etag)).await.unwrap();
    assert!(b.head("del/b").await.unwrap().is_none());
    let gone = b.delete("del/b", Some(&etag)).await;
    assert!(is_precondition_failed(&gone), "{gone:?}");
}

async fn listing(b: &dyn Bucket, order: ListOrder) {
    let mut keys: Vec<String> = (0..23).map(|i| format!("list/k{i:03}")).collect();
    // '-' < '/' < '0': in binary order a directory's keys sort between its neighbours' (S3's
    // promise); SeaweedFS puts `list/sub/x` before `list/sub-a`.
    for key in [
        "list/sub/x",
        "list/sub-a",
        "list/sub0",
        "list/k00",
        "list/a-b",
    ] {
        keys.push(key.into());
    }
    for key in &keys {
        b.put(key, body(key.clone()), PutCondition::None)
            .await
            .unwrap();
    }
    b.put("listx", body("outside"), PutCondition::None)
        .await
        .unwrap();
    b.put("lisT/upper", body("outside"), PutCondition::None)
        .await
        .unwrap();
    let keys = order.sorted(keys);

    let all = list_all(b, "list/").await.unwrap();
    let listed: Vec<&str> = all.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(listed, keys, "list_all order");
    for o in &all {
        let meta = b.head(&o.key).await.unwrap().unwrap();
        assert_eq!(&meta, o, "listing and head disagree");
    }

    let (mut paged, mut token, mut pages) = (Vec::new(), None, 0);
    loop {
        let page = b.list(ListQuery::new("list/", token, 7)).await.unwrap();
        assert!(
            page.objects.len() <= 7,
            "{} keys in a page",
            page.objects.len()
        );
        pages += 1;
        paged.extend(page.objects.into_iter().map(|o| o.key));
        match page.next_token {
            Some(t) => token = Some(t),
            None => break,
        }
        assert!(pages < 100, "pagination does not end");
    }
    assert_eq!(paged, keys, "pages");
    assert!(
        pages >= 4,
        "only {pages} pages of at most 7 for {} keys",
        keys.len()
    );

    let partial = list_all(b, "list/k01").await.unwrap();
    let partial: Vec<&str> = partial.iter().map(|o| o.key.as_str()).collect();
    let expect: Vec<&str> = (10..20).map(|i| keys[i + 2].as_str()).collect();
    assert!(
        expect.iter().all(|k| k.starts_with("list/k01")),
        "{expect:?}"
    );
    assert_eq!(partial, expect, "partial-segment prefix");
    assert!(list_all(b, "nothing/").await.unwrap().is_empty());
}

/// `start_after` (S3's `StartAfter`): only keys after it, whether or not it is a key itself,
/// paged as any listing, and combined with a token the later of the two bounds.
async fn listing_start_after(b: &dyn Bucket) {
    let keys: Vec<String> = (0..30).map(|i| format!("after/m/{i:04}.json")).collect();
    for key in &keys {
        b.put(key, body(key.clone()), PutCondition::None)
            .await
            .unwrap();
    }
    b.put("after/n", body("outside"), PutCondition::None)
        .await
        .unwrap();
    let listed = |page: mushroom_backup::bucket::ListPage| -> Vec<String> {
        page.objects.into_iter().map(|o| o.key).collect()
    };

    // After an existing key: the keys after it, not it.
    let page = b
        .list(ListQuery::new("after/m/", None, 1000).starting_after("after/m/0010.json"))
        .await
        .unwrap();
    assert!(page.next_token.is_none(), "{:?}", page.next_token);
    assert_eq!(listed(page), keys[11..].to_vec(), "after an existing key");

    // After a key that is not there (a key's own prefix sorts just before it): from that key on.
    let page = b
        .list(ListQuery::new("after/m/", None, 1000).starting_after("after/m/0020"))
        .await
        .unwrap();
    assert_eq!(listed(page), keys[20..].to_vec(), "after a missing key");

    // After a key before the prefix: the whole prefix; after every key: nothing.
    let page = b
        .list(ListQuery::new("after/m/", None, 1000).starting_after("after/a"))
        .await
        .unwrap();
    assert_eq!(listed(page), keys, "after a key before the prefix");
    let page = b
        .list(ListQuery::new("after/m/", None, 1000).starting_after("after/m/9"))
        .await
        .unwrap();
    assert!(page.objects.is_empty() && page.next_token.is_none());

    // Paged from a start: every key after it once, in order.
    let (mut paged, mut token, mut pages) = (Vec::new(), None, 0);
    loop {
        let q = ListQuery::new("after/m/", token, 4).starting_after("after/m/0005.json");
        let page = b.list(q).await.unwrap();
        assert!(page.objects.len() <= 4);
        pages += 1;
        assert!(pages < 100, "pagination does not end");
        let next = page.next_token.clone();
        paged.extend(listed(page));
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(paged, keys[6..].to_vec(), "pages after a start");

    // A token and a start: the later bound wins, whichever it is.
    let q = ListQuery::new("after/m/", Some("after/m/0003.json".into()), 1000)
        .starting_after("after/m/0025.json");
    assert_eq!(listed(b.list(q).await.unwrap()), keys[26..].to_vec());
    let q = ListQuery::new("after/m/", Some("after/m/0027.json".into()), 1000)
        .starting_after("after/m/0002.json");
    assert_eq!(listed(b.list(q).await.unwrap()), keys[28..].to_vec());
}

async fn ranges(b: &dyn Bucket) {
    let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    b.put("range/x", Body::from(data.clone()), PutCondition::None)
        .await
        .unwrap();
    let cases = [
        (10..20, 10..20),
        (0..1000, 0..1000),
        (990..1010, 990..1000),
        (999..5000, 999..1000),
        (1000..1100, 0..0),
        (2000..3000, 0..0),
        (5..5, 0..0),
    ];
    for (asked, want) in cases {
        let got = b.get_range("range/x", asked.clone()).await.unwrap();
        let want = &data[want.start as usize..want.end as usize];
        assert_eq!(&got[..], want, "range {asked:?}");
    }
    let missing = b.get_range("range/missing", 0..10).await;
    assert!(
        matches!(missing, Err(BucketError::NotFound { .. })),
        "{missing:?}"
    );
}

/// A whole-object read takes at most the bound it is given, and refuses a longer object
/// naming it and its length, as [`Bucket::get`] does past [`GET_MAX`].
async fn whole_reads_are_bounded(b: &dyn Bucket) {
    let data = vec![7u8; 1000];
    b.put("whole/x", Body::from(data.clone()), PutCondition::None)
        .await
        .unwrap();
    assert_eq!(
        &b.get_at_most("whole/x", 1000).await.unwrap().data[..],
        &data[..]
    );
    let whole = |at_most| Part::Whole { at_most };
    assert_eq!(
        b.get_buffers("whole/x", whole(1000))
            .await
            .unwrap()
            .concat(),
        data
    );
    let refused = [
        b.get_at_most("whole/x", 999).await.map(|o| o.data.len()),
        b.get_buffers("whole/x", whole(999)).await.map(|v| v.len()),
    ];
    for r in refused {
        match r {
            Err(e @ BucketError::Permanent { .. }) => {
                let e = e.to_string();
                assert!(
                    e.contains("whole/x") && e.contains("1000 bytes, more than the 999"),
                    "{e}"
                );
            }
            other => panic!("a read bounded at 999 of 1000 bytes: {other:?}"),
        }
    }
    assert!(
        matches!(
            b.get_at_most("whole/missing", 10).await,
            Err(BucketError::NotFound { .. })
        ),
        "a bound does not hide a missing object"
    );
}

/// Big enough to be three parts of 5 MiB on S3 (the suite's S3 bucket uses that part size).
const LARGE: usize = 11 << 20;

/// A body that is a range of a file, starting `offset` bytes in.
fn file_body(seed: u8, offset: usize) -> (Body, Vec<u8>) {
    let content: Vec<u8> = (0..LARGE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&vec![0xEE; offset]).unwrap();
    file.write_all(&content).unwrap();
    file.write_all(b"trailing bytes not in the body").unwrap();
    let body = Body::File {
        file: Arc::new(file),
        offset: offset as u64,
        len: LARGE as u64,
        crc32: None,
    };
    (body, content)
}

async fn large_file_body(b: &dyn Bucket) {
    let (first, content) = file_body(1, 3);
    let etag = b
        .put("large/x", first.clone(), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let meta = b.head("large/x").await.unwrap().unwrap();
    assert_eq!((meta.len, &meta.etag), (LARGE as u64, &etag));
    let got = b.get("large/x").await.unwrap();
    assert!(got.data[..] == content[..], "large object content differs");
    let boundary = (5 << 20) - 10..(5 << 20) + 10;
    let got = b.get_range("large/x", boundary.clone()).await.unwrap();
    assert_eq!(
        &got[..],
        &content[boundary.start as usize..boundary.end as usize]
    );

    let (second, content2) = file_body(2, 0);
    let again = b
        .put("large/x", second.clone(), PutCondition::IfNoneMatch)
        .await;
    assert!(is_precondition_failed(&again), "{again:?}");
    let stale = b
        .put(
            "large/x",
            second.clone(),
            PutCondition::IfMatch("\"nope\"".into()),
        )
        .await;
    assert!(is_precondition_failed(&stale), "{stale:?}");
    let etag2 = b
        .put("large/x", second, PutCondition::IfMatch(etag))
        .await
        .unwrap();
    let got = b.get("large/x").await.unwrap();
    assert!(
        got.data[..] == content2[..],
        "replaced large object differs"
    );
    assert_eq!(got.etag, etag2);
}

/// A file range given with the CRC-32 of its check (the worker's archives and snapshots) is
/// stored when its bytes still match, and refused, leaving no object, when the file changed
/// after the check: in one request, and (where the backend has them) in parts.
async fn checked_file_bodies(b: &dyn Bucket) {
    use std::os::unix::fs::FileExt;
    for (name, len) in [("one-request", 300_000), ("in-parts", LARGE)] {
        let (body, content) = file_body(7, 5);
        let Body::File { file, offset, .. } = body else {
            unreachable!("a file body")
        };
        let content = &content[..len];
        let checked = Body::File {
            file: file.clone(),
            offset,
            len: len as u64,
            crc32: Some(crc32fast::hash(content)),
        };
        let key = format!("checked/{name}");
        b.put(&key, checked.clone(), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        assert!(b.get(&key).await.unwrap().data[..] == content[..]);

        // One byte of the range changes after its CRC was taken.
        let at = offset + len as u64 / 2;
        file.write_all_at(&[content[len / 2] ^ 0x40], at).unwrap();
        let changed = format!("checked/{name}-changed");
        let refused = b.put(&changed, checked, PutCondition::IfNoneMatch).await;
        match &refused {
            Err(BucketError::Permanent { key, message, .. }) => {
                assert_eq!(key, &changed);
                assert!(message.contains("changed after its check"), "{message}");
            }
            other => panic!("a changed file was not refused: {other:?}"),
        }
        assert!(
            b.head(&changed).await.unwrap().is_none(),
            "{changed} exists"
        );
    }
}

async fn immutable(b: &dyn Bucket) {
    let cond = PutCondition::IfNoneMatch;
    let first = put_immutable(b, "imm/x", body("same"), &cond)
        .await
        .unwrap();
    let Created::New(etag) = first else {
        panic!("first write reported {first:?}");
    };
    // Through a retry layer a lost answer makes the repeat look new; the ETag must not change.
    match put_immutable(b, "imm/x", body("same"), &cond)
        .await
        .unwrap()
    {
        Created::AlreadyThere(e) | Created::New(e) => assert_eq!(e, etag),
    }
    let other = put_immutable(b, "imm/x", body("different"), &cond).await;
    assert!(is_precondition_failed(&other), "{other:?}");
    assert_eq!(&b.get("imm/x").await.unwrap().data[..], b"same");
}

async fn bad_keys(b: &dyn Bucket) {
    for key in ["", "/abs", "../up", "a/../b", "a//b", ".hidden"] {
        let r = b.put(key, body("x"), PutCondition::None).await;
        assert!(
            matches!(r, Err(BucketError::Permanent { .. })),
            "{key:?}: {r:?}"
        );
        let r = b.get(key).await;
        assert!(
            matches!(r, Err(BucketError::Permanent { .. })),
            "{key:?}: {r:?}"
        );
    }
}

/// Tasks racing `If-Match` on one key: exactly one wins each round. Every loser gets a clean
/// 412, and the object is the winner's.
///
/// moto checks `If-Match` and stores the object in two steps, so on a loaded machine two racers
/// can both be answered 200 there (real S3 decides atomically). Against moto the test so asserts
/// what this library is responsible for: each answer is a success or a 412, at least one wins,
/// and the object ends up exactly as one of the winners wrote it, under that winner's ETag.
async fn racing_cas(b: DynBucket) {
    // The S3 endpoints of the tests: moto, and SeaweedFS.
    let s3 = b.url().starts_with("s3://");
    const TASKS: usize = 8;
    let mut etag = b
        .put("race/k", body("start"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    for round in 0..5 {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (b, etag) = (b.clone(), etag.clone());
                tokio::spawn(async move {
                    let content = format!("round {round} task {t}");
                    let r = b
                        .put("race/k", body(content), PutCondition::IfMatch(etag))
                        .await;
                    (t, r)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (t, Ok(e)) => winners.push((t, e)),
                (_, r) => assert!(is_precondition_failed(&r), "round {round}: {r:?}"),
            }
        }
        if !s3 {
            assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        }
        assert!(!winners.is_empty(), "round {round}: nobody won");
        let got = b.get("race/k").await.unwrap();
        let (t, won) = winners
            .into_iter()
            .find(|(_, e)| *e == got.etag)
            .unwrap_or_else(|| panic!("round {round}: the object's ETag is no winner's"));
        assert_eq!(got.data, format!("round {round} task {t}").as_bytes());
        etag = won;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_bucket_conforms() {
    let (_dir, b) = fs_bucket();
    conformance(b.clone()).await;
    // Strict on a bucket without a retry layer: a repeat is recognised as already there.
    let cond = PutCondition::IfNoneMatch;
    let again = put_immutable(&*b, "imm/x", body("same"), &cond).await;
    assert!(matches!(again, Ok(Created::AlreadyThere(_))), "{again:?}");
}

/// No request of a local-directory bucket goes through a link below its root (issue 25,
/// part 2): a link as a directory of the key, as the object itself, as `.tmp/` or `.lock`
/// fails the request with a permanent "bad bucket" error naming the link, and nothing behind
/// it is read, written or deleted; a listing that would list or descend into one refuses
/// the same way, one that would not is not disturbed. The root may be a link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_bucket_never_goes_through_a_link_below_its_root() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, outside) = (t.join("b"), t.join("outside"));
    std::fs::create_dir_all(outside.join("1")).unwrap();
    std::fs::write(outside.join("1/secret"), b"secret").unwrap();
    std::fs::write(outside.join("plain"), b"plain").unwrap();
    let link = |target: &std::path::Path, at: &str| {
        std::os::unix::fs::symlink(target, root.join(at)).unwrap();
        format!("bad bucket: {} is a symbolic link", root.join(at).display())
    };
    let refused = |r: Result<(), BucketError>, named: &str, what: &str| match r {
        Err(e @ BucketError::Permanent { .. }) => {
            assert!(e.to_string().contains(named), "{what}: {e}")
        }
        other => panic!("{what}: {other:?}"),
    };
    let outside_before = support::store::tree(&outside);
    let b = FsBucket::open(&root).unwrap();
    b.put("manifests/1", body("m"), PutCondition::IfNoneMatch)
        .await
        .unwrap();

    // A directory of the key.
    let gen_link = link(&outside, "gen");
    for cond in [PutCondition::IfNoneMatch, PutCondition::None] {
        refused(
            b.put("gen/1/new", body("x"), cond).await.map(drop),
            &gen_link,
            "put",
        );
    }
    refused(b.get("gen/1/secret").await.map(drop), &gen_link, "get");
    refused(
        b.get_range("gen/1/secret", 0..2).await.map(drop),
        &gen_link,
        "get_range",
    );
    refused(b.head("gen/1/secret").await.map(drop), &gen_link, "head");
    refused(b.delete("gen/1/secret", None).await, &gen_link, "delete");
    refused(
        list_all(&b, "").await.map(drop),
        &gen_link,
        "list of the root",
    );
    refused(
        list_all(&b, "gen/1/").await.map(drop),
        &gen_link,
        "list of gen/1/",
    );
    // A listing that cannot meet it is not disturbed.
    let listed = list_all(&b, "manifests/").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

    // The object itself.
    let object_link = link(&outside.join("plain"), "manifests/2");
    refused(
        b.get("manifests/2").await.map(drop),
        &object_link,
        "get of a link",
    );
    refused(
        b.head("manifests/2").await.map(drop),
        &object_link,
        "head of a link",
    );
    refused(
        b.put("manifests/2", body("y"), PutCondition::None)
            .await
            .map(drop),
        &object_link,
        "put over a link",
    );
    refused(
        b.delete("manifests/2", None).await,
        &object_link,
        "delete of a link",
    );
    assert!(
        root.join("manifests/2").is_symlink(),
        "the link is the operator's to remove"
    );
    std::fs::remove_file(root.join("manifests/2")).unwrap();

    // The bucket's own `.tmp/` and `.lock`.
    std::fs::remove_dir(root.join(".tmp")).unwrap();
    let tmp_link = link(&outside, ".tmp");
    refused(
        b.put("manifests/3", body("z"), PutCondition::None)
            .await
            .map(drop),
        &tmp_link,
        "put through .tmp",
    );
    std::fs::remove_file(root.join(".tmp")).unwrap();
    std::fs::create_dir(root.join(".tmp")).unwrap();
    std::fs::remove_file(root.join(".lock")).unwrap();
    let lock_link = link(&outside.join("plain"), ".lock");
    refused(
        b.delete("manifests/1", None).await,
        &lock_link,
        "delete under a linked .lock",
    );
    std::fs::remove_file(root.join(".lock")).unwrap();
    assert_eq!(
        support::store::tree(&outside),
        outside_before,
        "something behind a link changed"
    );

    // Reached through a link, the root is a bucket as any other.
    std::fs::remove_file(root.join("gen")).unwrap();
    std::os::unix::fs::symlink(&root, t.join("b-link")).unwrap();
    let through = FsBucket::open(&t.join("b-link")).unwrap();
    through
        .put("gen/1/x", body("x"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(&b.get("gen/1/x").await.unwrap().data[..], b"x");
    assert_eq!(list_all(&through, "").await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_bucket_conforms() {
    let b = Arc::new(MemBucket::new());
    conformance(b.clone()).await;
    let again = put_immutable(&*b, "imm/x", body("same"), &PutCondition::IfNoneMatch).await;
    assert!(matches!(again, Ok(Created::AlreadyThere(_))), "{again:?}");
}

on_each_s3_server!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn s3_bucket_conforms
);
async fn s3_bucket_conforms(server: &S3Server) {
    let b = server.bucket_with_part_size("conformance", 5 << 20).await;
    conformance_listing_in(b.clone(), server.list_order()).await;
    let again = put_immutable(&*b, "imm/x", body("same"), &PutCondition::IfNoneMatch).await;
    assert!(matches!(again, Ok(Created::AlreadyThere(_))), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_bucket_without_faults_conforms() {
    let (_dir, fs) = fs_bucket();
    let b = Arc::new(FaultyBucket::new(fs, FaultPlan::none()));
    conformance(b.clone()).await;
    assert!(b.requests() > 100, "only {} requests counted", b.requests());
    assert!(b.log().iter().all(|e| e.fault == Fault::Pass));
}

/// The counting and metering wrappers pass every request on unchanged (a listing's
/// `start_after` too), over a local directory and over S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_and_metered_wrappers_conform() {
    use mushroom_backup::bucket::counting::CountingBucket;
    use mushroom_backup::bucket::metered::MeteredBucket;
    let (_dir, fs) = fs_bucket();
    let b = Arc::new(CountingBucket::new(Arc::new(MeteredBucket::new(fs))));
    conformance(b.clone()).await;
    assert!(
        b.counts().snapshot().list > 10,
        "{:?}",
        b.counts().snapshot()
    );
    if let Some(s3) = support::s3::bucket_with_part_size("conformance-wrapped", 5 << 20).await {
        conformance(Arc::new(CountingBucket::new(Arc::new(MeteredBucket::new(
            s3,
        )))))
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_over_lossy_faults_conforms() {
    let seed = 0x5eed_0001;
    eprintln!("fault seed {seed:#x}");
    let faults = SeededFaults {
        fail: 0.15,
        lose_answer: 0.15,
        conflict: 0.05,
        ..SeededFaults::default()
    };
    let (_dir, fs) = fs_bucket();
    let faulty = Arc::new(FaultyBucket::new(fs, FaultPlan::seeded(seed, faults)));
    let cancel = CancellationToken::new();
    let b = Arc::new(Retrying::new(faulty.clone(), fast_retries(), cancel));
    conformance(b).await;
    let log = faulty.log();
    let count = |f: Fault| log.iter().filter(|e| e.fault == f).count();
    let lost_writes = log
        .iter()
        .filter(|e| e.fault == Fault::LoseAnswer && e.op.is_write())
        .count();
    eprintln!(
        "{} requests: {} failed, {} answers lost ({lost_writes} of writes), {} conflicts",
        log.len(),
        count(Fault::Fail),
        count(Fault::LoseAnswer),
        count(Fault::Conflict)
    );
    assert!(count(Fault::Fail) > 10 && lost_writes > 10 && count(Fault::Conflict) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fs_buckets_on_one_dir_race_creates() {
    let dir = tempfile::tempdir().unwrap();
    let buckets: Vec<DynBucket> = (0..2)
        .map(|_| Arc::new(FsBucket::open(dir.path()).unwrap()) as DynBucket)
        .collect();
    for key in 0..20 {
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let b = buckets[t % 2].clone();
                tokio::spawn(async move {
                    let key = format!("k{key}");
                    let r = b.put(&key, body(format!("{t}")), PutCondition::IfNoneMatch);
                    (t, r.await)
                })
            })
            .collect();
        let mut won = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                (t, Ok(_)) => won.push(t),
                (_, r) => assert!(is_precondition_failed(&r), "{r:?}"),
            }
        }
        assert_eq!(won.len(), 1, "key {key}: winners {won:?}");
        let got = buckets[1].get(&format!("k{key}")).await.unwrap();
        assert_eq!(got.data, won[0].to_string().as_bytes());
    }
}

/// Where the child processes of `fs_buckets_in_two_processes_count_without_lost_updates` work.
const CHILD_DIR_ENV: &str = "MUSHROOM_TEST_FS_CAS_CHILD_DIR";
const INCREMENTS: u64 = 150;

/// A compare-and-swap counter: read, increment, `If-Match`; again on a 412.
async fn increment(b: &dyn Bucket) {
    loop {
        let now = b.get("counter").await.unwrap();
        let n: u64 = std::str::from_utf8(&now.data).unwrap().parse().unwrap();
        match b
            .put(
                "counter",
                body((n + 1).to_string()),
                PutCondition::IfMatch(now.etag),
            )
            .await
        {
            Ok(_) => return,
            Err(BucketError::PreconditionFailed { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Run as a child process by the test below; does nothing when run as a test of its own.
#[tokio::test]
async fn fs_cas_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let b = FsBucket::open(std::path::Path::new(&dir)).unwrap();
    for _ in 0..INCREMENTS {
        increment(&b).await;
    }
}

#[tokio::test]
async fn fs_buckets_in_two_processes_count_without_lost_updates() {
    let dir = tempfile::tempdir().unwrap();
    let b = FsBucket::open(dir.path()).unwrap();
    b.put("counter", body("0"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--exact", "fs_cas_child", "--nocapture", "--test-threads=1"])
                .env(CHILD_DIR_ENV, dir.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for _ in 0..INCREMENTS {
        increment(&b).await;
    }
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }
    let total = b.get("counter").await.unwrap();
    assert_eq!(
        total.data,
        (3 * INCREMENTS).to_string().as_bytes(),
        "lost updates"
    );
}

/// The destination URL for `s3_open_from_the_environment`'s child process.
const CHILD_S3_URL_ENV: &str = "MUSHROOM_TEST_S3_OPEN_CHILD_URL";

/// Run as a child process by the test below, with the AWS environment set.
#[tokio::test]
async fn s3_open_child() {
    let Ok(url) = std::env::var(CHILD_S3_URL_ENV) else {
        return;
    };
    let b = Open::read_write(&url, &CancellationToken::new())
        .open()
        .await
        .unwrap();
    assert_eq!(b.url(), url);
    let etag = b
        .put("k", body("v"), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    assert_eq!(b.get("k").await.unwrap().etag, etag);
    let listed = list_all(&*b, "").await.unwrap();
    assert_eq!(
        listed.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(),
        ["k"]
    );
}

/// `Open::read_write("s3://...")` with the standard AWS environment variables (path-style, since an
/// endpoint URL is set); the object lands under the prefix.
#[tokio::test]
async fn s3_open_from_the_environment() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let name = support::s3::create_bucket(&endpoint, "from-env").await;
    let url = format!("s3://{name}/some/prefix");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "s3_open_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_S3_URL_ENV, &url)
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .status()
        .unwrap();
    assert!(status.success(), "the child process failed");
    let client = support::s3::client(&endpoint);
    let head = client
        .head_object()
        .bucket(&name)
        .key("some/prefix/k")
        .send()
        .await;
    assert!(head.is_ok(), "the object is not under the prefix: {head:?}");
}

/// A read-only view reads what `writer` wrote and refuses every write and delete as
/// `Permanent`, changing nothing.
async fn read_only_view(writer: &dyn Bucket, reader: &dyn Bucket) {
    writer
        .put("ro/a", body("alpha"), PutCondition::None)
        .await
        .unwrap();
    writer
        .put("ro/b/c", body("gamma"), PutCondition::None)
        .await
        .unwrap();
    let a = reader.get("ro/a").await.unwrap();
    assert_eq!(&a.data[..], b"alpha");
    assert_eq!(reader.head("ro/a").await.unwrap().unwrap().etag, a.etag);
    assert_eq!(&reader.get_range("ro/b/c", 1..3).await.unwrap()[..], b"am");
    let keys: Vec<String> = list_all(reader, "ro/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, ["ro/a", "ro/b/c"]);
    let refused = [
        reader
            .put("ro/a", body("x"), PutCondition::None)
            .await
            .map(drop),
        reader
            .put("ro/new", body("x"), PutCondition::IfNoneMatch)
            .await
            .map(drop),
        reader
            .put("ro/a", body("x"), PutCondition::IfMatch(a.etag.clone()))
            .await
            .map(drop),
        reader.delete("ro/a", None).await,
        reader.delete("ro/a", Some(&a.etag)).await,
    ];
    for r in refused {
        match r {
            Err(BucketError::Permanent { message, .. }) => {
                assert!(message.contains("read-only"), "{message}")
            }
            other => panic!(
                "a write through a read-only view of {}: {other:?}",
                reader.url()
            ),
        }
    }
    assert_eq!(writer.get("ro/a").await.unwrap().etag, a.etag);
    assert!(writer.head("ro/new").await.unwrap().is_none());
    assert!(writer.head("ro/b/c").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_views_of_every_backend_read_and_refuse_writes() {
    let mem = Arc::new(MemBucket::new());
    read_only_view(&*mem, &ReadOnly::new(mem.clone())).await;
    let (dir, fs) = fs_bucket();
    let reader = Open::read_only(
        &format!("file://{}", dir.path().display()),
        &CancellationToken::new(),
    )
    .open()
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    read_only_view(&*fs, &*reader).await;
    if let Some(s3) = support::s3::bucket("read-only").await {
        read_only_view(&*s3, &ReadOnly::new(s3.clone())).await;
    }
}

/// Every path under `root` (the root included) with its kind, length, mode and mtime: what
/// any creation, removal or write under it would change.
fn tree(root: &std::path::Path) -> Vec<(String, bool, u64, u32, std::time::SystemTime)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
        }
        out.push((
            path.display().to_string(),
            meta.is_dir(),
            meta.len(),
            meta.permissions().mode(),
            meta.modified().unwrap(),
        ));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_open_creates_nothing_and_names_a_missing_destination() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("typo");
    let url = format!("file://{}", missing.display());
    match Open::read_only(&url, &CancellationToken::new())
        .open()
        .await
    {
        Err(e @ OpenError::Missing { .. }) => {
            assert_eq!(e.to_string(), format!("{url} does not exist"))
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("{url} opened"),
    }
    assert!(!missing.exists(), "a read-only open created {url}");

    // A bucket with objects and a lease: the open, reads and refused writes change nothing.
    let root = t.path().join("b");
    let writer = FsBucket::open(&root).unwrap();
    for key in ["lease", "manifests/1.json", "gen/1/x"] {
        writer
            .put(key, body(key), PutCondition::IfNoneMatch)
            .await
            .unwrap();
    }
    let before = tree(&root);
    let reader = Open::read_only(
        &format!("file://{}", root.display()),
        &CancellationToken::new(),
    )
    .open()
    .await
    .unwrap();
    assert_eq!(list_all(&*reader, "").await.unwrap().len(), 3);
    assert_eq!(&reader.get("gen/1/x").await.unwrap().data[..], b"gen/1/x");
    assert!(
        reader
            .put("gen/1/y", body("y"), PutCondition::None)
            .await
            .is_err()
    );
    assert!(reader.delete("lease", None).await.is_err());
    assert_eq!(tree(&root), before);

    // A directory that is no bucket yet stays empty: no `.lock`, no `.tmp/`.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let reader = Open::read_only(
        &format!("file://{}", empty.display()),
        &CancellationToken::new(),
    )
    .open()
    .await
    .unwrap();
    assert!(list_all(&*reader, "").await.unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(&empty).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_errors_are_one_line_in_words() {
    let words = |e: &BucketError| {
        let said = e.to_string();
        assert!(
            !said.contains('\n')
                && !said.contains("ErrorMetadata")
                && !said.contains("ServiceError("),
            "{said}"
        );
        said
    };
    // An endpoint nothing listens on: connection refused, named with the endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let closed = format!("http://127.0.0.1:{port}");
    let b = S3Bucket::new(support::s3::client(&closed), "b", "p", S3Options::default())
        .endpoint_named(&closed);
    let e = b.get("k").await.unwrap_err();
    assert!(
        matches!(
            e,
            BucketError::Unreachable {
                indeterminate: false,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_retryable());
    assert!(
        words(&e).starts_with(&format!("cannot reach the endpoint {closed}: ")),
        "{e}"
    );
    let e = b
        .put("k", body("v"), PutCondition::IfNoneMatch)
        .await
        .unwrap_err();
    assert!(
        matches!(e, BucketError::Unreachable { .. }) && e.is_indeterminate(),
        "{e:?}"
    );

    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let name = format!("missing-{}", std::process::id());
    let b = S3Bucket::new(
        support::s3::client(&endpoint),
        &name,
        "p",
        S3Options::default(),
    )
    .endpoint_named(&endpoint);
    let said = format!("bucket {name} does not exist");
    for e in [
        b.list(ListQuery::new("", None, 1)).await.unwrap_err(),
        b.get("k").await.unwrap_err(),
        b.put("k", body("v"), PutCondition::None).await.unwrap_err(),
    ] {
        assert!(matches!(e, BucketError::NoSuchBucket { .. }), "{e:?}");
        assert!(!e.is_retryable());
        assert_eq!(words(&e), said);
    }
    // A HEAD's 404 has no body: in a missing bucket it reads as "no such object" (which is
    // why a read-only open lists first).
    assert!(b.head("k").await.unwrap().is_none());
}

// ---- the bucket's clock -------------------------------------------------------------------

/// A file whose mtime says it was written an hour ago reads an hour old (the local clock is
/// the directory bucket's clock), and a rewrite makes it young again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fs_object_is_as_old_as_its_file() {
    let (dir, b) = fs_bucket();
    b.put("old", body("then"), PutCondition::None)
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    let file = std::fs::File::options()
        .write(true)
        .open(dir.path().join("old"))
        .unwrap();
    file.set_modified(std::time::SystemTime::now() - hour)
        .unwrap();
    let age = b.get("old").await.unwrap().age.expect("an age");
    assert!(age >= hour && age < hour + YOUNG, "{age:?}");
    b.put("old", body("now"), PutCondition::None).await.unwrap();
    let age = b.get("old").await.unwrap().age.expect("an age");
    assert!(age < YOUNG, "rewritten, yet {age:?} old");
}

/// On moto the age is the store's `Date` minus its `Last-Modified`: an object read two
/// seconds after its write is at least a second old (the headers have whole seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_object_ages_by_the_stores_clock() {
    let Some(b) = support::s3::bucket("ages").await else {
        return;
    };
    b.put("aging", body("x"), PutCondition::None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let age = b
        .get("aging")
        .await
        .unwrap()
        .age
        .expect("moto sends a Date");
    assert!(age >= Duration::from_secs(1), "{age:?}");
}

/// A minimal S3 endpoint on 127.0.0.1:0 that answers every request with one GetObject
/// response, with `Last-Modified` and with `date` (when given) as its `Date` header, and
/// closes the connection. Returns its URL.
async fn fixed_get_endpoint(date: Option<&'static str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let date = date.map_or(String::new(), |d| format!("Date: {d}\r\n"));
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"e\"\r\n\
                 Last-Modified: Tue, 01 Dec 2026 10:00:00 GMT\r\n{date}Connection: close\r\n\r\nhello"
            );
            let _ = conn.write_all(answer.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
    });
    url
}

/// The age is read from the raw response's headers, through the SDK: seven seconds between
/// `Last-Modified` and `Date` read as exactly seven; an endpoint that sends no `Date` gives
/// no age, and the object still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_age_is_date_minus_last_modified_and_none_without_a_date() {
    let with_date = fixed_get_endpoint(Some("Tue, 01 Dec 2026 10:00:07 GMT")).await;
    let b = S3Bucket::new(
        support::s3::client(&with_date),
        "b",
        "p",
        S3Options::default(),
    );
    let got = b.get("k").await.unwrap();
    assert_eq!(&got.data[..], b"hello");
    assert_eq!(got.age, Some(Duration::from_secs(7)));

    let without = fixed_get_endpoint(None).await;
    let b = S3Bucket::new(
        support::s3::client(&without),
        "b",
        "p",
        S3Options::default(),
    );
    let got = b.get("k").await.unwrap();
    assert_eq!((&got.data[..], got.etag.as_str()), (&b"hello"[..], "\"e\""));
    assert_eq!(got.age, None, "no Date header, no age");
}

/// The memory bucket ages by the tokio clock, so a paused test clock ages its objects.
#[tokio::test(start_paused = true)]
async fn a_mem_object_ages_with_the_tokio_clock() {
    let b = MemBucket::new();
    b.put("m", body("x"), PutCondition::None).await.unwrap();
    assert_eq!(b.get("m").await.unwrap().age, Some(Duration::ZERO));
    tokio::time::advance(Duration::from_secs(90)).await;
    assert_eq!(b.get("m").await.unwrap().age, Some(Duration::from_secs(90)));
}
