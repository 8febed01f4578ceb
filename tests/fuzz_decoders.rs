//! Fuzzing of every decoder of bytes that come from disk, the bucket or the network
//! (issue 11, item 15): WAL headers and frames, snapshots, `wal.position`, the reference
//! engine's commit and map payloads, manifests, LATEST, GENERATION claims, the lease object,
//! `backup.lineage`, `backup.parent`, `store.meta`, bucket keys and `ListRestorePoints` page
//! tokens, side-file names, store-directory archive names and the gRPC request messages.
//!
//! Each decoder is a [`Target`]. Its inputs are arbitrary bytes, or a valid encoding from a
//! generator (those of `format_props` and `manifest_props`, in `support/generators.rs`, and
//! more here) with up to six [`Edit`]s: a byte flipped, removed or inserted, a cut, an
//! extension, a slice copied elsewhere, a little-endian u32/u64 overwritten with a huge value
//! (a length field claiming far more than the input holds), a token inserted or written over
//! (`/`, `..`, NUL, a quote, a `+`, invalid UTF-8…), or a decimal number replaced by an
//! extreme one (`18446744073709551615`, `-1`, `1e400`…). After the edits the checksums are
//! re-sealed half the time, so that a mutation reaches the checks behind the CRC. For every
//! input:
//! - the decoder returns (an error is fine) and never panics;
//! - the bytes it allocates at peak stay within `PER_BYTE * input + FIXED` (a counting
//!   global allocator of this test binary, per thread): a length field is refused against the
//!   input or a cap before anything is allocated for it;
//! - what it accepts has the decoder's own invariants (a decoded manifest adds up, an accepted
//!   key is the one canonical spelling of its number, an accepted side-file name is one plain
//!   path component…);
//! - an unedited valid encoding decodes to what was encoded.
//!
//! The default run ([`DEFAULT_CASES`] cases per decoder, a fixed seed) takes seconds on a
//! debug build. The long run, at least a million cases per decoder, is `#[ignore]`d:
//!
//! ```sh
//! MUSHROOM_FUZZ_CASES=1000000 cargo test --release --test fuzz_decoders -- --ignored --nocapture
//! ```
//!
//! It prints cases and wall time per decoder (a million each took 10–46 s per decoder here,
//! about 5 minutes in all). A release build has no overflow checks, so arithmetic that would
//! wrap panics only in a debug build: the same run without `--release` catches those too, at
//! about half a millisecond a case. `MUSHROOM_FUZZ_SEED=<u64>` changes the seed
//! (of either run; the default is fixed so that runs are repeatable), and
//! `MUSHROOM_FUZZ_ONLY=<name>` runs one decoder. A failure prints the decoder, the seed and the
//! minimal input proptest shrank it to; proptest also records it in
//! `fuzz_decoders.proptest-regressions` beside this file, replayed first by later runs, and
//! each bug found is kept below as a named regression test.

#[path = "support/generators.rs"]
mod generators;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::path::{Component, Path};
use std::time::{Duration, Instant};

use generators::{Trickle, edge_u64, map, op, payloads, uuid};
use mushroom_backup::lease::{FenceRef, LeaseRecord, MAX_TTL};
use mushroom_backup::manifest::{
    ArchiveEntry, FORMAT, GenerationClaim, Latest, Manifest, ObjectEntry, ParentRef, SegmentEntry,
    SideFileEntry, SnapshotEntry, archive_key, generation_key, manifest_key, parse_generation,
    parse_manifest_key, parse_segment_key, segment_key, side_key, snapshot_key,
};
use mushroom_backup::restore::readback::is_reference_engine_meta;
use mushroom_backup::restore::side_file_name_problem;
use mushroom_backup::service::proto;
use mushroom_backup::store::disk::{self, archive_name, parse_archive_name};
use mushroom_backup::store::engine::codec::{
    KvMap, Op, decode_batch, decode_map, encode_batch, encode_map,
};
use mushroom_backup::store::engine::recover::meta_format_problem;
use mushroom_backup::store::engine::{ENGINE_NAME, STORE_FORMAT};
use mushroom_backup::store::format::{
    FRAME_HEADER_LEN, ParentRecord, SNAPSHOT_HEADER_LEN, SNAPSHOT_TRAILER_LEN, SnapshotHeader,
    WAL_HEADER_LEN, WalHeader, WalPosition, check_wal, decode_snapshot, encode_snapshot, scan_wal,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, TestRng, TestRunner};
use prost::Message;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Peak allocation, per thread.

/// The system allocator, counting the bytes live on each thread while [`peak_alloc`] runs.
struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy)]
struct Tally {
    armed: bool,
    live: isize,
    peak: isize,
}

thread_local! {
    static TALLY: Cell<Tally> = const { Cell::new(Tally { armed: false, live: 0, peak: 0 }) };
}

/// Counts `delta` bytes coming (or going, when negative); `transient` more are live for a
/// moment (a `realloc` may hold the old and the new block at once).
fn tally(delta: isize, transient: isize) {
    // `try_with`: an allocation while the thread is being torn down is not counted.
    let _ = TALLY.try_with(|t| {
        let mut v = t.get();
        if v.armed {
            v.peak = v.peak.max(v.live + delta + transient);
            v.live += delta;
            t.set(v);
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the counting touches only a
// thread-local `Cell` (const-initialised, no destructor) and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            tally(layout.size() as isize, 0);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            tally(layout.size() as isize, 0);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        tally(-(layout.size() as isize), 0);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            tally(
                new_size as isize - layout.size() as isize,
                layout.size() as isize,
            );
        }
        p
    }
}

/// Disarms the tally when dropped, also when `f` panics.
struct Armed;

impl Drop for Armed {
    fn drop(&mut self) {
        TALLY.with(|t| {
            t.set(Tally {
                armed: false,
                ..t.get()
            })
        });
    }
}

