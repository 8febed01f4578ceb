//! Fuzzing a hostile bucket (issue 25): a valid backed-up prefix (a `file://` bucket, zstd
//! objects, a snapshot, archives, segments, two restore points) into which arbitrary objects,
//! zstd bombs (re-sealed into their manifest entries), edited manifests, edited keys and
//! edited or garbage LATEST are written; then `restore` and `verify` (the library calls the
//! binary makes) run against it. For every case:
//! - neither panics (a panic on the blocking pool comes back as an error saying so, which
//!   fails the case too);
//! - the bytes allocated at peak, by every thread of this process, stay under
//!   [`MEMORY_BOUND`] (a counting global allocator), whatever a key or a manifest claims;
//! - nothing is written outside the target: the target's parent holds only the target after a
//!   restore that succeeded, and nothing after one that failed;
//! - a restore succeeds with a store that reads back (the format's reader) at the commit it
//!   reports, or fails with an error naming what was wrong: an object (`gen/…`, `manifests/…`,
//!   `LATEST`), the bucket, or the restored file that did not read back.
//!
//! The default run is [`DEFAULT_CASES`] cases from a fixed seed (well under a minute on a
//! debug build). It prints its seed; `MUSHROOM_FUZZ_SEED=<u64>` replays or changes it, and a
//! failure names the seed, the case and its mutations. The long run is `#[ignore]`d:
//!
//! ```sh
//! MUSHROOM_FUZZ_CASES=5000 cargo test --test hostile_bucket -- --ignored --nocapture
//! ```

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};

use mushroom_backup::bucket::fs::FsBucket;
use mushroom_backup::restore::{self, RestoreOptions};
use mushroom_backup::store::engine::{ValueKind, WriteOptions};
use mushroom_backup::verify::{self, VerifyOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::hostile::{BOMB_BLOCK, names, zstd_bomb};

/// A bucket's objects by key.
type Files = BTreeMap<String, Vec<u8>>;

/// Cases of the default run.
const DEFAULT_CASES: u64 = 48;
/// The most bytes a restore or a verify of one case may hold allocated at once: verify holds
/// up to `verify::PLAIN_IN_MEMORY` (32 MiB) of plain bytes per object in flight, and a case
/// plants at most four objects that decode to that much; a restore holds far less.
const MEMORY_BOUND: isize = 256 << 20;

// ---------------------------------------------------------------------------------------------
// Peak allocation of the whole process (nextest runs each test in its own process).

struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Past this many live bytes while a case runs, an allocation fails (the process aborts
/// naming the size, and the case it was on is the last one printed) instead of taking the
/// machine's memory.
const HARD_CAP: isize = 2 << 30;

/// Whether an allocation of `size` more bytes is refused ([`HARD_CAP`]).
fn over_cap(size: usize) -> bool {
    ARMED.load(Relaxed) && LIVE.load(Relaxed).saturating_add(size as isize) > HARD_CAP
}

fn count(delta: isize) {
    if ARMED.load(Relaxed) {
        let now = LIVE.fetch_add(delta, Relaxed) + delta;
        PEAK.fetch_max(now, Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counting only touches atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if over_cap(new_size) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // The old and the new block may both be live for a moment.
            count(new_size as isize);
            count(-(layout.size() as isize));
        }
        p
    }
}

/// `f()`, and the most bytes allocated at once (counted from zero) while it ran.
fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, isize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    ARMED.store(true, Relaxed);
    let r = f();
    ARMED.store(false, Relaxed);
    (r, PEAK.load(Relaxed))
}

// ---------------------------------------------------------------------------------------------
// The valid prefix, made once.

/// Every file of the valid prefix, by key.
fn base() -> &'static Files {
    static BASE: OnceLock<Files> = OnceLock::new();
    BASE.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let (store, bucket) = (t.path().join("s"), t.path().join("b"));
        let rt = tokio::runtime::Runtime::new().unwrap();
        let write = |commits| {
            support::store::write_with(
                &store,
                WriteOptions {
                    commits,
                    value_size: 200,
                    snapshot_every: 120,
                    rotate_bytes: 8192,
                    seed: 3,
                    value_kind: ValueKind::Text,
                    ..WriteOptions::default()
                },
            );
        };
        for commits in [300, 40] {
            write(commits);
            let mut w = support::store::worker(
                &store,
                support::store::fs_bucket(&bucket),
                support::store::config(),
            );
            rt.block_on(w.run_once()).expect("back up the base prefix");
        }
        support::store::tree(&bucket)
            .into_iter()
            .map(|(p, b)| (p.to_string_lossy().into_owned(), b))
            .filter(|(k, _)| k != "lease")
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// One hostile change to the prefix.
#[derive(Debug, Clone)]
enum Mutation {
    /// Writes `bytes` at `key` (a new object or over an existing one).
    Put { key: String, bytes: Bytes },
    /// Removes an object.
    Delete { key: String },
    /// Sets a field of an entry of a manifest (`entry` indexes every entry in order).
    Field {
        manifest: String,
        entry: usize,
        field: &'static str,
        value: serde_json::Value,
    },
    /// Replaces the object an entry names with a zstd bomb of `blocks` blocks, re-sealing
    /// the entry's stored length and CRC, and states `plain_len`.
    Bomb {
        manifest: String,
        entry: usize,
        blocks: usize,
        plain_len: u64,
    },
    /// Writes LATEST.
    Latest { bytes: Bytes },
}

/// Bytes to write, described (so a failure's message stays short).
#[derive(Debug, Clone)]
enum Bytes {
    Random {
        len: usize,
        seed: u64,
    },
    Bomb {
        blocks: usize,
    },
    /// An existing object cut short.
    Cut {
        key: String,
        len: usize,
    },
    /// The zstd of `len` zeros.
    Zeros {
        len: usize,
    },
    Text(String),
}

impl Bytes {
    fn make(&self, files: &Files) -> Vec<u8> {
        match self {
            Bytes::Random { len, seed } => {
                let mut r = ChaCha8Rng::seed_from_u64(*seed);
                (0..*len).map(|_| r.random()).collect()
            }
            Bytes::Bomb { blocks } => zstd_bomb(*blocks),
            Bytes::Cut { key, len } => {
                let b = files.get(key).cloned().unwrap_or_default();
                b[..(*len).min(b.len())].to_vec()
            }
            Bytes::Zeros { len } => zstd::bulk::compress(&vec![0u8; *len], 3).unwrap(),
            Bytes::Text(s) => s.clone().into_bytes(),
        }
    }
}

fn pick<'a, T>(r: &mut ChaCha8Rng, from: &'a [T]) -> &'a T {
    &from[r.random_range(0..from.len())]
}

