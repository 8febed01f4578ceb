//! One cell, run end to end with real processes: a `serve` (the cell's keys, store options for
//! compression, durability, layout and replica) and a node committing into the store; the
//! cell's ending; then restores straight from the bucket, checked against what was promised.
//!
//! **What was promised** (the commits a restore must reach):
//! - every commit in the node's acked log (sync: the node acknowledged it only after the
//!   service's `Durable`);
//! - every commit up to the highest `bucket_durable_commit_seq` the primary's health reported
//!   ("how far a restore of its prefix reaches now"), read every 100 ms while the node ran
//!   (before a promotion, for a promoted cell). In async mode this is the whole promise: the
//!   README lets a lost host lose "up to about a second" of what the engine acknowledged, never
//!   what the service said a restore reaches.
//! - of a replica, every commit up to the highest `shipped_commit_seq` its health reported
//!   (the README: each prefix holds the commits "as far as its worker shipped").
//!
//! **The checks**, each a failure of the cell when it does not hold:
//! - *an acknowledged commit is in the bucket*: after a kill, the restore of the prefix
//!   reaches every promised commit; its store equals the workload's up to the commit it
//!   reaches (digest);
//! - *a promotion loses no acknowledged commit and forks no history*: every promised commit
//!   (for a live old primary: every line the node ever logged, after the promotion too) is at
//!   or below the commit promoted at; the promoted store equals the workload's at that
//!   commit; three commits of another seed written into it and shipped, the promoted `serve`
//!   stopped (SIGTERM), the restore of the prefix equals the promoted store exactly, whatever
//!   the old primary still wrote;
//! - *every manifest verifies*: `verify` of the prefix (and the replica's) passes, LATEST
//!   naming one of them;
//! - *a refused backup leaves the bucket untouched*: with every process stopped, a
//!   `backup --once` of another store (another lineage) into the prefix fails, and the
//!   bucket's listing (every key, with its bytes, or size, ETag and Last-Modified) is the same
//!   before and after.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto;
use mushroom_backup::store::engine::{ValueKind, digest_map, expected_map_of};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cells::{Cell, Compression, Data, Durability, Ending, Layout, Replica};
use crate::node;
use crate::setup::{Bucket, Keys};
use crate::support::binary::{self, Running};
use crate::support::s3_servers::S3Server;
use crate::support::served::{self, DEADLINE, Dirs};

/// The lease TTL of both serves (an async promotion waits for it to run out).
const TTL_MS: &str = "3000";
/// Commits written into a promoted store, with another seed than the node's.
const AFTER_PROMOTION: u64 = 3;
const OTHER_SEED: &str = "99";

/// What a cell found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Commits promised (see the module docs).
    pub acked: usize,
    /// Promised commits no restore reaches (primary and replica).
    pub lost: usize,
    /// Every check that did not hold, and what the cell saw.
    pub failures: Vec<String>,
    pub notes: Vec<String>,
}

/// The promises read from the primary's health while the node ran.
#[derive(Debug, Default)]
struct Promised {
    bucket_durable: u64,
    replica_shipped: u64,
}

impl Promised {
    async fn read(&mut self, c: &served::Client, id: &str) {
        if let Ok(h) = served::health(c, id, false).await {
            self.bucket_durable = self.bucket_durable.max(h.bucket_durable_commit_seq);
            if let Some(r) = &h.replica {
                self.replica_shipped = self.replica_shipped.max(r.shipped_commit_seq);
            }
        }
    }
}