/// `f()`, and the most bytes it held allocated at once on this thread.
fn peak_alloc<R>(f: impl FnOnce() -> R) -> (R, usize) {
    TALLY.with(|t| {
        t.set(Tally {
            armed: true,
            live: 0,
            peak: 0,
        })
    });
    let armed = Armed;
    let r = f();
    drop(armed);
    let peak = TALLY.with(|t| t.get().peak);
    (r, peak.max(0) as usize)
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// Little-endian u32s a length field might be set to.
const HUGE_U32: &[u32] = &[
    u32::MAX,
    0x8000_0000,
    0x7fff_ffff,
    (64 << 20) + 1,
    64 << 20,
    1 << 24,
];
/// Little-endian u64s a length or count field might be set to.
const HUGE_U64: &[u64] = &[
    u64::MAX,
    u64::MAX - 1,
    1 << 63,
    (1 << 32) + 1,
    u32::MAX as u64,
];
/// Bytes that mean something to one decoder or another.
const TOKENS: &[&[u8]] = &[
    b"/",
    b"..",
    b"../",
    b".",
    b"\0",
    b"\\",
    b"+",
    b"-",
    b"\"",
    b"\\\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"true",
    b"\\u0000",
    b"\\ud800",
    b"\xff",
    b"\xc3\x28",
    b"%2e%2e",
    b"../../etc/passwd",
    b"/etc/passwd",
    b"MDBWAL01",
    b"MDBSNP01",
    b"MDBPOS01",
];
/// Decimal numbers to replace one with: the edges of u64, i64 and u32, and what JSON allows
/// but no integer field takes.
const NUMBERS: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551614",
    "9223372036854775807",
    "9223372036854775808",
    "4294967295",
    "4294967296",
    "340282366920938463463374607431768211456",
    "-1",
    "0",
    "1e400",
    "1.5",
    "-0",
];

/// One change to an encoding.
#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Remove(Index),
    Insert(Index, u8),
    Cut(Index),
    /// Appends `n` copies of a byte.
    Extend(u8, usize),
    /// Copies `[a, b)` (in either order) to `at`.
    Splice(Index, Index, Index),
    Huge32(Index, Index),
    Huge64(Index, Index),
    /// Inserts a token, or writes it over what is there.
    Token(Index, Index, bool),
    /// Replaces the first run of digits at or after the index (or the first in the input).
    Number(Index, Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    let i = || any::<Index>();
    prop_oneof![
        (i(), 1u8..=255).prop_map(|(a, m)| Edit::Flip(a, m)),
        i().prop_map(Edit::Remove),
        (i(), any::<u8>()).prop_map(|(a, b)| Edit::Insert(a, b)),
        i().prop_map(Edit::Cut),
        (any::<u8>(), 1usize..600).prop_map(|(b, n)| Edit::Extend(b, n)),
        (i(), i(), i()).prop_map(|(a, b, c)| Edit::Splice(a, b, c)),
        (i(), i()).prop_map(|(a, v)| Edit::Huge32(a, v)),
        (i(), i()).prop_map(|(a, v)| Edit::Huge64(a, v)),
        (i(), i(), any::<bool>()).prop_map(|(a, t, o)| Edit::Token(a, t, o)),
        (i(), i()).prop_map(|(a, n)| Edit::Number(a, n)),
    ]
}

fn overwrite(b: &mut Vec<u8>, at: usize, with: &[u8]) {
    let end = (at + with.len()).min(b.len());
    b.splice(at..end, with.iter().copied());
}

fn apply(b: &mut Vec<u8>, edit: &Edit) {
    if b.is_empty() {
        // Nothing to edit in place: start from one byte.
        b.push(0);
    }
    let n = b.len();
    match edit {
        Edit::Flip(at, mask) => b[at.index(n)] ^= mask,
        Edit::Remove(at) => {
            b.remove(at.index(n));
        }
        Edit::Insert(at, byte) => b.insert(at.index(n + 1), *byte),
        Edit::Cut(at) => b.truncate(at.index(n)),
        Edit::Extend(byte, count) => b.extend(std::iter::repeat_n(*byte, *count)),
        Edit::Splice(a, c, at) => {
            let (x, y) = (a.index(n + 1), c.index(n + 1));
            let piece = b[x.min(y)..x.max(y)].to_vec();
            let at = at.index(n + 1);
            b.splice(at..at, piece);
        }
        Edit::Huge32(at, v) => overwrite(b, at.index(n), &v.get(HUGE_U32).to_le_bytes()),
        Edit::Huge64(at, v) => overwrite(b, at.index(n), &v.get(HUGE_U64).to_le_bytes()),
        Edit::Token(at, t, over) => {
            let token = t.get(TOKENS);
            let at = at.index(n + 1);
            if *over {
                overwrite(b, at.min(n), token);
            } else {
                b.splice(at..at, token.iter().copied());
            }
        }
        Edit::Number(at, v) => {
            let digit = |i: &usize| b[*i].is_ascii_digit();
            let from = at.index(n);
            let Some(start) = (from..n).find(digit).or_else(|| (0..from).find(digit)) else {
                return;
            };
            let end = (start..n).find(|i| !digit(i)).unwrap_or(n);
            b.splice(start..end, v.get(NUMBERS).bytes());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Targets.

/// One decoder under test.
trait Target {
    const NAME: &'static str;
    /// The allocation bound: at most `PER_BYTE` bytes per input byte, plus `FIXED`.
    const PER_BYTE: usize;
    const FIXED: usize;
    type Value: Debug + Clone + PartialEq;
    /// Valid values; [`Target::encode`] makes the bytes the decoder reads.
    fn valid() -> BoxedStrategy<Self::Value>;
    fn encode(v: &Self::Value) -> Vec<u8>;
    /// Recomputes the checksums of an edited encoding where its structure still allows.
    fn reseal(_b: &mut Vec<u8>) {}
    /// Runs the decoder (and what its callers compute from what it accepts), asserting the
    /// invariants of what it accepts; the value, when it accepts the bytes.
    fn decode(b: &[u8]) -> Option<Self::Value>;
}

/// A target's input: arbitrary bytes, or a valid value's encoding, edited.
#[derive(Debug, Clone)]
enum Input<V> {
    Arbitrary(Vec<u8>),
    Edited {
        valid: V,
        edits: Vec<Edit>,
        reseal: bool,
    },
}

fn inputs<T: Target>() -> impl Strategy<Value = Input<T::Value>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..300).prop_map(Input::Arbitrary),
        4 => (T::valid(), prop::collection::vec(edit(), 0..6), any::<bool>())
            .prop_map(|(valid, edits, reseal)| Input::Edited { valid, edits, reseal }),
    ]
}

fn one_case<T: Target>(input: Input<T::Value>) -> Result<(), TestCaseError> {
    let (bytes, expect) = match input {
        Input::Arbitrary(b) => (b, None),
        Input::Edited {
            valid,
            edits,
            reseal,
        } => {
            let mut b = T::encode(&valid);
            for e in &edits {
                apply(&mut b, e);
            }
            if reseal {
                T::reseal(&mut b);
            }
            (b, edits.is_empty().then_some(valid))
        }
    };
    let (decoded, peak) = peak_alloc(|| T::decode(&bytes));
    let bound = T::PER_BYTE * bytes.len() + T::FIXED;
    prop_assert!(
        peak <= bound,
        "{}: {peak} bytes allocated at peak decoding {} bytes (bound {bound})",
        T::NAME,
        bytes.len()
    );
    if let Some(valid) = expect {
        prop_assert_eq!(
            decoded,
            Some(valid),
            "{}: a valid encoding did not round-trip",
            T::NAME
        );
    }
    Ok(())
}

