//! The deterministic workload behind `store write`: [`write_commits`].
//!
//! Commit `seq`'s operations are a pure function of `(seed, seq, value_size)`
//! ([`workload_ops`]), independent of what came before, so a store written with 3000 commits
//! and one written 1000 then 2000 hold the same map, and [`expected_map`] computes the state
//! at any commit without writing a store. The generator is a local splitmix64, so the
//! workload never changes with a dependency's version.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::codec::{KvMap, Op, apply_ops, batch_len};
use super::{Engine, EngineError, EngineOptions, StoreDigest};
use crate::store::format::{MAX_FRAME_PAYLOAD, WalPosition};

/// Keys are drawn from this many distinct keys, so the map stays bounded while puts
/// overwrite and deletes remove.
pub const KEY_SPACE: u64 = 4096;
/// Unpaced runs sync when `seq` is a multiple of this (and at the end).
pub const WORKLOAD_GROUP: u64 = 64;
/// One commit in this many also deletes a key.
const DELETE_ONE_IN: u64 = 8;

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and fixed forever.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn key(n: u64) -> Vec<u8> {
    format!("key{n:05}").into_bytes()
}

/// What the workload's values hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueKind {
    /// Random bytes: incompressible (the workload as it always was).
    #[default]
    Random,
    /// Rows of text from a fixed vocabulary, compressing like a real table's rows (at least
    /// 3:1 with zstd at level 3).
    Text,
}

impl std::str::FromStr for ValueKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "random" => Ok(ValueKind::Random),
            "text" => Ok(ValueKind::Text),
            other => Err(format!("value kind {other:?}: use random or text")),
        }
    }
}

/// The text workload's vocabulary: fields of a customer table.
const CITIES: &[&str] = &[
    "amsterdam",
    "berlin",
    "chicago",
    "dublin",
    "edinburgh",
    "frankfurt",
    "geneva",
    "helsinki",
    "istanbul",
    "jakarta",
    "kyoto",
    "lisbon",
    "madrid",
    "nairobi",
    "oslo",
    "paris",
];
const STATUSES: &[&str] = &["active", "pending", "suspended", "closed"];
const WORDS: &[&str] = &[
    "order",
    "shipped",
    "invoice",
    "paid",
    "customer",
    "account",
    "balance",
    "credit",
    "delivery",
    "address",
    "street",
    "number",
    "phone",
    "email",
    "contact",
    "support",
    "request",
    "refund",
    "product",
    "quantity",
    "price",
    "discount",
    "total",
    "tax",
    "warehouse",
    "stock",
    "item",
    "category",
    "garden",
    "kitchen",
    "office",
    "sports",
    "blue",
    "green",
    "red",
    "large",
    "small",
    "medium",
    "premium",
    "basic",
    "monday",
    "tuesday",
    "friday",
    "morning",
    "evening",
    "express",
    "standard",
    "return",
    "the",
    "and",
    "for",
    "with",
    "from",
    "after",
    "before",
    "during",
    "new",
    "old",
    "first",
    "last",
    "next",
    "open",
    "ready",
    "done",
];

/// `value_size` bytes of the kind's value.
fn value_of(kind: ValueKind, rng: &mut SplitMix64, value_size: usize) -> Vec<u8> {
    let mut value = Vec::with_capacity(value_size + 64);
    match kind {
        ValueKind::Random => {
            while value.len() < value_size {
                value.extend_from_slice(&rng.next_u64().to_le_bytes());
            }
        }
        ValueKind::Text => {
            let pick = |rng: &mut SplitMix64, words: &[&'static str]| {
                words[crate::units::usize_of(rng.next_u64() % words.len() as u64)]
            };
            while value.len() < value_size {
                let id = rng.next_u64() % 100_000;
                let row = format!(
                    "{id:05},{},{},{} {} {} {};",
                    pick(rng, CITIES),
                    pick(rng, STATUSES),
                    pick(rng, WORDS),
                    pick(rng, WORDS),
                    pick(rng, WORDS),
                    pick(rng, WORDS),
                );
                value.extend_from_slice(row.as_bytes());
            }
        }
    }
    value.truncate(value_size);
    value
}

/// The operations of commit `seq` of the workload with `seed`: a put of a random key with a
/// `value_size`-byte random value, and one commit in eight also deletes a random key.
pub fn workload_ops(seed: u64, seq: u64, value_size: usize) -> Vec<Op> {
    workload_ops_of(ValueKind::Random, seed, seq, value_size)
}

/// [`workload_ops`] with values of `kind`.
pub fn workload_ops_of(kind: ValueKind, seed: u64, seq: u64, value_size: usize) -> Vec<Op> {
    let mut rng = SplitMix64::new(SplitMix64::new(seed).next_u64() ^ seq);
    let k = key(rng.next_u64() % KEY_SPACE);
    let value = value_of(kind, &mut rng, value_size);
    let mut ops = vec![Op::Put { key: k, value }];
    if rng.next_u64().is_multiple_of(DELETE_ONE_IN) {
        ops.push(Op::Delete {
            key: key(rng.next_u64() % KEY_SPACE),
        });
    }
    ops
}

