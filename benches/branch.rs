//! What a branch costs on SeaweedFS at 1 and 8 GiB (issue 43; targets: every branch within
//! 1 s, at most 10 requests counted at the server and 64 KiB written, the same for both sizes),
//! and that every branch restores byte for byte to the parent's state at its fork.
//!
//! # What runs, for each size
//!
//! 1. **The parent**, in a bucket of its own: `store write` (the binary) of 64 KiB random
//!    values, `wal.bin` rotated at 256 MiB (the archives), in `ROUNDS` rounds of equal commits
//!    (the first starting with two snapshots 1,024 commits apart), each followed by `backup
//!    --once` to `s3://BUCKET/parent`: a restore point a round, a generation each (the WAL file
//!    changed under the worker), the newest naming about the whole size.
//! 2. **The forks**, seeded (ChaCha8, `SEED` + the size's index): commits drawn from the union
//!    of `[snapshot, manifest]` of every restore point (`ls --json`, and each manifest's
//!    snapshot); one branch in `TIME_EVERY` (the second of each) at an instant instead (`--at-time`, RFC 3339),
//!    drawn between the first restore point's `created_at` (plus 2 s: the bucket lists it a
//!    little later) and the last one's.
//! 3. **The branches**, one after the other, `branch --from PARENT (--at N | --at-time T) --to
//!    s3://BUCKET/branch-NN --json` through a counting proxy in front of SeaweedFS
//!    (`support/counting_proxy.rs`): the command's wall time and the report's `seconds`; the
//!    requests the proxy passed on (retries and errors too) and the report's `requests`; the
//!    report's `bytes_written` and the payload of the PUTs the proxy passed on. The branch with
//!    the most requests at the server is printed request by request.
//! 4. **Byte identity**: `store digest` of `restore --from BRANCH` equals that of `restore
//!    --from PARENT --at N` (N the report's `commit_seq`), both straight to SeaweedFS, each
//!    directory deleted once digested. Sizes up to `CHECK_ALL_MIB` check every branch; larger
//!    ones check in order while the next check is expected to end within `CHECK_SECS`, and at
//!    least `MIN_CHECKS`.
//! 5. A line per size, `FIGURE branch size=1GiB branches=20 max_seconds=… p50_seconds=…
//!    max_requests_server=… max_bytes_written=… identical=20/20 checked=20/20 …`
//!    (`max_seconds`, `p50_seconds`: wall times; `max_bytes_written`: the reports'), the
//!    targets `ok` or `MISSED`, then the bucket is emptied and deleted. A branch restoring to
//!    anything else than its fork fails the run (after the summary).
//!
//! # Running it (about 20 GB of free disk at the peak: 8 GiB in SeaweedFS, a store beside it)
//!
//! ```sh
//! source scripts/seaweedfs.sh && SW_VOLUME_MB=1024 sw_start
//! MUSHROOM_BENCH_ENDPOINT=$MUSHROOM_TEST_SEAWEEDFS_ENDPOINT cargo bench --bench branch
//! sw_stop
//! ```
//!
//! Settings, each `MUSHROOM_BENCH_` + the name: `ENDPOINT` (default
//! `$MUSHROOM_TEST_SEAWEEDFS_ENDPOINT`; credentials `test`/`test`), `SIZES_MIB` (`1024,8192`:
//! MiB of values), `BRANCHES` (20), `TIME_EVERY` (4), `ROUNDS` (4), `ROTATE_MIB` (256),
//! `CHECK_ALL_MIB` (1024), `CHECK_SECS` (1200), `MIN_CHECKS` (3), `SEED` (42), `DIR` (stores
//! and restores; the temp dir); and `MUSHROOM_BACKUP_BIN`, the binary (this build's).

#[path = "support/counting_proxy.rs"]
mod counting_proxy;
#[path = "../tests/support/fault_proxy.rs"]
#[allow(dead_code)] // its forward only
mod fault_proxy;
#[path = "support/serve.rs"]
mod serve;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use counting_proxy::{CountingProxy, Seen};
use mushroom_backup::bucket;
use mushroom_backup::manifest::Manifest;
use serve::{env_or, run, s3_client, verdict};