/// `MUSHROOM_FUZZ_SEED`, or a fixed seed.
fn seed() -> u64 {
    std::env::var("MUSHROOM_FUZZ_SEED")
        .ok()
        .map(|s| s.trim().parse().expect("MUSHROOM_FUZZ_SEED is a u64"))
        .unwrap_or(0x6d75_7368_726f_6f6d)
}

/// Runs `cases` cases of `T`; panics with the shrunk input on a failure.
fn run<T: Target>(cases: u32) -> Duration {
    let seed = seed();
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(&(T::NAME.len() as u64).to_le_bytes());
    for (i, c) in T::NAME.bytes().enumerate() {
        bytes[16 + i % 16] ^= c;
    }
    let config = Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        source_file: Some(file!()),
        // A panicking case prints at every step of its shrinking: keep that bounded.
        max_shrink_iters: 2048,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let started = Instant::now();
    if let Err(e) = runner.run(&inputs::<T>(), one_case::<T>) {
        panic!("{} (seed {seed}): {e}", T::NAME);
    }
    started.elapsed()
}

/// Cases per decoder in the default test run.
const DEFAULT_CASES: u32 = 256;

// --- The store's formats (src/store/format.rs).

struct WalHeaderTarget;
impl Target for WalHeaderTarget {
    const NAME: &'static str = "wal_header";
    const PER_BYTE: usize = 0;
    const FIXED: usize = 1024;
    type Value = WalHeader;
    fn valid() -> BoxedStrategy<WalHeader> {
        (
            uuid(),
            edge_u64(),
            edge_u64().prop_map(|f| f.min(u64::MAX - 1)),
        )
            .prop_map(|(wal_id, number, floor)| WalHeader {
                wal_id,
                number,
                floor,
            })
            .boxed()
    }
    fn encode(v: &WalHeader) -> Vec<u8> {
        v.encode().to_vec()
    }
    fn reseal(b: &mut Vec<u8>) {
        reseal_header(b, 40);
    }
    fn decode(b: &[u8]) -> Option<WalHeader> {
        let h = WalHeader::decode(b).ok()?;
        assert!(
            h.floor < u64::MAX,
            "a floor with no seq after it was accepted"
        );
        Some(h)
    }
}

