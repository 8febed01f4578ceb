//! Branches under random operations on `file://` buckets (issue 43), seeded and replayable:
//! stores written and backed up (their generations changing), branches cut at a random
//! reachable commit (or instant) of a store's prefix or of a branch's, branches deleted,
//! retention passes under random policies, a branch or a delete crashed at a random request
//! (before it is sent or after it lands), and branches adopted as stores that back up into
//! their prefix. After every operation:
//!
//! 1. **No object a live branch names is deleted**: its manifest is in its prefix, every key
//!    it names is in its holder, and its pin there is unreleased. Every
//!    [`FULL_CHECK_EVERY`] operations and at the end, every live branch restores to the digest
//!    its parent restored to at the fork when it was cut (and every store's prefix to the
//!    store).
//! 2. **Every pin without a live branch is reclaimed**: after a retention pass with no orphan
//!    grace (an operator's or a worker's), the prefix's `pins/` holds the pins of its live
//!    branches and nothing else (a deleted branch's pin, its release, the pin of a branch that
//!    crashed before its manifest: gone).
//!
//! A crashed branch is live iff its prefix holds its manifest afterwards; a crashed delete is
//! run again without faults, as an operator would, and the branch counts as deleted.
//!
//! `BRANCH_PROPS_SEED` replays a run (the seed is printed), `BRANCH_PROPS_OPS` sets its length
//! ([`DEFAULT_OPS`]). A run is cut into worlds of `BRANCH_PROPS_WORLD_OPS` operations
//! ([`WORLD_OPS`]), each in a fresh directory with its own generator drawn from the seed, so
//! `BRANCH_PROPS_WORLD=w` replays world `w` alone; a failure prints the world's operations
//! (and `BRANCH_PROPS_KEEP=1` keeps its directory). The run ends with a line
//! `FIGURE branch_props ops=N seed=S branches=B deleted=D crashes=C retention_passes=R secs=T`.

mod support;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mushroom_backup::branch::{self, BranchError, ForkAt};
use mushroom_backup::bucket::faults::{CrashKind, FaultPlan, FaultyBucket};
use mushroom_backup::bucket::{self, BucketError, DynBucket};
use mushroom_backup::manifest::{self, Manifest};
use mushroom_backup::restore::{self, RestoreError, RestoreOptions};
use mushroom_backup::store::engine::WriteOptions;
use mushroom_backup::worker::RetentionPolicy;
use mushroom_backup::worker::retention_pass::pass;
use mushroom_backup::worker::tiers::Tiers;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::store::{config, digest, fs_bucket, worker, write_with};
use uuid::Uuid;

/// Operations of a run by default: 12 to 35 s in a debug build on a busy 2-core machine.
const DEFAULT_OPS: u64 = 600;
/// Operations per world (a fresh bucket and stores).
const WORLD_OPS: u64 = 150;
/// Every live branch is restored this often (and at the end of each world).
const FULL_CHECK_EVERY: u64 = 50;
/// Past this many live branches, a branch is deleted instead of cut.
const MAX_LIVE: usize = 16;

use support::store::file_url as url;

fn env(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}")))
}

/// Whether `r` failed by the injected crash (and by nothing else).
fn crashed<T>(r: &Result<T, BranchError>) -> bool {
    matches!(
        r,
        Err(BranchError::Bucket(BucketError::Crashed { .. })
            | BranchError::Restore(RestoreError::Bucket(BucketError::Crashed { .. })))
    )
}

/// `bucket`, crashing at `crash` when given.
fn faulty(bucket: DynBucket, crash: Option<(u64, CrashKind)>) -> DynBucket {
    match crash {
        Some((n, kind)) => Arc::new(FaultyBucket::new(bucket, FaultPlan::crash_at(n, kind))),
        None => bucket,
    }
}

/// A prefix of the world's bucket: a store's, or a branch's.
struct Prefix {
    dir: PathBuf,
    name: String,
    /// The store backing up into it (a parent, or a branch adopted as a store) and the
    /// workload seed it is written with.
    store: Option<(PathBuf, u64)>,
}

/// A branch cut (or left whole by a crash).
struct Branch {
    prefix: usize,
    lineage: Uuid,
    holder: String,
    manifest: String,
    commit: u64,
    /// What its parent restored to at the fork when it was cut.
    expected: String,
    live: bool,
}