/// Reads the primary's health every 100 ms until `until`.
async fn watch(p: &mut Promised, c: &served::Client, id: &str, until: Instant) {
    while Instant::now() < until {
        p.read(c, id).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn serve(d: &Dirs, bucket: &Bucket, keys: &[String], instance: &str) -> std::process::Command {
    let mut cmd = served::command(d);
    cmd.env("AWS_ENDPOINT_URL", bucket.endpoint())
        .env("MUSHROOMDB_BACKUP_S3_PATH_STYLE", "true")
        .args(["--instance-id", instance, "--lease-ttl-ms", TTL_MS])
        .args(["--restore-point-interval-ms", "1500"])
        .args(["--wal-interval-ms", "100"])
        .args(keys);
    cmd
}

fn options(cell: &Cell, replica: Option<&Bucket>) -> proto::StoreOptions {
    proto::StoreOptions {
        durability: match cell.durability {
            Durability::Sync => proto::Durability::Sync,
            Durability::Async => proto::Durability::Async,
        } as i32,
        wal_puts_per_second: 20,
        compression: match cell.compression {
            Compression::Zstd => proto::Compression::Zstd,
            Compression::None => proto::Compression::None,
        } as i32,
        object_lock: match cell.layout {
            Layout::Mutable => proto::ObjectLockMode::Unspecified,
            Layout::WriteOnce => proto::ObjectLockMode::Governance,
        } as i32,
        replica: replica.map(Bucket::url).unwrap_or_default(),
        ..Default::default()
    }
}

fn value_kind(cell: &Cell) -> ValueKind {
    match cell.data {
        Data::Text => ValueKind::Text,
        Data::Random => ValueKind::Random,
    }
}

/// The digest of the node's workload after `commits` commits.
fn workload_digest(cell: &Cell, commits: u64) -> String {
    digest_map(&expected_map_of(
        value_kind(cell),
        node::SEED,
        node::VALUE_SIZE,
        commits,
    ))
}

/// Runs `cell`; `seed` draws its timings. Panics when a process fails outright (the caller
/// counts the cell failed); a check that does not hold is an [`Outcome`] failure.
pub async fn run(cell: Cell, server: Option<S3Server>, seed: u64) -> Outcome {
    let mut out = Outcome::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ fnv(&cell.name()));
    let a = served::dirs();
    let keys = tokio::task::block_in_place(|| Keys::new(cell.encryption, &a.base));
    let tag = unique_tag();
    let primary = Bucket::of(&cell, server.as_ref(), &a.base, "primary", &tag).await;
    let replica = match cell.replica {
        Replica::None => None,
        Replica::One => Some(Bucket::of(&cell, server.as_ref(), &a.base, "replica", &tag).await),
    };
    let dir = a.root.join("store");
    std::fs::create_dir_all(&dir).unwrap();
    let log = a.base.join("acked.log");
    let sync = cell.durability == Durability::Sync;

    let (mut srv, addr) = tokio::task::block_in_place(|| {
        served::start(
            "primary serve",
            serve(&a, &primary, &keys.writer, &format!("a-{tag}")),
        )
    });
    let c = served::client(addr).await;
    let mut req = crate::support::register_req(&dir, &primary.url());
    req.options = Some(options(&cell, replica.as_ref()));
    let reg = c
        .clone()
        .register(req)
        .await
        .unwrap_or_else(|e| srv.fail(&format!("Register: {e}")))
        .into_inner();
    let id = reg.store_id.clone();
    let spec = node::spec(
        addr,
        &dir,
        (&id, &reg.node_token),
        cell.data == Data::Random,
        sync.then_some(log.as_path()),
    );
    let mut n = Running::spawn("node", node::command(&spec));

    // Until a restore point (a standby starts from one) and a first shipped commit.
    let mut promised = Promised::default();
    served::wait_health(&c, &id, "a restore point and a shipped commit", |h| {
        h.restore_point_commit_seq > 0 && h.shipped_commit_seq > 0
    })
    .await;

    let mut standby = match cell.ending {
        Ending::Kill => None,
        Ending::PromoteDead | Ending::PromoteLive => {
            Some(start_standby(&cell, &primary, &keys, &tag).await)
        }
    };

    let hold = Duration::from_millis(rng.random_range(1000..=3000));
    watch(&mut promised, &c, &id, Instant::now() + hold).await;

    let mut promoted_at = None;
    if cell.ending == Ending::PromoteLive {
        promoted_at = promote(standby.as_mut().unwrap(), sync, &mut out)
            .await
            .map_err(|e| out.failures.push(format!("Promote refused: {e}")))
            .ok();
        // The old primary and its node go on: whatever they acknowledge now is a lie.
        let more = Duration::from_millis(rng.random_range(1000..=2000));
        tokio::time::sleep(more).await;
    }
    srv.kill();
    n.kill();
    if cell.ending == Ending::PromoteDead {
        promoted_at = promote(standby.as_mut().unwrap(), sync, &mut out)
            .await
            .map_err(|e| out.failures.push(format!("Promote refused: {e}")))
            .ok();
    }
    // A refused promotion: the cell is checked as a kill (the standby's serve is stopped).
    if promoted_at.is_none() {
        standby = None;
    }
    let acked_log = served::acked_log(&log);
    if !acked_log.windows(2).all(|w| w[0] < w[1]) {
        out.failures
            .push(format!("the acked log does not rise: {acked_log:?}"));
    }
    let promise: BTreeSet<u64> = acked_log
        .iter()
        .copied()
        .chain(1..=promised.bucket_durable)
        .collect();
    out.acked = promise.len();
    out.notes.push(format!(
        "acked log {} (highest {:?}), health said durable {}",
        acked_log.len(),
        acked_log.last(),
        promised.bucket_durable
    ));

    // A promoted store: its history, then commits of its own, shipped; then it stops.
    let mut expected = None;
    let promoted_unix_ms = standby.as_ref().map_or(0, |sb| sb.promoted_unix_ms);
    if let (Some(mut sb), Some(at)) = (standby, promoted_at) {
        let held = store_digest(&sb.dir);
        if held.0 != at || held.1 != workload_digest(&cell, at) {
            out.failures.push(format!(
                "the promoted store at {at} is not the node's history: holds {held:?}"
            ));
        }
        let mut w = binary::command(crate::support::dest::NO_S3);
        w.args(["store", "write"])
            .arg(&sb.dir)
            .args(["--commits", &AFTER_PROMOTION.to_string()])
            .args(["--seed", OTHER_SEED]);
        tokio::task::block_in_place(|| binary::run_ok("store write", w, DEADLINE));
        served::wait_health(
            &sb.client,
            &sb.id,
            "the promoted store's commits shipped",
            |h| h.role == "primary" && h.shipped_commit_seq >= at + AFTER_PROMOTION,
        )
        .await;
        tokio::task::block_in_place(|| served::terminate(&mut sb.serve));
        expected = Some(store_digest(&sb.dir));
        out.notes.push(format!("promoted at {at}"));
    }

    // Every process is stopped: a backup of another lineage into the prefix is refused and
    // changes nothing.
    refused_backup_changes_nothing(&cell, &primary, &keys, &a.base, &mut out).await;

    // The primary prefix.
    let bound = match promoted_at {
        None => {
            let (reached, digest) = restore(&primary, &keys, &a.base.join("restored"));
            if digest != workload_digest(&cell, reached) {
                out.failures.push(format!(
                    "the restore at commit {reached} is not the node's history"
                ));
            }
            out.notes.push(format!("restored {reached}"));
            reached
        }
        Some(at) => {
            let (reached, digest) = restore(&primary, &keys, &a.base.join("restored"));
            let want = expected.clone().unwrap();
            if (reached, &digest) != (want.0, &want.1) {
                out.failures.push(format!(
                    "the restore of the promoted prefix ({reached}) is not the promoted store \
                     ({}): a forked history",
                    want.0
                ));
            }
            out.notes.push(format!("restored {reached}"));
            at
        }
    };
    let lost: Vec<u64> = promise.iter().copied().filter(|s| *s > bound).collect();
    if !lost.is_empty() {
        out.failures.push(format!(
            "{} promised commits above {bound} (the {}): {:?}…",
            lost.len(),
            if promoted_at.is_some() {
                "commit promoted at"
            } else {
                "restore"
            },
            &lost[..lost.len().min(5)]
        ));
        let at = ack_times(&log);
        if promoted_at.is_some() && at.contains_key(&lost[0]) {
            // When they were acknowledged, against when the promotion answered.
            let since = |s: &u64| at.get(s).map(|t| t - promoted_unix_ms);
            out.failures.push(format!(
                "commit {} was acknowledged {:?} ms after Promote answered, commit {} {:?} ms",
                lost[0],
                since(&lost[0]),
                lost[lost.len() - 1],
                since(&lost[lost.len() - 1])
            ));
        }
    }
    out.lost += lost.len();
    verify(&primary, &keys, "primary", &mut out);

    // The replica: the old primary's lineage, as far as its worker shipped.
    if let Some(r) = &replica {
        let (reached, digest) = restore(r, &keys, &a.base.join("restored-replica"));
        if digest != workload_digest(&cell, reached) {
            out.failures.push(format!(
                "the replica's restore at {reached} is not the node's history"
            ));
        }
        let short = promised.replica_shipped.saturating_sub(reached);
        if short > 0 {
            out.failures.push(format!(
                "the replica's restore reaches {reached}, its health said shipped {}",
                promised.replica_shipped
            ));
        }
        out.lost += short as usize;
        out.notes.push(format!(
            "replica restored {reached}, shipped {}",
            promised.replica_shipped
        ));
        verify(r, &keys, "replica", &mut out);
    }
    out
}

/// A standby of the prefix in a second `serve`.
struct Standby {
    serve: Running,
    client: served::Client,
    id: String,
    dir: std::path::PathBuf,
    /// When `Promote` answered (0 before): what an acknowledgement's time is compared with.
    promoted_unix_ms: i64,
    _dirs: Dirs,
}

async fn start_standby(cell: &Cell, primary: &Bucket, keys: &Keys, tag: &str) -> Standby {
    let b = served::dirs();
    let dir = b.root.join("standby");
    std::fs::create_dir_all(&dir).unwrap();
    let (serve, addr) = tokio::task::block_in_place(|| {
        served::start(
            "standby serve",
            serve(&b, primary, &keys.standby, &format!("b-{tag}")),
        )
    });
    let client = served::client(addr).await;
    let mut req = crate::support::register_req(&dir, &primary.url());
    // A standby has no replica: Register refuses one.
    let mut o = options(cell, None);
    o.standby = true;
    req.options = Some(o);
    let id = served::register(&client, req).await;
    served::wait_health(&client, &id, "the standby applying", |h| {
        h.role == "standby" && h.standby_commit_seq > 0
    })
    .await;
    Standby {
        serve,
        client,
        id,
        dir,
        promoted_unix_ms: 0,
        _dirs: b,
    }
}

/// How often a promotion refused as "not caught up; promote again" is tried.
const PROMOTE_ATTEMPTS: u32 = 5;

/// `Promote` of the standby (waiting for the lease of an async primary): the commit promoted
/// at, or why it was refused. A refusal that asks to "promote again" (the standby was behind
/// when it looked) is tried again a second later, up to [`PROMOTE_ATTEMPTS`] times.
async fn promote(sb: &mut Standby, sync: bool, out: &mut Outcome) -> Result<u64, String> {
    let mut attempt = 1;
    loop {
        let r = sb
            .client
            .clone()
            .promote(proto::PromoteRequest {
                store_id: sb.id.clone(),
                wait_for_lease: !sync,
            })
            .await;
        match r {
            Ok(r) => {
                sb.promoted_unix_ms = unix_ms();
                if attempt > 1 {
                    out.notes.push(format!("promoted at attempt {attempt}"));
                }
                return Ok(r.into_inner().commit_seq);
            }
            Err(e) if e.message().contains("promote again") && attempt < PROMOTE_ATTEMPTS => {
                out.notes.push(format!(
                    "Promote attempt {attempt} refused: {}",
                    e.message().chars().take(160).collect::<String>()
                ));
                attempt += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(format!(
                    "{:?} at attempt {attempt}: {}",
                    e.code(),
                    e.message()
                ));
            }
        }
    }
}

/// `store digest DIR`: commit and digest.
fn store_digest(dir: &Path) -> (u64, String) {
    let v = tokio::task::block_in_place(|| binary::store_digest(dir));
    (
        v["commit_seq"].as_u64().expect("a commit_seq"),
        v["digest"].as_str().expect("a digest").to_string(),
    )
}

/// Restores the prefix of `bucket` into `into` with the reader's keys: commit and digest.
fn restore(bucket: &Bucket, keys: &Keys, into: &Path) -> (u64, String) {
    let mut cmd = binary::command(bucket.endpoint());
    cmd.args(["restore", "--from", &bucket.url(), "--json", "--to"])
        .arg(into)
        .args(&keys.reader);
    tokio::task::block_in_place(|| binary::run_ok("restore", cmd, DEADLINE));
    store_digest(into)
}

/// `verify` of the prefix of `bucket`: a failure unless every manifest verifies and LATEST
/// names one of them.
fn verify(bucket: &Bucket, keys: &Keys, what: &str, out: &mut Outcome) {
    let mut cmd = binary::command(bucket.endpoint());
    cmd.args(["verify", "--from", &bucket.url(), "--json"])
        .args(&keys.reader);
    let mut child = Running::spawn(&format!("verify ({what})"), cmd);
    let status = tokio::task::block_in_place(|| child.wait_exit(DEADLINE));
    let report = child.stdout();
    let ok = serde_json::from_str::<serde_json::Value>(report.trim())
        .map(|v| {
            let manifests_ok = v["manifests"]
                .as_array()
                .is_some_and(|m| !m.is_empty() && m.iter().all(|m| m["ok"] == true));
            let latest_ok = v["latest"].is_null() || v["latest"]["ok"] == true;
            v["ok"] == true && manifests_ok && latest_ok
        })
        .unwrap_or(false);
    if !status.success() || !ok {
        out.failures.push(format!(
            "verify of the {what} prefix ({status}): {}",
            report.trim()
        ));
    }
}

/// A store of its own lineage, backed up once into the prefix: refused, the bucket unchanged.
async fn refused_backup_changes_nothing(
    cell: &Cell,
    bucket: &Bucket,
    keys: &Keys,
    base: &Path,
    out: &mut Outcome,
) {
    let other = base.join("other-store");
    tokio::task::block_in_place(|| binary::write_store(&other, 3));
    let before = bucket.listing().await;
    let mut extra: Vec<&str> = keys.writer.iter().map(String::as_str).collect();
    if cell.layout == Layout::WriteOnce {
        extra.extend(["--object-lock", "governance"]);
    }
    let cmd = binary::backup_once(bucket.endpoint(), &other, &bucket.url(), &extra);
    let mut child = Running::spawn("backup of another store", cmd);
    let status = tokio::task::block_in_place(|| child.wait_exit(DEADLINE));
    let after = bucket.listing().await;
    if status.success() {
        out.failures
            .push("a backup of another store into the prefix was accepted".to_string());
    }
    if before != after {
        let changed: Vec<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        out.failures.push(format!(
            "a refused backup changed the bucket: {changed:?}; it said: {}",
            child.stderr().lines().last().unwrap_or_default()
        ));
    } else {
        let said = child.stderr();
        let last = said.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        let why = last.split_once("refused").map_or(last, |(_, why)| why);
        out.notes.push(format!(
            "backup of another store refused{}",
            why.chars().take(90).collect::<String>()
        ));
    }
}

/// The acknowledgement time (`ack_unix_ms`) of each commit in the acked log.
fn ack_times(log: &Path) -> std::collections::BTreeMap<u64, i64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.first()?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

fn unix_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(d.as_millis()).unwrap()
}

/// A name no other cell of any run has: the cell's prefix and instance ids.
fn unique_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("c{}-{n}-{:x}", std::process::id(), unix_ms())
}

/// FNV-1a of `s`: a cell's own stream of the run's seed.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