/// Writes the CRC of `b[..at]` at `at`, when `b` is long enough.
fn reseal_header(b: &mut [u8], at: usize) {
    if b.len() >= at + 4 {
        let crc = crc32fast::hash(&b[..at]);
        b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A whole WAL file: [`scan_wal`] over it in memory, and [`check_wal`] reading it a few bytes
/// at a time into a small buffer, which must agree.
struct WalTarget;
impl Target for WalTarget {
    const NAME: &'static str = "wal_file";
    const PER_BYTE: usize = 8;
    const FIXED: usize = 4096;
    type Value = (WalHeader, Vec<Vec<u8>>);
    fn valid() -> BoxedStrategy<Self::Value> {
        (
            uuid(),
            edge_u64(),
            prop_oneof![0u64..1000, (8u64..40).prop_map(|d| u64::MAX - d)],
            payloads(),
        )
            .prop_map(|(wal_id, number, floor, payloads)| {
                let h = WalHeader {
                    wal_id,
                    number,
                    floor,
                };
                (h, payloads)
            })
            .boxed()
    }
    fn encode((h, payloads): &Self::Value) -> Vec<u8> {
        generators::wal_file(h.wal_id, h.number, h.floor, payloads).0
    }
    fn reseal(b: &mut Vec<u8>) {
        reseal_header(b, 40);
        // Each frame whose length still fits gets its CRC back.
        let mut at = WAL_HEADER_LEN;
        while b.len() >= at + FRAME_HEADER_LEN {
            let len = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            let end = at + FRAME_HEADER_LEN + len;
            if end > b.len() {
                break;
            }
            let crc = crc32fast::hash(&b[at + 8..end]);
            b[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
            at = end;
        }
    }
    fn decode(b: &[u8]) -> Option<Self::Value> {
        let scan = scan_wal(b);
        let mut buf = Vec::new();
        let checked = check_wal(Trickle(b, 7), 64, &mut buf);
        match (&scan, checked) {
            (Err(e), Err(c)) => assert_eq!(e.to_string(), c.to_string()),
            (Ok(s), Ok(c)) => {
                assert_eq!(
                    (c.header, c.frames, c.valid_len, c.last_seq, &c.stop),
                    (
                        s.header,
                        s.frames.len() as u64,
                        s.valid_len,
                        s.last_seq,
                        &s.stop
                    )
                );
                assert_eq!((c.len, c.crc), (b.len() as u64, crc32fast::hash(b)));
            }
            (s, c) => panic!("scan_wal {s:?} but check_wal {c:?}"),
        }
        let scan = scan.ok()?;
        assert!(scan.valid_len as usize <= b.len());
        assert_eq!(scan.stop.is_none(), scan.valid_len as usize == b.len());
        assert_eq!(scan.last_seq, scan.header.floor + scan.frames.len() as u64);
        let mut at = WAL_HEADER_LEN;
        for (i, f) in scan.frames.iter().enumerate() {
            assert_eq!((f.start, f.seq), (at, scan.header.floor + 1 + i as u64));
            at = f.end;
        }
        scan.stop.is_none().then(|| {
            let payloads = scan.frames.iter().map(|f| f.payload(b).to_vec()).collect();
            (scan.header, payloads)
        })
    }
}

struct SnapshotTarget;
impl Target for SnapshotTarget {
    const NAME: &'static str = "snapshot";
    const PER_BYTE: usize = 2;
    const FIXED: usize = 1024;
    type Value = (SnapshotHeader, Vec<u8>);
    fn valid() -> BoxedStrategy<Self::Value> {
        (
            uuid(),
            edge_u64(),
            prop::option::of(uuid().prop_filter("not nil", |u| !u.is_nil())),
            prop_oneof![
                map().prop_map(|m| encode_map(&m)),
                prop::collection::vec(any::<u8>(), 0..64)
            ],
        )
            .prop_map(|(snapshot_id, commit_seq, kept_wal_id, payload)| {
                let h = SnapshotHeader {
                    snapshot_id,
                    commit_seq,
                    kept_wal_id,
                    payload_len: payload.len() as u64,
                };
                (h, payload)
            })
            .boxed()
    }
    fn encode((h, payload): &Self::Value) -> Vec<u8> {
        encode_snapshot(h.snapshot_id, h.commit_seq, h.kept_wal_id, payload)
    }
    fn reseal(b: &mut Vec<u8>) {
        reseal_header(b, 56);
        if b.len() >= SNAPSHOT_HEADER_LEN + SNAPSHOT_TRAILER_LEN {
            let end = b.len() - SNAPSHOT_TRAILER_LEN;
            let crc = crc32fast::hash(&b[SNAPSHOT_HEADER_LEN..end]);
            b[end..].copy_from_slice(&crc.to_le_bytes());
        }
    }
    fn decode(b: &[u8]) -> Option<Self::Value> {
        let header = SnapshotHeader::decode(b);
        let (h, payload) = decode_snapshot(b).ok()?;
        assert_eq!(header.as_ref(), Ok(&h));
        assert_eq!(h.file_len(), b.len() as u64);
        // The reference engine's reading of the payload, as a restore's read-back does.
        let _ = decode_map(payload);
        Some((h, payload.to_vec()))
    }
}

struct PositionTarget;
impl Target for PositionTarget {
    const NAME: &'static str = "wal_position";
    const PER_BYTE: usize = 0;
    const FIXED: usize = 1024;
    type Value = WalPosition;
    fn valid() -> BoxedStrategy<WalPosition> {
        (
            prop::option::of(uuid().prop_filter("not nil", |u| !u.is_nil())),
            uuid(),
            edge_u64(),
            edge_u64(),
            edge_u64(),
        )
            .prop_map(
                |(snapshot_id, wal_id, wal_number, durable_len, commit_seq)| WalPosition {
                    snapshot_id,
                    wal_id,
                    wal_number,
                    durable_len,
                    commit_seq,
                },
            )
            .boxed()
    }
    fn encode(v: &WalPosition) -> Vec<u8> {
        v.encode().to_vec()
    }
    fn reseal(b: &mut Vec<u8>) {
        reseal_header(b, 64);
    }
    fn decode(b: &[u8]) -> Option<WalPosition> {
        WalPosition::decode(b).ok()
    }
}

// --- The reference engine's payloads (src/store/engine/codec.rs).

struct BatchTarget;
impl Target for BatchTarget {
    const NAME: &'static str = "engine_batch";
    // A `Vec<Op>` of 48-byte ops, sized by a count the decoder bounds by the input (5 bytes
    // an op at least): under 10 bytes per input byte, plus the keys and values.
    const PER_BYTE: usize = 16;
    const FIXED: usize = 1024;
    type Value = Vec<Op>;
    fn valid() -> BoxedStrategy<Vec<Op>> {
        prop::collection::vec(op(), 0..10).boxed()
    }
    fn encode(v: &Vec<Op>) -> Vec<u8> {
        encode_batch(v)
    }
    fn decode(b: &[u8]) -> Option<Vec<Op>> {
        decode_batch(b).ok()
    }
}

struct MapTarget;
impl Target for MapTarget {
    const NAME: &'static str = "engine_map";
    // B-tree nodes of 11 entries of two `Vec`s each, for entries of 9 bytes and up.
    const PER_BYTE: usize = 32;
    const FIXED: usize = 2048;
    type Value = KvMap;
    fn valid() -> BoxedStrategy<KvMap> {
        map().boxed()
    }
    fn encode(v: &KvMap) -> Vec<u8> {
        encode_map(v)
    }
    fn decode(b: &[u8]) -> Option<KvMap> {
        let m = decode_map(b).ok()?;
        assert_eq!(
            encode_map(&m),
            b,
            "a map decoded from bytes it does not encode to"
        );
        Some(m)
    }
}

// --- Restore points (src/manifest.rs).

/// An entry of `len` plain bytes; one in three is stored compressed (codec zstd, about half
/// as many stored bytes, plain length and CRC recorded), so manifests mix codecs.
fn object(key: String, len: u64, generation: u64) -> ObjectEntry {
    let crc = (len as u32).wrapping_mul(0x9e37_79b9);
    let mut e = ObjectEntry {
        key,
        len,
        crc,
        lineage: Uuid::from_u128(7),
        generation,
        ..Default::default()
    };
    if len.is_multiple_of(3) {
        e.codec = mushroom_backup::manifest::Codec::Zstd;
        e.len = len / 2 + 1;
        e.crc = crc ^ 0x5555_5555;
        e.plain_len = Some(len);
        e.plain_crc = Some(crc);
    }
    e
}

/// A valid manifest with every kind of entry: an optional snapshot, archives (numbered from 0,
/// 1000 or just below `u64::MAX`), contiguous segments, side files and a parent.
fn full_manifest() -> impl Strategy<Value = Manifest> {
    (
        (
            prop_oneof![1u64..20, (1u64..4).prop_map(|d| 9_999_999_999 - d)],
            prop::option::of((uuid(), 0u64..5000, 0u64..5000)),
            prop_oneof![Just(0u64), Just(1000), Just(u64::MAX - 8)],
            prop::collection::vec((0u64..1 << 40, 0u64..1_000_000), 0..4),
            prop::collection::vec((1u64..1 << 20, 0u64..1_000_000), 1..5),
        ),
        (
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("store.meta".to_string()),
                        Just("backup.lineage".to_string()),
                        "[a-z][a-z0-9._-]{0,12}"
                    ],
                    0u64..4096,
                ),
                0..3,
            ),
            prop::option::of((uuid(), 0u64..1000)),
            uuid(),
        ),
    )
        .prop_map(
            |(
                (generation, snapshot, first_archive, archives, segments),
                (sides, parent, wal_id),
            )| {
                let snapshot = snapshot.map(|(id, floor, more)| {
                    (
                        SnapshotEntry {
                            object: object(snapshot_key(generation), 64 + more, generation),
                            snapshot_id: id,
                            commit_seq: floor + more,
                        },
                        floor,
                    )
                });
                let wal_floor = snapshot.as_ref().map_or(0, |(_, f)| *f);
                let archives: Vec<ArchiveEntry> = archives
                    .iter()
                    .enumerate()
                    .map(|(i, (len, frames))| ArchiveEntry {
                        object: object(
                            archive_key(generation, first_archive + i as u64),
                            *len,
                            generation,
                        ),
                        number: first_archive + i as u64,
                        frames: *frames,
                    })
                    .collect();
                let wal_number = first_archive + archives.len() as u64;
                let mut end = 0;
                let segments = segments
                    .iter()
                    .map(|(len, frames)| {
                        let start = end;
                        end += len;
                        SegmentEntry {
                            object: object(segment_key(generation, start, end), *len, generation),
                            start,
                            end,
                            frames: *frames,
                        }
                    })
                    .collect();
                let mut names = std::collections::BTreeSet::new();
                let side_files = sides
                    .into_iter()
                    .filter(|(name, _)| {
                        side_file_name_problem(name).is_none() && names.insert(name.clone())
                    })
                    .map(|(name, len)| SideFileEntry {
                        object: object(side_key(generation, &name, len as u32), len, generation),
                        name,
                    })
                    .collect();
                let mut m = Manifest {
                    format: FORMAT,
                    lineage: Uuid::from_u128(7),
                    generation,
                    commit_seq: 0,
                    created_at: "2026-12-02T14:00:00Z".into(),
                    wal_floor,
                    wal_id,
                    wal_number,
                    snapshot: snapshot.map(|(s, _)| s),
                    archives,
                    segments,
                    side_files,
                    parent: parent.map(|(lineage, seq)| ParentRef {
                        lineage,
                        manifest: manifest_key(seq),
                    }),
                    branch: None,
                    branched_from: None,
                };
                m.commit_seq = m.computed_commit_seq().expect("small frame counts");
                // The snapshot holds at most what the manifest does.
                if let Some(s) = &mut m.snapshot {
                    s.commit_seq = s.commit_seq.min(m.commit_seq).max(m.wal_floor);
                }
                m
            },
        )
}

