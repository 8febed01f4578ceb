//! Listing restore points costs a page (`src/listing.rs`): counted at the S3 server (a proxy in
//! front of moto that counts every HTTP request) and at the bucket (the counting wrapper), for
//! one page, for every page of a prefix, and for `ctl list-restore-points --all` against a real
//! `serve`. Then the order and the cursor on prefixes that make it work: restore points far
//! apart, junk keys, invalid manifests, no LATEST.
//!
//! The figures are printed (`--nocapture`); the assertions are bounds that the old listing (a
//! LIST of every key and a GET of every manifest, for every page) breaks by far.

mod support;

use std::sync::Arc;

use futures::StreamExt;
use mushroom_backup::bucket::counting::CountingBucket;
use mushroom_backup::bucket::mem::MemBucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};
use mushroom_backup::bucket::{Body, Bucket, DynBucket, ListQuery, PutCondition};
use mushroom_backup::listing::{self, Cursor};
use mushroom_backup::manifest::{
    self, FORMAT, LATEST_KEY, Latest, Manifest, ObjectEntry, SegmentEntry,
};
use support::fault_proxy::{FaultPlan, FaultProxy};
use uuid::Uuid;

const POINTS: u64 = 300;
const PAGE: usize = 10;

/// A valid manifest at `commit_seq` (one segment holding every frame; nothing is downloaded by
/// a listing, so the objects it names need not exist).
fn manifest_at(lineage: Uuid, commit_seq: u64) -> Manifest {
    let generation = 1 + commit_seq / 1000;
    let end = 64 + commit_seq;
    Manifest {
        format: FORMAT,
        lineage,
        generation,
        commit_seq,
        created_at: manifest::now_rfc3339(),
        wal_floor: 0,
        wal_id: Uuid::from_u64_pair(7, generation),
        wal_number: 1,
        snapshot: None,
        archives: Vec::new(),
        segments: vec![SegmentEntry {
            object: ObjectEntry {
                key: manifest::segment_key(generation, 0, end),
                len: end,
                crc: 0,
                lineage,
                generation,
                ..Default::default()
            },
            start: 0,
            end,
            frames: commit_seq,
        }],
        side_files: Vec::new(),
        parent: None,
        branch: None,
        branched_from: None,
    }
}

