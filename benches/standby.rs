//! A standby's lag behind a busy primary, and what an idle standby costs: `cargo bench --bench
//! standby` (release; moto on loopback, started from the crate's `.venv`, its request log
//! counted at the server).
//!
//! # What it runs
//! The reference engine commits in this process (each commit synced, at `RATE` a second, for
//! `SECS`), the release binary's `backup` follows the store to moto on default settings
//! (`wal_interval` 1 s), and `restore --follow` (default polls: 1 s, idle 15 s) follows the
//! prefix into another directory, printing one JSON line per apply, which this process reads
//! as it comes.
//!
//! # What it prints
//! - **Lag**: for every commit, the time from its sync to the first apply line that holds it;
//!   p50, p99 and max, against the bound `wal_interval + poll + 1 s` (3 s).
//! - **Idle**: once the writer stopped and the standby caught up, the backup is stopped and every
//!   request moto logs is the standby's: those of the first `IDLE_RAMP_SECS` (polls slowing
//!   down) and of the next `IDLE_SECS` (steady), by kind, and the steady rate per hour.
//!
//! | variable | default | meaning |
//! | --- | --- | --- |
//! | `RATE` | 100 | commits per second |
//! | `SECS` | 60 | seconds of commits |
//! | `IDLE_RAMP_SECS` | 30 | idle seconds while polls slow down (not extrapolated) |
//! | `IDLE_SECS` | 120 | steady idle seconds measured |

#[path = "support/moto.rs"]
mod moto;
#[path = "support/serve.rs"]
mod serve;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mushroom_backup::store::engine::{Engine, EngineOptions, workload_ops};
use serve::env_or;

const BUCKET: &str = "standby";
const SEED: u64 = 11;
const VALUE_SIZE: usize = 64;
/// `wal_interval` + poll interval + 1 s, at the defaults.
const LAG_BOUND: Duration = Duration::from_secs(3);

fn binary(moto: &moto::Moto) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mushroom-backup"));
    cmd.env("AWS_ENDPOINT_URL", &moto.url)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("MUSHROOMDB_BACKUP_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

/// The stdout lines of a child as `(when read, line)`.
fn lines(child: &mut Child) -> Receiver<(Instant, String)> {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for an apply line holding commit `n`; returns every `(when, commit_seq)` seen.
fn until_commit(
    rx: &Receiver<(Instant, String)>,
    n: u64,
    within: Duration,
) -> anyhow::Result<Vec<(Instant, u64)>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (at, line) = rx
            .recv_timeout(left)
            .with_context(|| format!("no apply of commit {n}"))?;
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if let Some(seq) = v["commit_seq"].as_u64() {
            seen.push((at, seq));
            if seq >= n {
                return Ok(seen);
            }
        }
    }
}

fn sigterm(child: &mut Child) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(child.id())?;
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = child.wait()?;
    if !status.success() {
        bail!("exited {status} on SIGTERM");
    }
    Ok(())
}

/// Requests moto logged from line `from` on, by method and kind.
fn requests(m: &moto::Moto, from: usize) -> (usize, String) {
    let lines = m.request_lines();
    let new = &lines[from.min(lines.len())..];
    let count = |f: &dyn Fn(&str) -> bool| new.iter().filter(|l| f(l)).count();
    let list = count(&|l| l.contains("\"GET ") && l.contains("list-type=2"));
    let get = count(&|l| l.contains("\"GET ") && !l.contains("list-type=2"));
    let other = new.len() - list - get;
    (new.len(), format!("{list} LIST, {get} GET, {other} other"))
}