const MIB: u64 = 1 << 20;
const VALUE_SIZE: u64 = 64 << 10;
/// Commits between the first round's two snapshots (at most a quarter of a round).
const SNAPSHOT_EVERY: u64 = 1024;
/// The issue's targets, for every branch of every size.
const MAX_SECONDS: f64 = 1.0;
const MAX_REQUESTS: u64 = 10;
const MAX_BYTES: u64 = 64 << 10;

/// What the environment asks for; see the module docs.
struct Settings {
    endpoint: String,
    sizes_mib: Vec<u64>,
    branches: usize,
    time_every: usize,
    rounds: u64,
    rotate_mib: u64,
    check_all_mib: u64,
    check_secs: f64,
    min_checks: usize,
    seed: u64,
    dir: PathBuf,
    bin: PathBuf,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let var = |name: &str| std::env::var(format!("MUSHROOM_BENCH_{name}"));
        let num = |name: &str, default: u64| env_or(&format!("MUSHROOM_BENCH_{name}"), default);
        let endpoint = var("ENDPOINT")
            .or_else(|_| std::env::var("MUSHROOM_TEST_SEAWEEDFS_ENDPOINT"))
            .context(
                "no S3 endpoint: start SeaweedFS (`source scripts/seaweedfs.sh && \
                 SW_VOLUME_MB=1024 sw_start`) and set MUSHROOM_BENCH_ENDPOINT (or \
                 MUSHROOM_TEST_SEAWEEDFS_ENDPOINT) to its URL",
            )?;
        let sizes = var("SIZES_MIB").unwrap_or_else(|_| "1024,8192".into());
        let sizes_mib = sizes.split(',').map(|s| s.trim().parse::<u64>());
        let sizes_mib = sizes_mib.collect::<Result<_, _>>().context(sizes)?;
        let s = Settings {
            endpoint,
            sizes_mib,
            branches: usize::try_from(num("BRANCHES", 20)?)?,
            time_every: usize::try_from(num("TIME_EVERY", 4)?)?,
            rounds: num("ROUNDS", 4)?,
            rotate_mib: num("ROTATE_MIB", 256)?,
            check_all_mib: num("CHECK_ALL_MIB", 1024)?,
            check_secs: env_or("MUSHROOM_BENCH_CHECK_SECS", 1200.0)?,
            min_checks: usize::try_from(num("MIN_CHECKS", 3)?)?,
            seed: num("SEED", 42)?,
            dir: std::env::var_os("MUSHROOM_BENCH_DIR")
                .map_or_else(std::env::temp_dir, PathBuf::from),
            bin: std::env::var_os("MUSHROOM_BACKUP_BIN").map_or_else(
                || env!("CARGO_BIN_EXE_mushroom-backup").into(),
                PathBuf::from,
            ),
        };
        ensure!(
            s.rounds >= 2,
            "ROUNDS must be at least 2 (instants between restore points)"
        );
        ensure!(s.branches >= 1, "BRANCHES must be at least 1");
        Ok(s)
    }
}

fn json(out: &str) -> Result<Value> {
    serde_json::from_str(out.trim()).with_context(|| format!("not JSON: {out:?}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len(); // never 0: BRANCHES is at least 1
    (v[(n - 1) / 2] + v[n / 2]) / 2.0
}

fn size_label(mib: u64) -> String {
    if mib.is_multiple_of(1024) {
        format!("{}GiB", mib / 1024)
    } else {
        format!("{mib}MiB")
    }
}

fn unix_ms(rfc3339: &str) -> Result<i64> {
    let t = OffsetDateTime::parse(rfc3339, &Rfc3339).with_context(|| rfc3339.to_string())?;
    Ok(i64::try_from(t.unix_timestamp_nanos() / 1_000_000)?)
}

fn rfc3339_ms(ms: i64) -> Result<String> {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)?;
    Ok(t.format(&Rfc3339)?)
}

/// One restore point of the parent, as `ls --json` and its manifest tell.
#[derive(serde::Deserialize)]
struct Point {
    key: String,
    commit_seq: u64,
    generation: u64,
    created_at: String,
    bytes: u64,
    /// Its snapshot's commit: the oldest commit it reaches (from the manifest).
    #[serde(skip)]
    floor: u64,
    #[serde(skip)]
    created_ms: i64,
}

struct Parent {
    url: String,
    commits: u64,
    points: Vec<Point>,
}

/// Where a branch is cut.
#[derive(Clone)]
enum At {
    Commit(u64),
    Time(String),
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Commit(n) => write!(f, "--at {n}"),
            At::Time(t) => write!(f, "--at-time {t}"),
        }
    }
}