const EDGES: &[u64] = &[
    0,
    1,
    47,
    48,
    4096,
    (32 << 20) + 1,
    1 << 35,
    1 << 40,
    u32::MAX as u64,
    1 << 63,
    u64::MAX,
];

fn bytes(r: &mut ChaCha8Rng, keys: &[String]) -> Bytes {
    match r.random_range(0..5) {
        0 => Bytes::Random {
            len: r.random_range(0..4000),
            seed: r.random(),
        },
        1 => Bytes::Bomb {
            blocks: *pick(r, &[1, 100, 2000, 262_142]),
        },
        2 => Bytes::Cut {
            key: pick(r, keys).clone(),
            len: r.random_range(0..200),
        },
        3 => Bytes::Zeros {
            len: r.random_range(0..(4 << 20)),
        },
        _ => Bytes::Text(pick(r, &["", "{}", "null", "[]", "{\"format\":1}"]).to_string()),
    }
}

fn field_value(r: &mut ChaCha8Rng, field: &str, keys: &[String]) -> serde_json::Value {
    match field {
        "codec" => (*pick(r, &["zstd", "none", "lz4", ""])).into(),
        "encrypted" => r.random::<bool>().into(),
        "key" => {
            let existing = pick(r, keys).clone();
            pick(
                r,
                &[
                    existing.as_str(),
                    "../../escape",
                    "/etc/passwd",
                    "gen/0000000001/wal/00000000000000000000-18446744073709551615.seg",
                    "manifests/../LATEST",
                ],
            )
            .to_string()
            .into()
        }
        "name" => (*pick(
            r,
            &[
                "../evil",
                "/tmp/evil",
                "a/b",
                ".",
                "",
                "wal.bin",
                "x\0y",
                "store.meta",
            ],
        ))
        .into(),
        _ => (*pick(r, EDGES)).into(),
    }
}

const FIELDS: &[&str] = &[
    "len",
    "crc",
    "plain_len",
    "plain_crc",
    "codec",
    "encrypted",
    "key",
    "name",
    "start",
    "end",
    "frames",
    "number",
    "commit_seq",
    "generation",
];