/// The map after commits `1..=commits` of the workload.
pub fn expected_map(seed: u64, value_size: usize, commits: u64) -> KvMap {
    expected_map_of(ValueKind::Random, seed, value_size, commits)
}

/// [`expected_map`] with values of `kind`.
pub fn expected_map_of(kind: ValueKind, seed: u64, value_size: usize, commits: u64) -> KvMap {
    let mut map = KvMap::new();
    for seq in 1..=commits {
        apply_ops(&mut map, &workload_ops_of(kind, seed, seq, value_size));
    }
    map
}

/// What `store write` does.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Commits to append after what the store already holds.
    pub commits: u64,
    pub value_size: usize,
    /// Commits per second, each synced on its own; `None` = as fast as possible, synced in
    /// groups of [`WORKLOAD_GROUP`].
    pub rate_per_sec: Option<f64>,
    pub snapshot_every: u64,
    pub rotate_bytes: u64,
    pub keep_wal_on_snapshot: bool,
    pub seed: u64,
    /// What the values hold.
    pub value_kind: ValueKind,
    /// Set to stop early: the current group is synced and the report says `stopped`.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            commits: 1000,
            value_size: 64,
            rate_per_sec: None,
            snapshot_every: 0,
            rotate_bytes: 0,
            keep_wal_on_snapshot: false,
            seed: 0,
            value_kind: ValueKind::Random,
            stop: None,
        }
    }
}

/// What a [`write_commits`] run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteReport {
    /// Seq of the first commit of this run (`last_seq + 1` when it wrote none).
    pub first_seq: u64,
    /// Seq of the last commit, durable when the run returns.
    pub last_seq: u64,
    pub written: u64,
    /// The stop flag ended the run before `commits`.
    pub stopped: bool,
    /// The store's digest at `last_seq`.
    pub digest: StoreDigest,
    pub position: WalPosition,
}

/// Opens (or creates) the store in `dir` and appends `opts.commits` workload commits,
/// holding `store.lock` throughout and publishing `wal.position` after every group fsync.
pub fn write_commits(
    dir: impl AsRef<Path>,
    opts: &WriteOptions,
) -> Result<WriteReport, EngineError> {
    if let Some(rate) = opts.rate_per_sec
        && !(rate.is_finite() && rate > 0.0)
    {
        return Err(EngineError::InvalidOptions(format!(
            "rate {rate} commits/s must be a positive number"
        )));
    }
    let biggest = batch_len(&[
        Op::put(key(0), vec![0; opts.value_size]),
        Op::delete(key(0)),
    ]);
    if biggest > MAX_FRAME_PAYLOAD as usize {
        return Err(EngineError::InvalidOptions(format!(
            "value size {} makes commits over the frame limit of {MAX_FRAME_PAYLOAD} bytes",
            opts.value_size
        )));
    }
    let mut engine = Engine::open(
        dir,
        EngineOptions {
            rotate_bytes: opts.rotate_bytes,
            snapshot_every: opts.snapshot_every,
            keep_wal_on_snapshot: opts.keep_wal_on_snapshot,
            group_commit: 0,
        },
    )?;
    let first_seq = engine.commit_seq() + 1;
    let target = engine
        .commit_seq()
        .checked_add(opts.commits)
        .ok_or_else(|| EngineError::InvalidOptions("commit count overflows u64".into()))?;
    let stopping = || {
        opts.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    };
    let start = Instant::now();
    let mut written = 0u64;
    let mut stopped = false;
    while engine.commit_seq() < target {
        if let Some(rate) = opts.rate_per_sec {
            let due = start + Duration::from_secs_f64(written as f64 / rate);
            stopped = !sleep_until(due, &stopping);
        }
        if stopped || stopping() {
            stopped = true;
            break;
        }
        let seq = engine.commit_seq() + 1;
        engine.commit(&workload_ops_of(
            opts.value_kind,
            opts.seed,
            seq,
            opts.value_size,
        ))?;
        written += 1;
        if opts.rate_per_sec.is_some() || seq.is_multiple_of(WORKLOAD_GROUP) || seq == target {
            engine.sync()?;
        }
    }
    let position = engine.sync()?;
    Ok(WriteReport {
        first_seq,
        last_seq: engine.commit_seq(),
        written,
        stopped,
        digest: engine.digest(),
        position,
    })
}

/// Sleeps until `due` in short steps; `false` if `stopping` turned true first.
fn sleep_until(due: Instant, stopping: &impl Fn() -> bool) -> bool {
    loop {
        if stopping() {
            return false;
        }
        let now = Instant::now();
        if now >= due {
            return true;
        }
        std::thread::sleep((due - now).min(Duration::from_millis(20)));
    }
}