/// One branch cut, as measured.
struct Cut {
    i: usize,
    at: At,
    url: String,
    /// The report's `commit_seq`.
    n: u64,
    wall: f64,
    report_seconds: f64,
    report_requests: u64,
    report_bytes: u64,
    /// The requests the proxy passed on while it ran.
    server: Vec<Seen>,
}

impl Cut {
    fn server_requests(&self) -> u64 {
        self.server.len() as u64
    }

    fn put_bytes(&self) -> u64 {
        counting_proxy::written(&self.server)
    }
}

/// What one size came to.
struct Figure {
    line: String,
    identical: usize,
    checked: usize,
}

struct Bench {
    s: Settings,
    proxy: CountingProxy,
    rt: tokio::runtime::Runtime,
    s3: aws_sdk_s3::Client,
    work: PathBuf,
}

impl Bench {
    /// The binary, its S3 at `endpoint`.
    fn ours(&self, endpoint: &str) -> Command {
        let mut c = Command::new(&self.s.bin);
        // The credentials are this process's (set in `main`).
        c.env("AWS_ENDPOINT_URL", endpoint)
            .env("MUSHROOMDB_BACKUP_LOG", "warn");
        c
    }

    fn write(&self, store: &Path, commits: u64, snapshot_every: u64) -> Result<()> {
        run(self
            .ours(&self.s.endpoint)
            .args(["store", "write"])
            .arg(store)
            .args(["--commits", &commits.to_string()])
            .args(["--snapshot-every", &snapshot_every.to_string()])
            .args(["--value-size", &VALUE_SIZE.to_string()])
            .args(["--rotate-bytes", &(self.s.rotate_mib * MIB).to_string()])
            .args(["--value-kind", "random", "--seed", "1"]))?;
        Ok(())
    }

    /// Writes the parent of `size_mib` and backs it up in rounds (see the module docs).
    fn parent(&self, bucket: &str, size_mib: u64) -> Result<Parent> {
        let s = &self.s;
        let store = self.work.join(format!("parent-{size_mib}"));
        let url = format!("s3://{bucket}/parent");
        let commits = size_mib * MIB / VALUE_SIZE;
        let per_round = commits / s.rounds;
        let snap = SNAPSHOT_EVERY.min(per_round / 4).max(1);
        for round in 0..s.rounds {
            let started = Instant::now();
            let n = per_round + u64::from(round + 1 == s.rounds) * (commits % s.rounds);
            if round == 0 {
                self.write(&store, 2 * snap, snap)?;
                self.write(&store, n - 2 * snap, 0)?;
            } else {
                self.write(&store, n, 0)?;
            }
            let written = started.elapsed().as_secs_f64();
            let out = run(self
                .ours(&s.endpoint)
                .args(["backup", "--once", "--store"])
                .arg(&store)
                .args(["--to", &url]))?;
            let shipped = json(&out)
                .ok()
                .and_then(|v| v["bytes_shipped"].as_u64())
                .unwrap_or(0);
            println!(
                "  round {}/{}: {n} commits written in {written:.1} s, backed up in {:.1} s \
                 ({:.0} MiB shipped)",
                round + 1,
                s.rounds,
                started.elapsed().as_secs_f64() - written,
                shipped as f64 / MIB as f64
            );
        }
        std::fs::remove_dir_all(&store)?;
        let points = self.points(&url)?;
        Ok(Parent {
            url,
            commits,
            points,
        })
    }