#[derive(Debug, Default)]
struct Figures {
    ops: u64,
    worlds: u64,
    branches: u64,
    deleted: u64,
    crashes: u64,
    retention_passes: u64,
    unreachable: u64,
    adopted: u64,
    backups: u64,
    restores: u64,
    pin_checks: u64,
    /// Branches at an instant whose commit matched `restore --at-time`.
    instants: u64,
}

struct World {
    seed: u64,
    index: u64,
    root: PathBuf,
    guard: Option<tempfile::TempDir>,
    rng: StdRng,
    prefixes: Vec<Prefix>,
    branches: Vec<Branch>,
    names: Cell<u64>,
    log: RefCell<Vec<String>>,
}

impl Drop for World {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let (seed, world, log) = (self.seed, self.index, self.log.borrow().join("\n  "));
        eprintln!(
            "branch props: FAILED in world {world} of seed {seed} (replay with \
             BRANCH_PROPS_SEED={seed} BRANCH_PROPS_WORLD={world}); its operations:\n  {log}"
        );
        if std::env::var_os("BRANCH_PROPS_KEEP").is_some()
            && let Some(g) = self.guard.take()
        {
            eprintln!("branch props: kept {}", g.keep().display());
        }
    }
}

impl World {
    async fn new(seed: u64, index: u64, figs: &mut Figures) -> World {
        let guard = tempfile::tempdir().expect("a temp dir");
        let root = guard.path().to_path_buf();
        for d in ["b", "s", "r"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let mut w = World {
            seed,
            index,
            root,
            guard: Some(guard),
            rng: StdRng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            prefixes: Vec::new(),
            branches: Vec::new(),
            names: Cell::new(0),
            log: RefCell::new(Vec::new()),
        };
        for i in 0..2u64 {
            w.prefixes.push(Prefix {
                dir: w.root.join(format!("b/p{i}")),
                name: format!("p{i}"),
                store: Some((w.root.join(format!("s/p{i}")), i + 1)),
            });
            w.write_and_back_up(usize::try_from(i).unwrap(), figs).await;
        }
        w
    }

    fn name(&self, kind: &str) -> String {
        let n = self.names.get();
        self.names.set(n + 1);
        format!("{kind}{n}")
    }

    fn note(&self, line: String) {
        self.log.borrow_mut().push(line);
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "branch props (seed {}, world {}, op {}): {what}",
            self.seed,
            self.index,
            self.log.borrow().len()
        )
    }