struct ManifestTarget;
impl Target for ManifestTarget {
    const NAME: &'static str = "manifest";
    // serde_json's strings and `Vec`s, and the buffering of `#[serde(flatten)]` entries
    // (every field of an entry, known or not, held as a `Content` pair of 64 bytes first).
    const PER_BYTE: usize = 48;
    const FIXED: usize = 16 << 10;
    type Value = Manifest;
    fn valid() -> BoxedStrategy<Manifest> {
        prop_oneof![
            full_manifest(),
            prop::collection::vec(0u64..1_000_000, 1..20).prop_map(generators::manifest),
        ]
        .boxed()
    }
    fn encode(m: &Manifest) -> Vec<u8> {
        m.encode()
    }
    fn decode(b: &[u8]) -> Option<Manifest> {
        // Under a key that names no commit count, then under its own key.
        let m = Manifest::decode("manifests/fuzz.json", b).ok()?;
        assert!(Manifest::decode(&m.key(), b).is_ok());
        assert!(Manifest::decode(&manifest_key(m.commit_seq.wrapping_add(1)), b).is_err());
        // What `ls`, `verify` and a restore compute from a decoded manifest.
        assert_eq!(m.computed_commit_seq(), Some(m.commit_seq));
        assert!(m.total_len().is_some());
        let _ = m.segments_end();
        for o in m.objects() {
            let _ = parse_generation(&o.key);
        }
        for s in &m.side_files {
            let _ = side_file_name_problem(&s.name);
        }
        let _ = mushroom_backup::manifest::parse_time_ms(&m.created_at);
        Some(m)
    }
}

struct LatestTarget;
impl Target for LatestTarget {
    const NAME: &'static str = "latest";
    const PER_BYTE: usize = 8;
    const FIXED: usize = 4096;
    type Value = Latest;
    fn valid() -> BoxedStrategy<Latest> {
        (edge_u64(), uuid())
            .prop_map(|(commit_seq, lineage)| Latest {
                manifest: manifest_key(commit_seq),
                commit_seq,
                lineage,
                adopted_by: None,
                adopted_at: None,
            })
            .boxed()
    }
    fn encode(v: &Latest) -> Vec<u8> {
        v.encode()
    }
    fn decode(b: &[u8]) -> Option<Latest> {
        let l = Latest::decode(b).ok()?;
        let _ = parse_manifest_key(&l.manifest);
        Some(l)
    }
}

struct ClaimTarget;
impl Target for ClaimTarget {
    const NAME: &'static str = "generation_claim";
    const PER_BYTE: usize = 8;
    const FIXED: usize = 4096;
    type Value = GenerationClaim;
    fn valid() -> BoxedStrategy<GenerationClaim> {
        (
            uuid(),
            edge_u64(),
            prop::option::of(uuid()),
            uuid(),
            edge_u64(),
        )
            .prop_map(
                |(lineage, generation, snapshot_id, wal_id, wal_number)| GenerationClaim {
                    lineage,
                    generation,
                    snapshot_id,
                    wal_id,
                    wal_number,
                    created_at: "2026-12-02T14:00:00.123456Z".into(),
                },
            )
            .boxed()
    }
    fn encode(v: &GenerationClaim) -> Vec<u8> {
        v.encode()
    }
    fn decode(b: &[u8]) -> Option<GenerationClaim> {
        let c = GenerationClaim::decode(&generation_key(1), b).ok()?;
        let _ = mushroom_backup::manifest::parse_time_ms(&c.created_at);
        Some(c)
    }
}

// --- The lease object (src/lease/mod.rs).

struct LeaseTarget;
impl Target for LeaseTarget {
    const NAME: &'static str = "lease";
    const PER_BYTE: usize = 8;
    const FIXED: usize = 4096;
    type Value = LeaseRecord;
    fn valid() -> BoxedStrategy<LeaseRecord> {
        (
            "[0-9a-f]{32}",
            "[a-z0-9.-]{0,20}",
            "[0-9a-f-]{0,36}",
            edge_u64(),
            edge_u64(),
            proptest::option::of(("[a-z0-9%/._-]{0,40}", "[0-9a-f/-]{0,40}")),
        )
            .prop_map(
                |(holder, host, store, ttl_ms, renewals, fence)| LeaseRecord {
                    holder,
                    host,
                    store,
                    ttl_ms,
                    renewals,
                    acquired_at: "2026-12-02T14:00:00Z".into(),
                    fence: fence.map(|(key, holder)| FenceRef { key, holder }),
                    ack_window_ms: None,
                },
            )
            .boxed()
    }
    fn encode(v: &LeaseRecord) -> Vec<u8> {
        v.to_json().to_vec()
    }
    fn decode(b: &[u8]) -> Option<LeaseRecord> {
        let r = LeaseRecord::from_json(b).ok()?;
        // What an acquirer and a renewal compute from a record read from the bucket.
        assert!(r.ttl() <= MAX_TTL);
        assert_ne!(
            r.next_renewals(),
            r.renewals,
            "a successor record must differ"
        );
        Some(r)
    }
}

// --- The small files of a store directory (src/store/disk.rs, src/store/engine/recover.rs,
// src/restore/readback.rs), read from a real file.

thread_local! {
    // In memory where there is a tmpfs: a million cases write a million files.
    static STORE_DIR: tempfile::TempDir = match tempfile::tempdir_in("/dev/shm") {
        Ok(dir) => dir,
        Err(_) => tempfile::tempdir().expect("a temp dir"),
    };
}