    /// The parent's restore points: `ls --json`, and each manifest's snapshot commit.
    fn points(&self, url: &str) -> Result<Vec<Point>> {
        let out = run(self
            .ours(&self.s.endpoint)
            .args(["ls", "--json", "--from", url]))?;
        let mut points: Vec<Point> = serde_json::from_str(&out).context(out)?;
        self.rt.block_on(async {
            let cancel = tokio_util::sync::CancellationToken::new();
            let b = bucket::Open::read_only(url, &cancel).open().await?;
            for p in &mut points {
                let m = Manifest::decode(&p.key, &b.get(&p.key).await?.data)?;
                p.floor = m.snapshot.as_ref().map_or(0, |s| s.commit_seq);
                p.created_ms = unix_ms(&p.created_at)?;
            }
            anyhow::Ok(())
        })?;
        points.sort_by_key(|p| p.commit_seq);
        ensure!(!points.is_empty(), "{url} has no restore point");
        Ok(points)
    }

    /// Cuts branch `i` of `parent` at `at`, through the proxy.
    fn cut(&self, parent: &Parent, bucket: &str, i: usize, at: &At) -> Result<Cut> {
        let url = format!("s3://{bucket}/branch-{i:02}");
        let mut cmd = self.ours(self.proxy.url());
        cmd.args(["branch", "--from", &parent.url]);
        match at {
            At::Commit(n) => cmd.args(["--at", &n.to_string()]),
            At::Time(t) => cmd.args(["--at-time", t]),
        };
        cmd.args(["--to", &url, "--json"]);
        let before = self.proxy.count();
        let started = Instant::now();
        let out = run(&mut cmd)?;
        let wall = started.elapsed().as_secs_f64();
        let server = self.proxy.since(before);
        let r = json(&out)?;
        let field = |name: &str| r[name].as_u64().with_context(|| format!("{name} in {r}"));
        let n = field("commit_seq")?;
        if let At::Commit(asked) = at {
            ensure!(n == *asked, "branch {i} asked {asked}, cut at {n}: {r}");
        }
        Ok(Cut {
            i,
            at: at.clone(),
            url,
            n,
            wall,
            report_seconds: r["seconds"].as_f64().context("seconds")?,
            report_requests: field("requests")?,
            report_bytes: field("bytes_written")?,
            server,
        })
    }

    /// Restores `from` (at `at`) into a fresh directory, digests it and deletes it; the digest
    /// and the restore's seconds.
    fn restored(&self, from: &str, at: Option<u64>) -> Result<(Value, f64)> {
        let dir = self.work.join("restore");
        let mut cmd = self.ours(&self.s.endpoint);
        cmd.args(["restore", "--progress", "none", "--json", "--from", from])
            .arg("--to")
            .arg(&dir);
        if let Some(n) = at {
            cmd.args(["--at", &n.to_string()]);
        }
        let started = Instant::now();
        run(&mut cmd)?;
        let secs = started.elapsed().as_secs_f64();
        let digest = json(&run(self
            .ours(&self.s.endpoint)
            .args(["store", "digest"])
            .arg(&dir))?)?;
        std::fs::remove_dir_all(&dir)?;
        Ok((digest, secs))
    }

    /// The branch restores to what the parent restores to at its fork.
    fn check(&self, parent: &Parent, cut: &Cut) -> Result<bool> {
        let (branch, branch_secs) = self.restored(&cut.url, None)?;
        let (expected, parent_secs) = self.restored(&parent.url, Some(cut.n))?;
        let identical = branch == expected && expected["commit_seq"].as_u64() == Some(cut.n);
        println!(
            "  check {:>2}: commit {:>7}: {} (branch restored in {branch_secs:.1} s, parent --at \
             in {parent_secs:.1} s){}",
            cut.i,
            cut.n,
            if identical { "identical" } else { "DIFFERENT" },
            if identical {
                String::new()
            } else {
                format!(": branch {branch}, parent {expected}")
            }
        );
        Ok(identical)
    }
}

/// The forks of `count` branches (see the module docs).
fn forks(points: &[Point], count: usize, time_every: usize, rng: &mut ChaCha8Rng) -> Vec<At> {
    // The reachable commits: the union of every restore point's [snapshot, manifest].
    let mut ranges: Vec<(u64, u64)> = points
        .iter()
        .map(|p| (p.floor.max(1), p.commit_seq))
        .filter(|(a, b)| a <= b)
        .collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let total: u64 = merged.iter().map(|(a, b)| b - a + 1).sum();
    let first = points.iter().map(|p| p.created_ms).min().unwrap_or(0) + 2000;
    let last = points.iter().map(|p| p.created_ms).max().unwrap_or(0);
    (0..count)
        .map(|i| {
            if time_every > 0
                && i % time_every == 1 % time_every
                && first < last
                && let Ok(t) = rfc3339_ms(rng.random_range(first..=last))
            {
                return At::Time(t);
            }
            let mut k = rng.random_range(0..total.max(1));
            for (a, b) in &merged {
                if k <= b - a {
                    return At::Commit(a + k);
                }
                k -= b - a + 1;
            }
            At::Commit(points[points.len() - 1].commit_seq)
        })
        .collect()
}