    fn live(&self) -> Vec<usize> {
        (0..self.branches.len())
            .filter(|&b| self.branches[b].live)
            .collect()
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.rng.random_range(0..from.len())])
    }

    fn crash_point(&mut self, requests: u64) -> (u64, CrashKind) {
        let kind = [CrashKind::Before, CrashKind::After][self.rng.random_range(0..2)];
        (self.rng.random_range(1..=requests), kind)
    }

    /// One random operation, then the cheap check of every live branch.
    async fn step(&mut self, figs: &mut Figures) {
        let crowded = self.live().len() > MAX_LIVE;
        match self.rng.random_range(0..100) {
            0..25 => {
                let stores: Vec<usize> = (0..self.prefixes.len())
                    .filter(|&i| self.prefixes[i].store.is_some())
                    .collect();
                let i = self.pick(&stores).expect("the parents' stores");
                self.write_and_back_up(i, figs).await;
            }
            25..50 if !crowded => self.cut(None, figs).await,
            25..60 => self.delete(None, figs).await,
            60..78 => self.retention(figs).await,
            78..86 if !crowded => {
                let crash = self.crash_point(10);
                self.cut(Some(crash), figs).await;
            }
            78..92 => {
                let crash = self.crash_point(7);
                self.delete(Some(crash), figs).await;
            }
            _ => self.adopt(figs).await,
        }
        figs.ops += 1;
        self.check_keys().await;
    }

    /// Random commits into the store of prefix `i` (a snapshot every so often, so its
    /// generations change), then a backup (sometimes with the most aggressive retention).
    async fn write_and_back_up(&mut self, i: usize, figs: &mut Figures) {
        if let Err(e) = self.try_write_and_back_up(i, figs).await {
            let name = &self.prefixes[i].name;
            self.fail(format!("the backup into {name}: {e}"));
        }
    }

    async fn try_write_and_back_up(
        &mut self,
        i: usize,
        figs: &mut Figures,
    ) -> Result<(), mushroom_backup::worker::WorkerError> {
        let (store, seed) = self.prefixes[i].store.clone().expect("a store");
        let commits = match self.rng.random_range(0..10) {
            0 => 0,
            1..=6 => self.rng.random_range(1..=120),
            _ => self.rng.random_range(120..=400),
        };
        let snapshot_every = [0, 0, 60, 150, 300][self.rng.random_range(0..5)];
        let rotate_bytes = [0, 0, 0, 6000][self.rng.random_range(0..4)];
        write_with(
            &store,
            WriteOptions {
                commits,
                snapshot_every,
                rotate_bytes,
                seed,
                ..WriteOptions::default()
            },
        );
        let mut c = config();
        let aggressive = self.rng.random_bool(0.3);
        if aggressive {
            c.retention = RetentionPolicy {
                keep_for: Duration::ZERO,
                keep_generations: 1,
                orphan_grace: Duration::ZERO,
                ..RetentionPolicy::default()
            };
        }
        let name = self.prefixes[i].name.clone();
        self.note(format!(
            "write {commits} commits (snapshot every {snapshot_every}, rotate at \
             {rotate_bytes}) to the store of {name}, back up (aggressive retention: \
             {aggressive})"
        ));
        let report = worker(&store, fs_bucket(&self.prefixes[i].dir), c)
            .run_once()
            .await?;
        self.note(format!("  -> {report:?}"));
        figs.backups += 1;
        if aggressive {
            self.check_pins(i, figs).await;
        }
        Ok(())
    }

    /// The digest `dir` restores to (at commit `at`).
    async fn restored(&self, dir: &Path, at: Option<u64>) -> Result<String, RestoreError> {
        let into = self.root.join("r").join(self.name("r"));
        let opts = RestoreOptions {
            at,
            ..RestoreOptions::default()
        };
        let got = restore::restore(fs_bucket(dir).as_ref(), &into, &opts).await;
        let d = got.map(|_| digest(&into).digest);
        let _ = std::fs::remove_dir_all(&into);
        d
    }

    /// A random fork point of the prefix `from`: a commit of one of its restore points' ranges
    /// (the snapshot's commit to the manifest's), or now and then that manifest's instant.
    async fn fork_point(&mut self, from: usize) -> Option<ForkAt> {
        let parent = fs_bucket(&self.prefixes[from].dir);
        let keys: Vec<String> = bucket::list_all(parent.as_ref(), manifest::MANIFESTS_PREFIX)
            .await
            .expect("list manifests")
            .into_iter()
            .map(|o| o.key)
            .filter(|k| manifest::parse_manifest_key(k).is_some())
            .collect();
        let key = keys.get(self.rng.random_range(0..keys.len().max(1)))?;
        let got = parent.get(key).await.expect("get a manifest");
        let m = Manifest::decode(key, &got.data).expect("a manifest decodes");
        let low = m.snapshot.as_ref().map_or(0, |s| s.commit_seq).max(1);
        if m.commit_seq < low {
            return None;
        }
        if self.rng.random_bool(0.1) {
            let t = manifest::parse_time_ms(&m.created_at).expect("a manifest's time");
            return Some(ForkAt::Time(t + self.rng.random_range(0..2000)));
        }
        Some(ForkAt::Commit(self.rng.random_range(low..=m.commit_seq)))
    }

    /// Cuts a branch of a random store's or live branch's prefix, crashed at `crash` if given.
    async fn cut(&mut self, crash: Option<(u64, CrashKind)>, figs: &mut Figures) {
        let live: HashSet<usize> = self
            .live()
            .iter()
            .map(|&b| self.branches[b].prefix)
            .collect();
        let sources: Vec<usize> = (0..self.prefixes.len())
            .filter(|i| self.prefixes[*i].store.is_some() || live.contains(i))
            .collect();
        let from = self.pick(&sources).expect("the parents");
        let Some(at) = self.fork_point(from).await else {
            return self.note(format!("{}: no fork point", self.prefixes[from].name));
        };
        let name = self.name("br");
        let parent_dir = self.prefixes[from].dir.clone();
        let dir = self.root.join("b").join(&name);
        let context = format!(
            "branch of {} at {at:?} into {name} (crash: {crash:?})",
            self.prefixes[from].name
        );
        self.note(context.clone());
        let bucket = faulty(fs_bucket(&parent_dir), crash);
        let (from_url, to) = (url(&parent_dir), url(&dir));
        let opts = RestoreOptions::default();
        let result = branch::create(bucket, &from_url, &to, at, &opts, None).await;
        match &result {
            Err(
                e @ BranchError::Restore(
                    RestoreError::Unreachable { .. } | RestoreError::BeforeEarliest { .. },
                ),
            ) => {
                figs.unreachable += 1;
                return self.note(format!("  -> refused: {e}"));
            }
            Err(_) if crashed(&result) => figs.crashes += 1,
            Err(e) => self.fail(format!("{context}: {e}")),
            Ok(r) => self.note(format!("  -> {} objects held in {}", r.objects, r.holder)),
        }
        // Live iff its prefix holds its manifest.
        let (found, _) = branch::delete::find(fs_bucket(&dir).as_ref())
            .await
            .expect("look for the branch manifest");
        let Some(m) = found else {
            if result.is_ok() {
                self.fail(format!(
                    "{context}: made, but its prefix holds no branch manifest"
                ));
            }
            self.note("  -> crashed: no branch".into());
            return;
        };
        let reported = result.as_ref().ok().map(|r| (r.lineage, r.commit_seq));
        if reported.is_some_and(|r| r != (m.lineage, m.commit_seq))
            || matches!(at, ForkAt::Commit(n) if n != m.commit_seq)
        {
            self.fail(format!(
                "{context}: reported {reported:?}, its manifest is {m:?}"
            ));
        }
        // An instant forks at the commit `restore --at-time` restores (the branch finds it
        // with a cheaper reading of the bucket: `branch::fork::at_time`).
        if let ForkAt::Time(t) = at {
            let into = self.root.join("r").join(self.name("t"));
            let opts = RestoreOptions {
                at_time_ms: Some(t),
                ..RestoreOptions::default()
            };
            let got = restore::restore(fs_bucket(&parent_dir).as_ref(), &into, &opts).await;
            let _ = std::fs::remove_dir_all(&into);
            match got {
                Ok(r) if r.commit_seq == m.commit_seq => figs.instants += 1,
                got => self.fail(format!(
                    "{context}: branched at commit {}, restore --at-time gives {:?}",
                    m.commit_seq,
                    got.map(|r| r.commit_seq)
                )),
            }
        }
        let expected = self
            .restored(&parent_dir, Some(m.commit_seq))
            .await
            .unwrap_or_else(|e| self.fail(format!("{context}: the parent at the fork: {e}")));
        let holder = m.holder().unwrap_or_default().to_string();
        self.note(format!(
            "  -> {name} is live (lineage {}, commit {}, holder {holder})",
            m.lineage, m.commit_seq
        ));
        let store = None;
        self.prefixes.push(Prefix { dir, name, store });
        self.branches.push(Branch {
            prefix: self.prefixes.len() - 1,
            lineage: m.lineage,
            holder,
            manifest: m.key(),
            commit: m.commit_seq,
            expected,
            live: true,
        });
        figs.branches += 1;
    }

    /// Deletes a random live branch, crashed at `crash` if given (and then run again).
    async fn delete(&mut self, crash: Option<(u64, CrashKind)>, figs: &mut Figures) {
        let Some(b) = self.pick(&self.live()) else {
            return;
        };
        let (dir, name) = {
            let p = &self.prefixes[self.branches[b].prefix];
            (p.dir.clone(), p.name.clone())
        };
        let context = format!("delete {name} (crash: {crash:?})");
        self.note(context.clone());
        let result = branch::delete::delete(faulty(fs_bucket(&dir), crash), &url(&dir), None).await;
        if crashed(&result) {
            figs.crashes += 1;
            match branch::delete::delete(fs_bucket(&dir), &url(&dir), None).await {
                Ok(_) => self.note("  -> crashed; deleted when run again".into()),
                Err(BranchError::NotABranch { .. }) => {
                    self.note("  -> crashed; nothing left to delete when run again".into())
                }
                Err(e) => self.fail(format!("{context}: run again: {e}")),
            }
        } else {
            match result {
                Ok(r) if r.lineage == self.branches[b].lineage => {}
                Ok(r) => self.fail(format!("{context}: deleted {r:?}")),
                Err(e) => self.fail(format!("{context}: {e}")),
            }
        }
        self.branches[b].live = false;
        figs.deleted += 1;
    }

    /// A retention pass over a random prefix with a random policy.
    async fn retention(&mut self, figs: &mut Figures) {
        let i = self.rng.random_range(0..self.prefixes.len());
        let no_grace = self.rng.random_bool(0.6);
        let tiers = if self.rng.random_bool(0.25) {
            Tiers {
                keep_daily: self.rng.random_range(0..=2),
                keep_weekly: self.rng.random_range(0..=1),
                keep_monthly: 0,
            }
        } else {
            Tiers::default()
        };
        let policy = RetentionPolicy {
            keep_for: Duration::ZERO,
            keep_generations: self.rng.random_range(1..=3),
            orphan_grace: Duration::from_secs(if no_grace { 0 } else { 3600 }),
            tiers,
        };
        let name = self.prefixes[i].name.clone();
        self.note(format!("retention of {name}: {policy:?}"));
        let report = pass(&fs_bucket(&self.prefixes[i].dir), &policy)
            .await
            .unwrap_or_else(|e| self.fail(format!("retention of {name}: {e}")));
        self.note(format!("  -> deleted {}", report.deleted));
        figs.retention_passes += 1;
        if no_grace {
            self.check_pins(i, figs).await;
        }
    }

    /// A random live branch restored as a store of its own (`--adopt`), written to and backed
    /// up into the branch prefix.
    async fn adopt(&mut self, figs: &mut Figures) {
        let Some(b) = self.pick(&self.live()) else {
            return;
        };
        let p = self.branches[b].prefix;
        let store = self.root.join("s").join(self.name("a"));
        let name = self.prefixes[p].name.clone();
        self.note(format!("adopt {name} as the store {}", store.display()));
        let bucket = fs_bucket(&self.prefixes[p].dir);
        let opts = RestoreOptions {
            adopt: true,
            ..RestoreOptions::default()
        };
        restore::restore(bucket.as_ref(), &store, &opts)
            .await
            .unwrap_or_else(|e| self.fail(format!("adopt {name}: {e}")));
        self.prefixes[p].store = Some((store, 1000 + self.names.get()));
        figs.adopted += 1;
        // A branch whose `branch` crashed after its manifest, before its LATEST, is whole too:
        // a store adopted from it backs up into it (`worker::lineage` takes a missing LATEST
        // with the parent the newest manifest as the parent's).
        if let Err(e) = self.try_write_and_back_up(p, figs).await {
            self.fail(format!("the backup into {name}: {e}"));
        }
    }

    /// Invariant 1, cheaply: every live branch's manifest is in its prefix, and every key it
    /// names, and its pin (unreleased), are in its holder.
    async fn check_keys(&self) {
        let mut listed: HashMap<String, HashSet<String>> = HashMap::new();
        for &b in &self.live() {
            let br = &self.branches[b];
            let p = &self.prefixes[br.prefix];
            let got = fs_bucket(&p.dir)
                .get(&br.manifest)
                .await
                .unwrap_or_else(|e| {
                    self.fail(format!("live branch {}: its manifest: {e}", p.name))
                });
            let m = Manifest::decode(&br.manifest, &got.data)
                .unwrap_or_else(|e| self.fail(format!("live branch {}: {e}", p.name)));
            if m.lineage != br.lineage || m.holder() != Some(br.holder.as_str()) {
                self.fail(format!("live branch {}: its manifest is now {m:?}", p.name));
            }
            if !listed.contains_key(&br.holder) {
                let dir = Path::new(br.holder.strip_prefix("file://").expect("a file:// URL"));
                let keys = bucket::list_all(fs_bucket(dir).as_ref(), "")
                    .await
                    .expect("list the holder");
                listed.insert(br.holder.clone(), keys.into_iter().map(|o| o.key).collect());
            }
            let there = &listed[&br.holder];
            for o in m.objects() {
                if !there.contains(&o.key) {
                    self.fail(format!(
                        "{} of {} was deleted, but live branch {} (lineage {}, fork {}) names it",
                        o.key, br.holder, p.name, br.lineage, br.commit
                    ));
                }
            }
            let (pin, release) = (
                manifest::pin_key(br.lineage),
                manifest::release_key(br.lineage),
            );
            if !there.contains(&pin) || there.contains(&release) {
                self.fail(format!(
                    "live branch {}: its pin in {} is gone or released",
                    p.name, br.holder
                ));
            }
        }
    }

    /// Invariant 2: after a pass with no grace over prefix `i`, its `pins/` holds exactly the
    /// pins of the live branches it holds objects of.
    async fn check_pins(&self, i: usize, figs: &mut Figures) {
        let holder = url(&self.prefixes[i].dir);
        let want: BTreeSet<String> = self
            .branches
            .iter()
            .filter(|b| b.live && b.holder == holder)
            .map(|b| manifest::pin_key(b.lineage))
            .collect();
        let got: BTreeSet<String> = bucket::list_all(
            fs_bucket(&self.prefixes[i].dir).as_ref(),
            manifest::PINS_PREFIX,
        )
        .await
        .expect("list pins")
        .into_iter()
        .map(|o| o.key)
        .collect();
        if got != want {
            self.fail(format!(
                "after a pass with no grace, {} holds the pins {got:?}; its live branches' are \
                 {want:?}",
                self.prefixes[i].name
            ));
        }
        figs.pin_checks += 1;
    }

    /// Invariant 1 in full: every live branch restores to its parent at the fork, and every
    /// store's prefix to the store.
    async fn check_restores(&self, figs: &mut Figures) {
        for &b in &self.live() {
            let br = &self.branches[b];
            let p = &self.prefixes[br.prefix];
            let got = self
                .restored(&p.dir, Some(br.commit))
                .await
                .unwrap_or_else(|e| self.fail(format!("live branch {}: restore: {e}", p.name)));
            if got != br.expected {
                self.fail(format!(
                    "live branch {} restores to {got}, its parent was {} at its fork {}",
                    p.name, br.expected, br.commit
                ));
            }
            figs.restores += 1;
        }
        for p in &self.prefixes {
            let Some((store, _)) = &p.store else {
                continue;
            };
            let got = match self.restored(&p.dir, None).await {
                Ok(got) => got,
                // A store adopted from a branch deleted before it wrote a restore point of its
                // own: its prefix holds none.
                Err(RestoreError::NoRestorePoint { .. })
                    if bucket::list_all(fs_bucket(&p.dir).as_ref(), manifest::MANIFESTS_PREFIX)
                        .await
                        .expect("list manifests")
                        .is_empty() =>
                {
                    continue;
                }
                Err(e) => self.fail(format!("the store's prefix {}: {e}", p.name)),
            };
            if got != digest(store).digest {
                self.fail(format!("{} does not restore to its store", p.name));
            }
            figs.restores += 1;
        }
        self.note("full check: every live branch and store restores".into());
    }
}