fn mutation(r: &mut ChaCha8Rng, keys: &[String], manifests: &[String]) -> Mutation {
    match r.random_range(0..10) {
        0..=2 => {
            let manifest = pick(r, manifests).clone();
            let field = *pick(r, FIELDS);
            Mutation::Field {
                entry: r.random_range(0..64),
                value: field_value(r, field, keys),
                field,
                manifest,
            }
        }
        3..=4 => Mutation::Bomb {
            manifest: pick(r, manifests).clone(),
            entry: r.random_range(0..64),
            blocks: *pick(r, &[1, 7, 64, 255, 1000]),
            plain_len: *pick(r, &[0, 1 << 20, 1 << 30, 1 << 35, 1 << 40, u64::MAX]),
        },
        5..=6 => {
            let generation = pick(r, &[1u64, 2, 3]);
            let start = *pick(r, EDGES);
            let end = start.saturating_add(*pick(r, EDGES));
            let key = match r.random_range(0..4) {
                0 => pick(r, keys).clone(),
                1 => format!("gen/{generation:010}/wal/{start:020}-{end:020}.seg"),
                2 => format!("manifests/{:020}.json", r.random_range(0..1000u64)),
                _ => format!("gen/{generation:010}/snapshot.bin"),
            };
            Mutation::Put {
                bytes: bytes(r, keys),
                key,
            }
        }
        7 => Mutation::Delete {
            key: pick(r, keys).clone(),
        },
        _ => Mutation::Latest {
            bytes: match r.random_range(0..3) {
                0 => Bytes::Text(format!(
                    "{{\"manifest\":\"{}\",\"commit_seq\":{},\"lineage\":\"00000000-0000-0000-0000-000000000000\"}}",
                    pick(r, manifests),
                    pick(r, EDGES)
                )),
                1 => bytes(r, keys),
                _ => Bytes::Text("{\"manifest\":\"../../etc/passwd\"}".into()),
            },
        },
    }
}

/// Every object entry of a manifest, in order (snapshot, archives, segments, side files).
fn entries_mut(m: &mut serde_json::Value) -> Vec<&mut serde_json::Value> {
    let mut out = Vec::new();
    let serde_json::Value::Object(map) = m else {
        return out;
    };
    for (k, v) in map.iter_mut() {
        match (k.as_str(), v) {
            ("snapshot", v @ serde_json::Value::Object(_)) => out.push(v),
            ("archives" | "segments" | "side_files", serde_json::Value::Array(a)) => {
                out.extend(a.iter_mut())
            }
            _ => {}
        }
    }
    out
}