impl Bench {
    /// One size, start to end; the bucket is deleted whatever happens.
    fn size(&self, index: usize, size_mib: u64) -> Result<Figure> {
        let bucket = format!("branch-bench-{size_mib}mib");
        self.rt
            .block_on(self.s3.create_bucket().bucket(&bucket).send())?;
        let figure = self.size_in(index, size_mib, &bucket);
        let deleted = self.rt.block_on(delete_bucket(&self.s3, &bucket));
        let figure = figure?;
        deleted.with_context(|| format!("delete bucket {bucket}"))?;
        Ok(figure)
    }

    fn size_in(&self, index: usize, size_mib: u64, bucket: &str) -> Result<Figure> {
        let s = &self.s;
        let label = size_label(size_mib);
        println!("\n== {label}: the parent ({} rounds) ==", s.rounds);
        let parent = self.parent(bucket, size_mib)?;
        println!(
            "  {} commits of {} KiB values; restore points:",
            parent.commits,
            VALUE_SIZE >> 10
        );
        for p in &parent.points {
            println!(
                "    {}  generation {}  commits {}..={}  {:.0} MiB  {}",
                p.key,
                p.generation,
                p.floor,
                p.commit_seq,
                p.bytes as f64 / MIB as f64,
                p.created_at
            );
        }
        let mut rng = ChaCha8Rng::seed_from_u64(s.seed + index as u64);
        let forks = forks(&parent.points, s.branches, s.time_every, &mut rng);
        println!(
            "\n== {label}: {} branches through the counting proxy ==",
            forks.len()
        );
        // SAFETY: sync(2) takes no arguments; nothing waits behind the backups' writeback.
        unsafe { libc::sync() };
        let mut cuts = Vec::new();
        for (i, at) in forks.iter().enumerate() {
            let c = self.cut(&parent, bucket, i, at)?;
            println!(
                "  branch {:>2} {:<36} commit {:>7}: {:.3} s (report {:.3} s), requests {} at \
                 the server ({}), {} reported; {} bytes written ({} PUT at the server)",
                c.i,
                c.at.to_string(),
                c.n,
                c.wall,
                c.report_seconds,
                c.server_requests(),
                counting_proxy::kinds(&c.server),
                c.report_requests,
                c.report_bytes,
                c.put_bytes()
            );
            cuts.push(c);
        }
        if let Some(worst) = cuts.iter().max_by_key(|c| c.server_requests()) {
            println!("  the requests of branch {} ({}):", worst.i, worst.at);
            for r in &worst.server {
                println!(
                    "    {} {} → {} ({} bytes)",
                    r.method, r.target, r.status, r.body_bytes
                );
            }
        }
        let checks = self.checks(&parent, &cuts, size_mib)?;
        let identical = checks.iter().filter(|c| **c).count();
        let line = figure(&label, &cuts, identical, checks.len());
        println!("{line}");
        targets(&cuts);
        Ok(Figure {
            line,
            identical,
            checked: checks.len(),
        })
    }