/// Creates bucket `name` (an unsigned `PUT /NAME`: moto, as run here, takes any caller).
fn create_bucket(m: &moto::Moto, name: &str) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let addr = m.url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "PUT /{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    if !answer.starts_with("HTTP/1.1 200") {
        bail!(
            "create bucket {name}: {}",
            answer.lines().next().unwrap_or("")
        );
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let rate: u64 = env_or("RATE", 100)?;
    let secs: u64 = env_or("SECS", 60)?;
    let ramp = Duration::from_secs(env_or("IDLE_RAMP_SECS", 30)?);
    let idle = Duration::from_secs(env_or("IDLE_SECS", 120)?);
    let work = tempfile::Builder::new()
        .prefix("mushroom-standby-bench-")
        .tempdir()?;
    let m = moto::Moto::start(&work.path().join("moto.log"))?;
    create_bucket(&m, BUCKET)?;
    let url = format!("s3://{BUCKET}/p");
    let (src, dir) = (work.path().join("src"), work.path().join("standby"));

    let mut engine = Engine::open(&src, EngineOptions::default())?;
    let mut seq = 0;
    for _ in 0..1000 {
        seq = engine.commit(&workload_ops(SEED, seq + 1, VALUE_SIZE))?;
    }
    engine.sync()?;
    let once = binary(&m)
        .args(["backup", "--once", "--to", &url, "--store"])
        .arg(&src)
        .output()?;
    if !once.status.success() {
        bail!("backup --once: {}", String::from_utf8_lossy(&once.stderr));
    }
    let mut backup = binary(&m)
        .args(["backup", "--to", &url, "--store"])
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut standby = binary(&m)
        .args(["restore", "--follow", "--json", "--from", &url, "--to"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .spawn()?;
    let rx = lines(&mut standby);
    until_commit(&rx, seq, Duration::from_secs(60))?;

    // Busy: RATE commits a second, each synced; the time of each.
    let base = seq;
    let start = Instant::now();
    let mut synced = Vec::with_capacity((rate * secs) as usize);
    for i in 0..rate * secs {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        seq = engine.commit(&workload_ops(SEED, seq + 1, VALUE_SIZE))?;
        engine.sync()?;
        synced.push(Instant::now());
    }
    let applies = until_commit(&rx, seq, Duration::from_secs(60))?;
    let mut lags: Vec<Duration> = Vec::with_capacity(synced.len());
    for (i, at) in synced.iter().enumerate() {
        let n = base + 1 + i as u64;
        let applied = applies.iter().find(|(_, s)| *s >= n).map(|(t, _)| *t);
        lags.push(
            applied
                .context("an applied commit")?
                .saturating_duration_since(*at),
        );
    }
    lags.sort();
    let (p50, p99, max) = (
        percentile(&lags, 0.5),
        percentile(&lags, 0.99),
        lags[lags.len() - 1],
    );
    println!(
        "standby lag at {rate} commits/s over {secs} s ({} commits, {} applies): p50 {:.3} s, \
         p99 {:.3} s, max {:.3} s; bound (wal 1 s + poll 1 s + 1 s) {:.1} s, p99/bound {:.2}",
        lags.len(),
        applies.len(),
        p50.as_secs_f64(),
        p99.as_secs_f64(),
        max.as_secs_f64(),
        LAG_BOUND.as_secs_f64(),
        p99.as_secs_f64() / LAG_BOUND.as_secs_f64()
    );

    // Idle: the backup stopped (it flushes and releases its lease), so every request is the
    // standby's.
    sigterm(&mut backup)?;
    drop(engine);
    std::thread::sleep(Duration::from_secs(2));
    let mark = m.request_lines().len();
    std::thread::sleep(ramp);
    let (ramp_n, ramp_kinds) = requests(&m, mark);
    let mark = m.request_lines().len();
    std::thread::sleep(idle);
    let (idle_n, idle_kinds) = requests(&m, mark);
    println!(
        "idle standby (default polls): first {} s {ramp_n} requests ({ramp_kinds}); next {} s \
         {idle_n} requests ({idle_kinds}) = {:.0} requests per hour",
        ramp.as_secs(),
        idle.as_secs(),
        idle_n as f64 * 3600.0 / idle.as_secs_f64()
    );
    sigterm(&mut standby)?;
    Ok(())
}