/// Writes `b` as `name` in this thread's store directory and runs `read` on the directory.
fn from_file<R>(name: &str, b: &[u8], read: impl FnOnce(&Path) -> R) -> R {
    STORE_DIR.with(|dir| {
        std::fs::write(dir.path().join(name), b).expect("write the file");
        read(dir.path())
    })
}

struct LineageTarget;
impl Target for LineageTarget {
    const NAME: &'static str = "backup_lineage";
    const PER_BYTE: usize = 2;
    const FIXED: usize = 2048;
    type Value = Uuid;
    fn valid() -> BoxedStrategy<Uuid> {
        uuid().boxed()
    }
    fn encode(v: &Uuid) -> Vec<u8> {
        format!("{v}\n").into_bytes()
    }
    fn decode(b: &[u8]) -> Option<Uuid> {
        from_file(disk::LINEAGE_FILE, b, disk::read_lineage)
            .ok()
            .map(|l| l.expect("the file is there"))
    }
}

struct ParentTarget;
impl Target for ParentTarget {
    const NAME: &'static str = "backup_parent";
    const PER_BYTE: usize = 8;
    const FIXED: usize = 4096;
    type Value = ParentRecord;
    fn valid() -> BoxedStrategy<ParentRecord> {
        (uuid(), edge_u64())
            .prop_map(|(lineage, commit_seq)| ParentRecord {
                lineage,
                manifest: manifest_key(commit_seq),
                commit_seq,
            })
            .boxed()
    }
    fn encode(v: &ParentRecord) -> Vec<u8> {
        serde_json::to_vec_pretty(v).unwrap()
    }
    fn decode(b: &[u8]) -> Option<ParentRecord> {
        from_file(disk::PARENT_FILE, b, disk::read_parent)
            .ok()
            .map(|p| p.expect("the file is there"))
    }
}

/// `store.meta`: the engine's check of its `format`, and the restore's test for a store of
/// the reference engine.
struct StoreMetaTarget;
impl Target for StoreMetaTarget {
    const NAME: &'static str = "store_meta";
    const PER_BYTE: usize = 48;
    const FIXED: usize = 4096;
    type Value = serde_json::Value;
    fn valid() -> BoxedStrategy<serde_json::Value> {
        prop::collection::btree_map("[a-z_]{1,8}", "[ -~]{0,16}", 0..4)
            .prop_map(|extra| {
                let mut meta = serde_json::json!({ "format": STORE_FORMAT, "engine": ENGINE_NAME });
                for (k, v) in extra {
                    if k != "format" && k != "engine" {
                        meta[k] = serde_json::Value::String(v);
                    }
                }
                meta
            })
            .boxed()
    }
    fn encode(v: &serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }
    fn decode(b: &[u8]) -> Option<serde_json::Value> {
        let problem = meta_format_problem(b);
        let ours = is_reference_engine_meta(b);
        (problem.is_none() && ours).then(|| serde_json::from_slice(b).expect("it parsed"))
    }
}

// --- Names: bucket keys and page tokens (src/manifest.rs), side-file names
// (src/restore/stage.rs), archive names in a store directory (src/store/disk.rs).

/// A key of the bucket's layout, as a LIST or a `ListRestorePoints` page token brings it.
#[derive(Debug, Clone, PartialEq)]
enum Key {
    Manifest(u64),
    Segment(u64, u64, u64),
    Generation(u64),
}

struct KeyTarget;
impl Target for KeyTarget {
    const NAME: &'static str = "bucket_keys";
    const PER_BYTE: usize = 4;
    const FIXED: usize = 1024;
    type Value = Key;
    fn valid() -> BoxedStrategy<Key> {
        let generation = prop_oneof![0u64..100, Just(9_999_999_999)];
        prop_oneof![
            edge_u64().prop_map(Key::Manifest),
            (generation.clone(), edge_u64(), 1u64..1 << 40).prop_map(|(g, s, l)| {
                let s = s.min(u64::MAX - l);
                Key::Segment(g, s, s + l)
            }),
            generation.prop_map(Key::Generation),
        ]
        .boxed()
    }
    fn encode(k: &Key) -> Vec<u8> {
        match *k {
            Key::Manifest(n) => manifest_key(n),
            Key::Segment(g, s, e) => segment_key(g, s, e),
            Key::Generation(g) => generation_key(g),
        }
        .into_bytes()
    }
    fn decode(b: &[u8]) -> Option<Key> {
        let key = std::str::from_utf8(b).ok()?;
        // Every key accepted is the one spelling of what it names: two keys never name one
        // restore point, generation or segment.
        if let Some(n) = parse_manifest_key(key) {
            assert_eq!(manifest_key(n), key, "a second spelling of manifest {n}");
            return Some(Key::Manifest(n));
        }
        let g = parse_generation(key)?;
        assert!(
            key.starts_with(&mushroom_backup::manifest::generation_prefix(g)),
            "a second spelling of generation {g}: {key:?}"
        );
        if let Some((s, e)) = parse_segment_key(g, key) {
            assert!(s < e);
            assert_eq!(segment_key(g, s, e), key, "a second spelling of a segment");
            return Some(Key::Segment(g, s, e));
        }
        (key == generation_key(g)).then_some(Key::Generation(g))
    }
}

struct SideNameTarget;
impl Target for SideNameTarget {
    const NAME: &'static str = "side_file_names";
    // The refusal quotes the name, escaped: up to 10 bytes (`\u{10ffff}`) a character.
    const PER_BYTE: usize = 32;
    const FIXED: usize = 1024;
    type Value = String;
    fn valid() -> BoxedStrategy<String> {
        prop_oneof![
            Just(disk::META_FILE.to_string()),
            Just(disk::LINEAGE_FILE.to_string()),
            "[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,40}"
                .prop_filter("not reserved", |n| side_file_name_problem(n).is_none()),
        ]
        .boxed()
    }
    fn encode(v: &String) -> Vec<u8> {
        v.clone().into_bytes()
    }
    fn decode(b: &[u8]) -> Option<String> {
        let name = std::str::from_utf8(b).ok()?;
        if side_file_name_problem(name).is_some() {
            return None;
        }
        // An accepted name is one plain component of the store directory, not hidden, and
        // none of the files the restore writes itself.
        let parts: Vec<_> = Path::new(name).components().collect();
        assert_eq!(
            parts,
            [Component::Normal(name.as_ref())],
            "side file name {name:?} is not one plain component"
        );
        assert!(!name.starts_with('.') && !name.contains('\0'), "{name:?}");
        assert_eq!(
            Path::new("/store").join(name).parent(),
            Some(Path::new("/store"))
        );
        for own in [
            disk::WAL_FILE,
            disk::SNAPSHOT_FILE,
            disk::ARCHIVE_DIR,
            disk::INTENT_FILE,
            disk::LOCK_FILE,
            disk::POSITION_FILE,
        ] {
            assert_ne!(
                name, own,
                "a side file would overwrite the store's own {own}"
            );
        }
        Some(name.to_string())
    }
}

