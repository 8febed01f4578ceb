//! What a store's usage tracking (`bucket::usage`) holds in memory: the service's memory target
//! is 10,000 stores, so it must not grow with the objects a store's prefix holds. A store's
//! bucket is given 10,000 objects (put through the wrapper, then listed as retention and resume
//! list them) and the bytes still allocated are counted by this test binary's own allocator;
//! the same workload on a bare in-memory bucket is subtracted, which leaves what the wrapper
//! and its `Usage` keep. The figure is printed; the test holds it to a bound far under one
//! entry per object.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::usage::{Usage, UsageBucket};
use mushroom_backup::bucket::{Body, Bucket, DynBucket, PutCondition, list_all};

/// The system allocator, counting the bytes live in the process.
struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

fn size(layout: Layout) -> isize {
    isize::try_from(layout.size()).unwrap_or(isize::MAX)
}

// SAFETY: every call is forwarded to `System` unchanged; the counting touches only an atomic
// and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(size(layout), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(size(layout), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(size(layout), Ordering::Relaxed);
    }
}

const OBJECTS: u64 = 10_000;

/// Puts [`OBJECTS`] objects into `b` in two generations, with a manifest each, and lists
/// `manifests/` and `gen/` whole (retention's first run), then one generation (a narrow run).
async fn workload(b: &dyn Bucket) {
    let data = Body::from(Bytes::from_static(&[7u8; 100]));
    for i in 0..OBJECTS {
        let key = if i % 10 == 0 {
            format!("manifests/{i:020}.json")
        } else {
            format!("gen/{:010}/wal/{i:020}-{i:020}.seg", i % 2 + 1)
        };
        b.put(&key, data.clone(), PutCondition::IfNoneMatch)
            .await
            .unwrap();
    }
    b.put("LATEST", data.clone(), PutCondition::None)
        .await
        .unwrap();
    assert_eq!(
        list_all(b, "manifests/").await.unwrap().len() as u64,
        OBJECTS / 10
    );
    list_all(b, "gen/").await.unwrap();
    list_all(b, "gen/0000000002/").await.unwrap();
}

/// The bytes allocated while `f` ran that are still allocated after it.
async fn kept<F: std::future::Future<Output = T>, T>(f: F) -> (isize, T) {
    let before = LIVE.load(Ordering::Relaxed);
    let out = f.await;
    (LIVE.load(Ordering::Relaxed) - before, out)
}

#[tokio::test(flavor = "current_thread")]
async fn a_stores_usage_holds_a_few_hundred_bytes_whatever_its_object_count() {
    // Once first, so that whatever is allocated once for the process is not counted below.
    workload(&MemBucket::new()).await;
    let (bare, bare_bucket) = kept(async {
        let mem = MemBucket::new();
        workload(&mem).await;
        mem
    })
    .await;
    let (wrapped, (usage, wrapped_bucket)) = kept(async {
        let usage = Usage::new();
        let b: DynBucket = Arc::new(UsageBucket::new(Arc::new(MemBucket::new()), usage.clone()));
        workload(b.as_ref()).await;
        (usage, b)
    })
    .await;
    let tracking = wrapped - bare;
    let s = usage.snapshot();
    eprintln!(
        "usage tracking of one store with {OBJECTS} objects: {tracking} bytes \
         (bare bucket {bare} bytes, wrapped {wrapped} bytes); usage {s:?}"
    );
    assert_eq!(s.objects_stored, OBJECTS + 1, "{s:?}");
    assert_eq!(s.bytes_stored, (OBJECTS + 1) * 100, "{s:?}");
    assert_eq!(
        usage.stored_groups(),
        4,
        "manifests/, two generations, LATEST"
    );
    assert!(
        tracking < 4096,
        "the usage of one store holds {tracking} bytes for {OBJECTS} objects"
    );
    drop((bare_bucket, wrapped_bucket));
}