/// Writes a manifest at every commit count of `seqs` (16 PUTs in flight) and LATEST naming
/// the highest.
async fn seed(b: &dyn Bucket, seqs: &[u64]) {
    let lineage = Uuid::from_u64_pair(1, 2);
    futures::stream::iter(seqs.iter().copied())
        .map(|seq| async move {
            let m = manifest_at(lineage, seq);
            b.put(&m.key(), Body::from(m.encode()), PutCondition::None)
                .await
                .unwrap();
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let top = *seqs.iter().max().unwrap();
    let latest = Latest {
        manifest: manifest::manifest_key(top),
        commit_seq: top,
        lineage,
        adopted_by: None,
        adopted_at: None,
    };
    b.put(LATEST_KEY, Body::from(latest.encode()), PutCondition::None)
        .await
        .unwrap();
}

/// Every page from the first, with the requests each cost at the bucket.
async fn all_pages(b: &CountingBucket, size: usize) -> (Vec<listing::Page>, Vec<u64>) {
    let (mut pages, mut costs, mut cursor) = (Vec::new(), Vec::new(), None);
    loop {
        assert!(pages.len() < 10_000, "paging does not end");
        let before = b.counts().snapshot().total;
        let page = listing::page(b, cursor, size).await.unwrap();
        costs.push(b.counts().snapshot().total - before);
        cursor = page.next;
        pages.push(page);
        if cursor.is_none() {
            return (pages, costs);
        }
    }
}

fn seqs_of(pages: &[listing::Page]) -> Vec<u64> {
    pages
        .iter()
        .flat_map(|p| p.points.iter().map(|l| l.manifest.commit_seq))
        .collect()
}

/// A moto bucket written directly, and a counting view of it through the counting proxy.
struct Counted {
    proxy: FaultProxy,
    direct: DynBucket,
    counted: Arc<CountingBucket>,
    name: String,
}

async fn counted_s3(hint: &str) -> Option<Counted> {
    let endpoint = support::s3::endpoint()?;
    let name = support::s3::create_bucket(&endpoint, hint).await;
    let direct: DynBucket = Arc::new(S3Bucket::new(
        support::s3::client(&endpoint),
        &name,
        "root",
        S3Options::default(),
    ));
    let none = FaultPlan {
        slow_down: 0,
        drop_after: 0,
        delay: 0,
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start_seeded(&endpoint, none, 1);
    let through = S3Bucket::new(
        support::s3::client(proxy.url()),
        &name,
        "root",
        S3Options::default(),
    )
    .endpoint_named(proxy.url());
    let counted = Arc::new(CountingBucket::new(Arc::new(through)));
    Some(Counted {
        proxy,
        direct,
        counted,
        name,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_ten_of_three_hundred_costs_at_most_thirty_requests_at_the_server() {
    let Some(c) = counted_s3("listing-page").await else {
        return;
    };
    let seqs: Vec<u64> = (1..=POINTS).map(|i| i * 37).collect();
    seed(&*c.direct, &seqs).await;

    // As the service answers ListRestorePoints: the read-only open's probe LIST, then a page.
    let server_before = c.proxy.counts().requests;
    c.counted
        .list(ListQuery::new("", None, 1))
        .await
        .expect("the open's probe");
    let page = listing::page(&*c.counted, None, PAGE).await.unwrap();
    let at_server = c.proxy.counts().requests - server_before;
    let at_bucket = c.counted.counts().snapshot();
    eprintln!(
        "first page of {PAGE} of {POINTS}: {at_server} requests at the server, at the bucket \
         {at_bucket:?}"
    );
    let got: Vec<u64> = page.points.iter().map(|p| p.manifest.commit_seq).collect();
    let want: Vec<u64> = seqs.iter().rev().take(PAGE).copied().collect();
    assert_eq!(got, want, "the newest {PAGE}, newest first");
    assert!(page.points[0].is_latest && page.points[1..].iter().all(|p| !p.is_latest));
    assert!(page.next.is_some());
    assert_eq!(
        at_server, at_bucket.total,
        "the server saw what the bucket sent"
    );
    assert!(at_server <= 30, "{at_server} requests for one page");
    assert_eq!(
        at_bucket.get,
        1 + PAGE as u64,
        "LATEST and the page's manifests"
    );

    // A page from the middle, from its token as a client passes it back.
    let token = Cursor::parse(&page.next.unwrap().token()).expect("a token parses");
    let server_before = c.proxy.counts().requests;
    let middle = listing::page(&*c.counted, Some(token), PAGE).await.unwrap();
    let at_server = c.proxy.counts().requests - server_before;
    eprintln!("second page: {at_server} requests at the server");
    assert!(at_server <= 30, "{at_server} requests for the second page");
    let got: Vec<u64> = middle
        .points
        .iter()
        .map(|p| p.manifest.commit_seq)
        .collect();
    let want: Vec<u64> = seqs.iter().rev().skip(PAGE).take(PAGE).copied().collect();
    assert_eq!(got, want);

    // What the listing every page cost before: every manifest, for one page.
    let server_before = c.proxy.counts().requests;
    let old = mushroom_backup::verify::list_restore_points(&*c.counted)
        .await
        .unwrap();
    assert_eq!(old.len(), POINTS as usize);
    eprintln!(
        "the whole-prefix listing (what every page cost before, without the open's probe): {} \
         requests",
        c.proxy.counts().requests - server_before
    );

    // Every page: each restore point exactly once, newest first, every page within bounds.
    let server_before = c.proxy.counts().requests;
    let (pages, costs) = all_pages(&c.counted, PAGE).await;
    let total = c.proxy.counts().requests - server_before;
    eprintln!(
        "all {} pages of {PAGE}: {total} requests at the server, per page {costs:?}",
        pages.len()
    );
    let mut want = seqs.clone();
    want.reverse();
    assert_eq!(seqs_of(&pages), want, "every point once, newest first");
    assert_eq!(pages.len(), POINTS as usize / PAGE);
    assert!(costs.iter().all(|&c| c <= 30), "{costs:?}");
    assert!(
        total <= POINTS + 3 * pages.len() as u64,
        "{total} requests to page through {POINTS} points: not in proportion to them"
    );
}

/// `ctl list-restore-points --all` against a real `serve` whose destination is on moto
/// behind the counting proxy: every point once, newest first, and requests in proportion to
/// the points. The store's worker is kept off the bucket by a fresh lease of another holder
/// (it looks again only after a third of that lease's hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ctl_list_all_follows_the_pages_at_a_cost_in_proportion_to_the_points() {
    let Some(c) = counted_s3("listing-ctl").await else {
        return;
    };
    let seqs: Vec<u64> = (1..=POINTS).map(|i| 1000 + i * 5).collect();
    seed(&*c.direct, &seqs).await;
    let lease = mushroom_backup::lease::LeaseRecord {
        holder: "someone-else".into(),
        host: "elsewhere".into(),
        store: "another store".into(),
        ttl_ms: 3_600_000,
        renewals: 0,
        acquired_at: manifest::now_rfc3339(),
        fence: None,
        ack_window_ms: None,
    };
    c.direct
        .put(
            manifest::LEASE_KEY,
            Body::from(lease.to_json()),
            PutCondition::None,
        )
        .await
        .unwrap();

    let d = support::service::dirs();
    let mut cmd = support::service::serve_command(&d, "a", None, &[]);
    cmd.env("AWS_ENDPOINT_URL", c.proxy.url());
    let server = support::service::Server::start("serve", cmd);
    let mut client = server.client().await;
    let store = d.root.join("s1");
    std::fs::create_dir_all(&store).unwrap();
    let destination = format!("s3://{}/root", c.name);
    let id = client
        .register(support::register_req(&store, &destination))
        .await
        .expect("register")
        .into_inner()
        .store_id;
    support::served::wait_health(
        &client,
        &id,
        "the worker to find the lease held elsewhere",
        |s| !s.lease_held && s.lease_holder.starts_with("someone-else"),
    )
    .await;

    let before = c.proxy.counts().requests;
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new(support::binary::BIN)
            .args(["ctl", "--server", &format!("http://{}", server.addr)])
            .args(["list-restore-points", &id, "--all", "--page-size"])
            .arg(PAGE.to_string())
            .arg("--json")
            .env("MUSHROOMDB_BACKUP_LOG", "off")
            .env_remove("MUSHROOMDB_BACKUP_ADMIN_TOKEN")
            .output()
            .expect("run ctl")
    });
    let requests = c.proxy.counts().requests - before;
    assert!(
        out.status.success(),
        "ctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ctl prints JSON");
    let got: Vec<u64> = v["restore_points"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| p["commit_seq"].as_u64().expect("a commit_seq"))
        .collect();
    let mut want = seqs.clone();
    want.reverse();
    assert_eq!(got, want, "every point once, newest first");
    assert_eq!(v["next_page_token"], "", "--all ends at the last page");
    let pages = POINTS / PAGE as u64;
    eprintln!(
        "ctl list-restore-points --all --page-size {PAGE}: {requests} requests at the server for {POINTS} points"
    );
    // Per page: the read-only open's probe, LATEST, a LIST or two, the page's GETs.
    assert!(
        requests <= POINTS + 4 * pages,
        "{requests} requests for {POINTS} points in {pages} pages"
    );
}

/// Restore points whose commit counts are far apart and uneven (windows must widen), junk
/// under `manifests/`, invalid manifests, and no LATEST: every valid point once, newest first,
/// for every page size; and a token of an earlier server (a bare manifest key) still pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_hold_every_valid_point_once_however_the_points_lie() {
    let mem = Arc::new(MemBucket::new());
    let mut seqs: Vec<u64> = (0..40u64).map(|i| i * i * i * 1_000_003).collect();
    seqs.extend([1, 2, 3, u64::MAX / 2, u64::MAX / 2 + 1]);
    seqs.sort();
    seqs.dedup();
    seed(&*mem, &seqs).await;
    // Junk: not manifest keys, and manifest keys that do not decode.
    for key in [
        "manifests/zzz",
        "manifests/+0000000000000000005.json",
        "manifests/.tmp",
    ] {
        mem.put(key, Body::from(b"junk".to_vec()), PutCondition::None)
            .await
            .unwrap();
    }
    let invalid = [seqs[5], seqs[6], seqs[7], seqs[30]];
    for seq in invalid {
        mem.put(
            &manifest::manifest_key(seq),
            Body::from(b"{not json".to_vec()),
            PutCondition::None,
        )
        .await
        .unwrap();
    }
    let mut want: Vec<u64> = seqs
        .iter()
        .filter(|s| !invalid.contains(s))
        .copied()
        .collect();
    want.reverse();
    let counted = CountingBucket::new(mem.clone());
    for size in [1, 2, 3, 7, 100] {
        let (pages, costs) = all_pages(&counted, size).await;
        assert_eq!(seqs_of(&pages), want, "page size {size}");
        assert!(pages.iter().all(|p| p.points.len() <= size));
        eprintln!(
            "{} points far apart, page size {size}: per page {costs:?}",
            want.len()
        );
    }
    // Without LATEST, the first page lists everything; the rest is the same.
    mem.delete(LATEST_KEY, None).await.unwrap();
    let (pages, _) = all_pages(&counted, 4).await;
    assert_eq!(seqs_of(&pages), want, "no LATEST");
    assert!(pages.iter().flat_map(|p| &p.points).all(|p| !p.is_latest));
    // A bare manifest key is a token: the points below it.
    let below = want[10];
    let page = listing::page(&counted, Cursor::parse(&manifest::manifest_key(below)), 3)
        .await
        .unwrap();
    let got: Vec<u64> = page.points.iter().map(|p| p.manifest.commit_seq).collect();
    assert_eq!(got, want[11..14].to_vec());
    // An empty prefix: one empty last page.
    let empty = CountingBucket::new(Arc::new(MemBucket::new()));
    let page = listing::page(&empty, None, 10).await.unwrap();
    assert!(page.points.is_empty() && page.next.is_none());
}