struct ArchiveNameTarget;
impl Target for ArchiveNameTarget {
    const NAME: &'static str = "archive_names";
    const PER_BYTE: usize = 4;
    const FIXED: usize = 1024;
    type Value = u64;
    fn valid() -> BoxedStrategy<u64> {
        edge_u64().boxed()
    }
    fn encode(n: &u64) -> Vec<u8> {
        archive_name(*n).into_bytes()
    }
    fn decode(b: &[u8]) -> Option<u64> {
        let name = std::str::from_utf8(b).ok()?;
        let n = parse_archive_name(name)?;
        assert_eq!(archive_name(n), name, "a second file name for archive {n}");
        Some(n)
    }
}

// --- The gRPC requests (src/service/proto.rs: prost's decoding, as the service's codec runs
// it on every request message).

struct GrpcTarget;
impl Target for GrpcTarget {
    const NAME: &'static str = "grpc_requests";
    // Strings, and the `labels` map of a RegisterRequest.
    const PER_BYTE: usize = 16;
    const FIXED: usize = 4096;
    type Value = proto::PositionReport;
    fn valid() -> BoxedStrategy<proto::PositionReport> {
        (
            uuid(),
            prop::option::of(uuid()),
            uuid(),
            edge_u64(),
            edge_u64(),
            edge_u64(),
        )
            .prop_map(|(store, snap, wal, wal_number, durable_len, commit_seq)| {
                proto::PositionReport {
                    store_id: store.to_string(),
                    snapshot_id: snap.map(|s| s.to_string()).unwrap_or_default(),
                    wal_id: wal.to_string(),
                    wal_number,
                    durable_len,
                    commit_seq,
                }
            })
            .boxed()
    }
    fn encode(v: &proto::PositionReport) -> Vec<u8> {
        v.encode_to_vec()
    }
    fn decode(b: &[u8]) -> Option<proto::PositionReport> {
        // The same bytes as every request message the service decodes.
        let _ = proto::RegisterRequest::decode(b);
        let _ = proto::DeregisterRequest::decode(b);
        let _ = proto::TriggerRequest::decode(b);
        let _ = proto::HealthRequest::decode(b);
        let _ = proto::ListStoresRequest::decode(b);
        let _ = proto::ListRestorePointsRequest::decode(b);
        let _ = proto::AdoptRequest::decode(b);
        proto::PositionReport::decode(b).ok()
    }
}

// ---------------------------------------------------------------------------------------------
// The runs.

/// Declares `TARGETS`, every decoder's name and a run of it with a given number of cases,
/// and a default-run test of each.
macro_rules! targets {
    ($($test:ident: $target:ty),* $(,)?) => {
        const TARGETS: &[(&str, fn(u32) -> Duration)] = &[$((<$target>::NAME, run::<$target>)),*];
        $(
            #[test]
            fn $test() {
                run::<$target>(DEFAULT_CASES);
            }
        )*
    };
}

targets! {
    wal_header: WalHeaderTarget,
    wal_file: WalTarget,
    snapshot: SnapshotTarget,
    wal_position: PositionTarget,
    engine_batch: BatchTarget,
    engine_map: MapTarget,
    manifest: ManifestTarget,
    latest: LatestTarget,
    generation_claim: ClaimTarget,
    lease: LeaseTarget,
    backup_lineage: LineageTarget,
    backup_parent: ParentTarget,
    store_meta: StoreMetaTarget,
    bucket_keys: KeyTarget,
    side_file_names: SideNameTarget,
    archive_names: ArchiveNameTarget,
    grpc_requests: GrpcTarget,
}

/// The long run: `MUSHROOM_FUZZ_CASES` cases (a million by default) of every decoder, or of
/// `MUSHROOM_FUZZ_ONLY`; prints cases and wall time per decoder.
#[test]
#[ignore = "the long run: MUSHROOM_FUZZ_CASES=1000000 cargo test --release --test fuzz_decoders -- --ignored"]
fn long_run() {
    let cases: u32 = std::env::var("MUSHROOM_FUZZ_CASES")
        .ok()
        .map(|s| s.trim().parse().expect("MUSHROOM_FUZZ_CASES is a number"))
        .unwrap_or(1_000_000);
    let only = std::env::var("MUSHROOM_FUZZ_ONLY").ok();
    let mut total = Duration::ZERO;
    let mut failed = Vec::new();
    for (name, run) in TARGETS {
        if only.as_deref().is_some_and(|o| o != *name) {
            continue;
        }
        // One decoder's failure (printed by its panic) does not stop the others' runs.
        match std::panic::catch_unwind(|| run(cases)) {
            Ok(took) => {
                total += took;
                eprintln!("fuzz {name}: {cases} cases in {:.1} s", took.as_secs_f64());
            }
            Err(_) => failed.push(*name),
        }
    }
    eprintln!("fuzz total: {:.1} s (seed {})", total.as_secs_f64(), seed());
    assert!(failed.is_empty(), "failed: {failed:?}");
}

// ---------------------------------------------------------------------------------------------
// Regressions: each bug the properties found, as the minimal case, by name.

/// `bucket_keys` (the long run): `str::parse` takes a leading `+`, so
/// `manifests/+0000000000000000042.json` was a second key of restore point 42 (and a page
/// token `ListRestorePoints` accepted), `gen/+000000001/…` one of generation 1.
#[test]
fn regression_a_key_with_a_plus_sign_names_nothing() {
    assert_eq!(
        parse_manifest_key("manifests/+0000000000000000042.json"),
        None
    );
    assert_eq!(parse_manifest_key(&manifest_key(42)), Some(42));
    assert_eq!(parse_generation("gen/+000000001/GENERATION"), None);
    assert_eq!(parse_generation(&generation_key(1)), Some(1));
    let plus_start = format!("gen/0000000001/wal/+{:019}-{:020}.seg", 0, 48);
    assert_eq!(parse_segment_key(1, &plus_start), None);
    let plus_end = format!("gen/0000000001/wal/{:020}-+{:019}.seg", 0, 48);
    assert_eq!(parse_segment_key(1, &plus_end), None);
    assert_eq!(parse_segment_key(1, &segment_key(1, 0, 48)), Some((0, 48)));
}