    /// The byte-identity checks of `cuts` (every one, or as many as the budget allows).
    fn checks(&self, parent: &Parent, cuts: &[Cut], size_mib: u64) -> Result<Vec<bool>> {
        let s = &self.s;
        let all = size_mib <= s.check_all_mib;
        println!(
            "\n== {}: byte identity ({}) ==",
            size_label(size_mib),
            if all {
                "every branch".to_string()
            } else {
                format!("within {:.0} s, at least {}", s.check_secs, s.min_checks)
            }
        );
        let started = Instant::now();
        let mut checks = Vec::new();
        for cut in cuts {
            let spent = started.elapsed().as_secs_f64();
            if !all
                && checks.len() >= s.min_checks
                && spent + spent / checks.len().max(1) as f64 > s.check_secs
            {
                break;
            }
            checks.push(self.check(parent, cut)?);
        }
        println!(
            "  {} of {} branches checked in {:.0} s",
            checks.len(),
            cuts.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(checks)
    }
}

/// The summary line of one size.
fn figure(label: &str, cuts: &[Cut], identical: usize, checked: usize) -> String {
    let walls: Vec<f64> = cuts.iter().map(|c| c.wall).collect();
    let max = |f: &dyn Fn(&Cut) -> u64| cuts.iter().map(f).max().unwrap_or(0);
    format!(
        "FIGURE branch size={label} branches={} max_seconds={:.3} p50_seconds={:.3} \
         max_requests_server={} max_bytes_written={} identical={identical}/{checked} \
         checked={checked}/{} max_report_seconds={:.3} max_requests_report={} \
         max_put_bytes_server={}",
        cuts.len(),
        walls.iter().copied().fold(0.0, f64::max),
        median(walls),
        max(&Cut::server_requests),
        max(&|c| c.report_bytes),
        cuts.len(),
        cuts.iter().map(|c| c.report_seconds).fold(0.0, f64::max),
        max(&|c| c.report_requests),
        max(&Cut::put_bytes),
    )
}

/// The issue's targets, each `ok` or `MISSED` with the branches that missed it.
fn targets(cuts: &[Cut]) {
    let missed = |f: &dyn Fn(&Cut) -> bool| -> String {
        let ids: Vec<String> = cuts
            .iter()
            .filter(|c| !f(c))
            .map(|c| c.i.to_string())
            .collect();
        if ids.is_empty() {
            verdict(true).to_string()
        } else {
            format!("{} (branches {})", verdict(false), ids.join(", "))
        }
    };
    println!(
        "  targets: every branch <= {MAX_SECONDS} s: {}; <= {MAX_REQUESTS} requests at the \
         server: {}; <= {} KiB written: {}",
        missed(&|c| c.wall <= MAX_SECONDS),
        missed(&|c| c.server_requests() <= MAX_REQUESTS),
        MAX_BYTES >> 10,
        missed(&|c| c.report_bytes.max(c.put_bytes()) <= MAX_BYTES)
    );
}

/// Deletes every object of `bucket`, then the bucket (SeaweedFS frees its volumes so).
async fn delete_bucket(s3: &aws_sdk_s3::Client, bucket: &str) -> Result<()> {
    let mut pages = s3.list_objects_v2().bucket(bucket).into_paginator().send();
    while let Some(page) = pages.next().await {
        for o in page?.contents() {
            let key = o.key().context("a listed object without a key")?;
            s3.delete_object().bucket(bucket).key(key).send().await?;
        }
    }
    s3.delete_bucket().bucket(bucket).send().await?;
    Ok(())
}

fn main() -> Result<()> {
    let s = Settings::from_env()?;
    // SAFETY: no other thread runs yet (the runtime and the proxy are started below).
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL", &s.endpoint);
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::remove_var("AWS_PROFILE");
    }
    let work = tempfile::Builder::new()
        .prefix("mushroom-branch-bench-")
        .tempdir_in(&s.dir)
        .with_context(|| format!("create a directory in {}", s.dir.display()))?;
    let proxy = CountingProxy::start(&s.endpoint)?;
    let (bin, sizes) = (s.bin.display(), &s.sizes_mib);
    println!(
        "branch bench: {bin} at {} (proxy {}), sizes {sizes:?} MiB",
        s.endpoint,
        proxy.url()
    );
    let bench = Bench {
        s3: s3_client(&s.endpoint),
        rt: tokio::runtime::Runtime::new()?,
        proxy,
        work: work.path().to_path_buf(),
        s,
    };
    let mut figures = Vec::new();
    for (i, &mib) in bench.s.sizes_mib.iter().enumerate() {
        figures.push(bench.size(i, mib)?);
    }
    println!();
    for f in &figures {
        println!("{}", f.line);
    }
    let bad: usize = figures.iter().map(|f| f.checked - f.identical).sum();
    ensure!(
        bad == 0,
        "{bad} branches restored to something else than their fork"
    );
    Ok(())
}