async fn run_world(seed: u64, index: u64, ops: u64, figs: &mut Figures) {
    let mut w = World::new(seed, index, figs).await;
    for n in 1..=ops {
        w.step(figs).await;
        if n.is_multiple_of(FULL_CHECK_EVERY) {
            w.check_restores(figs).await;
        }
    }
    if !ops.is_multiple_of(FULL_CHECK_EVERY) {
        w.check_restores(figs).await;
    }
    figs.worlds += 1;
}

#[tokio::test]
async fn random_branches_deletes_crashes_and_retention_keep_live_branches_whole_and_no_dead_pin() {
    let seed = env("BRANCH_PROPS_SEED").unwrap_or_else(rand::random);
    eprintln!("branch props: seed {seed} (replay with BRANCH_PROPS_SEED={seed})");
    let ops = env("BRANCH_PROPS_OPS").unwrap_or(DEFAULT_OPS);
    let world_ops = env("BRANCH_PROPS_WORLD_OPS").unwrap_or(WORLD_OPS).max(1);
    let only = env("BRANCH_PROPS_WORLD");
    let started = Instant::now();
    let mut figs = Figures::default();
    let mut world = only.unwrap_or(0);
    while figs.ops < ops {
        run_world(seed, world, world_ops.min(ops - figs.ops), &mut figs).await;
        world += 1;
        if only.is_some() {
            break;
        }
        if figs.worlds.is_multiple_of(50) {
            eprintln!(
                "branch props: {} ops, {} worlds, {:.0} s",
                figs.ops,
                figs.worlds,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "FIGURE branch_props ops={} seed={seed} branches={} deleted={} crashes={} \
         retention_passes={} secs={secs:.1}",
        figs.ops, figs.branches, figs.deleted, figs.crashes, figs.retention_passes
    );
    eprintln!("branch props: {figs:?}");
    assert!(
        figs.branches > 0 && figs.retention_passes > 0,
        "the run exercised nothing"
    );
}