fn apply(files: &mut Files, m: &Mutation) {
    let edit = |files: &mut Files,
                manifest: &str,
                entry: usize,
                f: &mut dyn FnMut(&mut serde_json::Value, &mut Files)| {
        let Some(bytes) = files.get(manifest) else {
            return;
        };
        let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return;
        };
        let mut others = files.clone();
        {
            let mut list = entries_mut(&mut v);
            if list.is_empty() {
                return;
            }
            let n = list.len();
            f(list[entry % n], &mut others);
        }
        others.insert(manifest.to_string(), serde_json::to_vec_pretty(&v).unwrap());
        *files = others;
    };
    match m {
        Mutation::Put { key, bytes } => {
            let b = bytes.make(files);
            files.insert(key.clone(), b);
        }
        Mutation::Delete { key } => {
            files.remove(key);
        }
        Mutation::Field {
            manifest,
            entry,
            field,
            value,
        } => edit(files, manifest, *entry, &mut |e, _| {
            e[*field] = value.clone()
        }),
        Mutation::Bomb {
            manifest,
            entry,
            blocks,
            plain_len,
        } => edit(files, manifest, *entry, &mut |e, files| {
            let Some(key) = e["key"].as_str().map(str::to_string) else {
                return;
            };
            let bomb = zstd_bomb(*blocks);
            e["len"] = bomb.len().into();
            e["crc"] = crc32fast::hash(&bomb).into();
            e["codec"] = "zstd".into();
            // The bomb's own length, or a claim.
            let exact = *blocks as u64 * BOMB_BLOCK;
            e["plain_len"] = if *plain_len == 0 { exact } else { *plain_len }.into();
            if e.get("plain_crc").is_none_or(|c| c.is_null()) {
                e["plain_crc"] = 0.into();
            }
            files.insert(key, bomb);
        }),
        Mutation::Latest { bytes } => {
            let b = bytes.make(files);
            files.insert("LATEST".into(), b);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One case.

/// Whether `error` names what was wrong: an object (a key the bucket holds or a manifest
/// names, however hostile), a generation (its key), the bucket, or a restored file that did
/// not read back.
fn names_what_was_wrong(error: &str, url: &str, files: &Files) -> bool {
    let mut named: Vec<String> = [
        "gen/",
        "manifests/",
        "LATEST",
        url,
        "read-back of ",
        "generation ",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (key, bytes) in files {
        named.push(key.clone());
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            strings(&v, &mut named);
        }
    }
    named
        .iter()
        .any(|w| !w.is_empty() && error.contains(w.as_str()))
}

/// Every string in `v`.
fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        serde_json::Value::Object(m) => m.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

fn one_case(rt: &tokio::runtime::Runtime, seed: u64, case: u64) {
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut files = base().clone();
    let keys: Vec<String> = files.keys().cloned().collect();
    let manifests: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("manifests/"))
        .cloned()
        .collect();
    let mutations: Vec<Mutation> = (0..r.random_range(1..=4))
        .map(|_| mutation(&mut r, &keys, &manifests))
        .collect();
    for m in &mutations {
        apply(&mut files, m);
    }
    let what = format!("seed {seed} case {case}: {mutations:?}");
    eprintln!("{what}");

    let t = tempfile::tempdir().unwrap();
    let (bucket_dir, out) = (t.path().join("bucket"), t.path().join("out"));
    for (key, bytes) in &files {
        let path = bucket_dir.join(key);
        // A key that is not a plain relative path is not written (the file bucket refuses it).
        if key.is_empty()
            || key.starts_with('/')
            || key
                .split('/')
                .any(|c| c == ".." || c == "." || c.is_empty())
        {
            continue;
        }
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    std::fs::create_dir(&out).unwrap();
    let bucket = FsBucket::open(&bucket_dir).expect("open the bucket");
    let url = mushroom_backup::bucket::Bucket::url(&bucket);
    let target = out.join("store");

    let (restored, peak) = peak_alloc(|| {
        rt.block_on(restore::restore(
            &bucket,
            &target,
            &RestoreOptions::default(),
        ))
    });
    assert!(
        peak < MEMORY_BOUND,
        "{what}: restore held {peak} bytes at peak"
    );
    match &restored {
        Ok(report) => {
            assert_eq!(
                names(&out),
                vec!["store".to_string()],
                "{what}: beside the target"
            );
            let back = restore::read_back(&target)
                .unwrap_or_else(|e| panic!("{what}: the restored store does not read back: {e}"));
            assert_eq!(back.commit_seq, report.commit_seq, "{what}");
        }
        Err(e) => {
            let e = e.to_string();
            assert!(!e.contains("panicked"), "{what}: {e}");
            assert!(
                names_what_was_wrong(&e, &url, &files),
                "{what}: the error names nothing: {e}"
            );
            assert_eq!(
                names(&out),
                Vec::<String>::new(),
                "{what}: left beside the target"
            );
        }
    }
    let (verified, peak) =
        peak_alloc(|| rt.block_on(verify::verify(&bucket, &VerifyOptions::default())));
    assert!(
        peak < MEMORY_BOUND,
        "{what}: verify held {peak} bytes at peak"
    );
    if let Ok(report) = &verified {
        for m in report.manifests.iter().filter(|m| !m.ok) {
            assert!(!m.problems.is_empty(), "{what}: {m:?}");
            assert!(
                m.problems.iter().all(|p| !p.contains("panicked")),
                "{what}: {m:?}"
            );
        }
    }
    // Nothing but the bucket and the target's parent in the case's directory.
    assert_eq!(
        names(t.path()),
        vec!["bucket".to_string(), "out".to_string()],
        "{what}"
    );
}

fn seed() -> u64 {
    std::env::var("MUSHROOM_FUZZ_SEED")
        .ok()
        .map(|s| s.trim().parse().expect("MUSHROOM_FUZZ_SEED is a u64"))
        .unwrap_or(0x686f_7374_696c_6521)
}

fn run(cases: u64) {
    let seed = seed();
    eprintln!("hostile_bucket: seed {seed} (MUSHROOM_FUZZ_SEED replays it), {cases} cases");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    base();
    for case in 0..cases {
        one_case(&rt, seed, case);
    }
}

#[test]
fn a_hostile_bucket_never_panics_bloats_or_escapes() {
    run(DEFAULT_CASES);
}

#[test]
#[ignore = "long: MUSHROOM_FUZZ_CASES cases (default 2000)"]
fn a_hostile_bucket_long_run() {
    let cases = std::env::var("MUSHROOM_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    run(cases);
}

/// The peak is counted across threads: a buffer filled on another thread counts.
#[test]
fn the_counter_sees_other_threads() {
    let ((), peak) = peak_alloc(|| {
        std::thread::spawn(|| drop(std::hint::black_box(vec![1u8; 8 << 20])))
            .join()
            .unwrap()
    });
    assert!(peak >= 8 << 20, "{peak}");
}