/// `archive_names`: likewise, `archive/+0000000000000000007.wal` in a store directory was a
/// second archive 7 to the backup's look at the store (the engine itself ignored it).
#[test]
fn regression_an_archive_name_with_a_plus_sign_is_not_an_archive() {
    assert_eq!(parse_archive_name("+0000000000000000007.wal"), None);
    assert_eq!(parse_archive_name(&archive_name(7)), Some(7));
    let dir = tempfile::tempdir().unwrap();
    let header = WalHeader {
        wal_id: Uuid::from_u128(1),
        number: 8,
        floor: 0,
    };
    std::fs::write(dir.path().join(disk::WAL_FILE), header.encode()).unwrap();
    let archives = dir.path().join(disk::ARCHIVE_DIR);
    std::fs::create_dir(&archives).unwrap();
    let seven = WalHeader {
        number: 7,
        ..header
    }
    .encode();
    std::fs::write(archives.join(archive_name(7)), seven).unwrap();
    std::fs::write(archives.join("+0000000000000000007.wal"), seven).unwrap();
    let look = disk::DiskState::look(dir.path()).unwrap();
    let found: Vec<_> = look.archives.iter().map(|a| a.path.clone()).collect();
    assert_eq!(found, [archives.join(archive_name(7))]);
}

/// `wal_file`: `check_wal` sized its buffer to the length a frame header claimed (up to
/// 64 MiB) before reading a byte of the frame, so a 64-byte file claiming a 64 MiB frame cost
/// 64 MiB (per file checked at once, in a restore's read-back and a worker's reading).
#[test]
fn regression_check_wal_does_not_allocate_what_a_frame_claims() {
    use mushroom_backup::store::format::{CHECK_CHUNK, MAX_FRAME_PAYLOAD};
    let mut file = WalHeader {
        wal_id: Uuid::from_u128(1),
        number: 1,
        floor: 0,
    }
    .encode()
    .to_vec();
    file.extend_from_slice(&MAX_FRAME_PAYLOAD.to_le_bytes());
    file.extend_from_slice(&[0; 12]);
    for chunk in [64, CHECK_CHUNK] {
        let (checked, peak) = peak_alloc(|| check_wal(&file[..], chunk, &mut Vec::new()));
        let c = checked.unwrap();
        assert_eq!(c.frames, 0);
        assert_eq!(
            c.stop,
            Some(mushroom_backup::store::format::TailStop::Short)
        );
        assert!(
            peak <= 2 * (chunk + file.len()) + 4096,
            "{peak} bytes for a {}-byte file",
            file.len()
        );
    }
}

/// `manifest`: an archive numbered `u64::MAX` overflowed `number + 1` in the manifest's own
/// check (a panic in a debug build; in a release build the wrap made `wal_number` 0 pass).
#[test]
fn regression_an_archive_numbered_u64_max_is_refused() {
    let mut m = generators::manifest(vec![3]);
    m.archives.push(ArchiveEntry {
        object: object(archive_key(1, u64::MAX), 100, 1),
        number: u64::MAX,
        frames: 0,
    });
    m.wal_number = 0;
    let e = Manifest::decode(&m.key(), &m.encode()).unwrap_err();
    assert!(
        e.to_string().contains("does not precede wal.bin number 0"),
        "{e}"
    );
    let mut two = m.clone();
    two.archives.push(two.archives[0].clone());
    let e = Manifest::decode(&two.key(), &two.encode()).unwrap_err();
    assert!(e.to_string().contains("not consecutive"), "{e}");
}

/// `manifest`: object lengths adding up past `u64::MAX` decoded, then overflowed the sum
/// `ls` and `ListRestorePoints` show (a panic in a debug build, a wrong size in release).
#[tokio::test]
async fn regression_object_lengths_past_u64_max_are_refused() {
    use mushroom_backup::bucket::{Bucket, PutCondition};
    let mut m = generators::manifest(vec![3]);
    m.side_files.push(SideFileEntry {
        object: object(side_key(1, "store.meta", 0), u64::MAX, 1),
        name: "store.meta".into(),
    });
    let e = Manifest::decode(&m.key(), &m.encode()).unwrap_err();
    assert!(e.to_string().contains("more than 2^64 bytes"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let bucket = mushroom_backup::bucket::fs::FsBucket::open(dir.path()).unwrap();
    bucket
        .put(&m.key(), m.encode().into(), PutCondition::None)
        .await
        .unwrap();
    let points = mushroom_backup::verify::list_restore_points(&bucket)
        .await
        .unwrap();
    assert_eq!(points.len(), 1);
    let why = points[0].error.as_deref().expect("refused");
    assert!(why.contains("more than 2^64 bytes"), "{why}");
}

/// `lease`: a lease object whose `renewals` is `u64::MAX` overflowed `renewals + 1` when it
/// was taken over (a panic in a debug build), and one at `u64::MAX - 1` at the first renewal
/// after. The count wraps: only that the content changes matters.
#[tokio::test(start_paused = true)]
async fn regression_a_lease_with_renewals_at_u64_max_is_taken_over_and_renewed() {
    use mushroom_backup::bucket::mem::MemBucket;
    use mushroom_backup::bucket::{DynBucket, PutCondition};
    use mushroom_backup::lease::{Acquisition, LeaseAcquirer, LeaseConfig};
    use mushroom_backup::manifest::LEASE_KEY;
    for (renewals, taken_over_as, renewed_as) in [(u64::MAX, 0, 1), (u64::MAX - 1, u64::MAX, 0)] {
        let bucket: DynBucket = std::sync::Arc::new(MemBucket::new());
        let config = LeaseConfig {
            ttl: Duration::from_secs(30),
            coalesce: false,
            ..LeaseConfig::new("store-1")
        };
        // A record naming this very holder: taken over at once (a restart that kept its id).
        let record = LeaseRecord {
            holder: config.holder.clone(),
            host: "h".into(),
            store: "store-1".into(),
            ttl_ms: 30_000,
            renewals,
            acquired_at: "2026-12-02T14:00:00Z".into(),
            fence: None,
            ack_window_ms: None,
        };
        bucket
            .put(LEASE_KEY, record.to_json().into(), PutCondition::None)
            .await
            .unwrap();
        let in_bucket = async || {
            LeaseRecord::from_json(&bucket.get(LEASE_KEY).await.unwrap().data)
                .unwrap()
                .renewals
        };
        let lease = match LeaseAcquirer::new(bucket.clone(), config.clone())
            .try_acquire()
            .await
            .unwrap()
        {
            Acquisition::Acquired(lease) => lease,
            other => panic!("not acquired: {other:?}"),
        };
        assert_eq!(in_bucket().await, taken_over_as);
        tokio::time::sleep(config.renew_every() + Duration::from_millis(1)).await;
        assert!(lease.may_write());
        assert_eq!(in_bucket().await, renewed_as);
        lease.release().await.unwrap();
    }
}
