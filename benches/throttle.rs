//! Throttle classes (issue 44): 20 stores uploading their first backup together under an
//! instance `bulk` limit of 20 MB/s and 4 MB/s per store, while one more store commits 100
//! commits/s; the bytes counted at the server side of every store's connections, in 10 s
//! windows.
//!
//! # What runs
//!
//! The S3 server is `THROTTLE_S3_ENDPOINT` (e.g. SeaweedFS's `weed mini`, credentials from the
//! environment), else a `moto_server` of the crate's `.venv`. In front of it, one TCP relay per
//! store (`tests/support/tcp_meter.rs`) counts the bytes the store sends as they pass; each
//! store's destination names its relay (`?endpoint=`), so the bytes of every store are counted
//! apart, at the server side of its connections. The release binary's `serve` runs with
//! `[limits] bulk = "20000000"` and a `[[limits.schedule]]` window opening at the first minute
//! boundary at least 60 s after it starts (`bulk = "8000000"`); each of the 20 stores is
//! registered with `limits = ["bulk=4000000"]` (its own limit), all at once. 25 s after the
//! first byte, `SetLimits` sets the instance's base to 14 MB/s, live.
//!
//! Each store holds `THROTTLE_STORE_MB` (default 100) MB of 64 KiB values in 8 MiB WAL files:
//! its first backup is archives (`bulk`) and a short WAL tail (`wal`, never limited, counted
//! against `bulk`). One more store takes 100 commits/s from `store write --rate` (its segments
//! are `wal`), and its health's `lag_seconds` is read every 100 ms.
//!
//! The same run without any limit gives the WAL lag to compare with.
//!
//! # What it prints
//!
//! - every whole 10 s window in one regime (20, 14 and 8 MB/s; windows crossing a change by
//!   less than a second left out) while all 20 stores are still uploading: the bytes at the
//!   server over the limit, and each store's bytes over its fair share (the limit over 20, under
//!   its own 4 MB/s): issue 44 asks every window within ±5 %, each store within ±20 %;
//! - how long after `SetLimits` returned, and after the schedule's boundary, the rate at the
//!   server first held to the new limit (over the next second, within 10 %): asked within 1 s;
//! - the committing store's WAL lag, p50, p99 and max, with and without limits: asked p99 at
//!   most 1.1× the run without.
//!
//! `cargo bench --bench throttle`; `THROTTLE_STORES` (20), `THROTTLE_STORE_MB` (100),
//! `THROTTLE_RUNS` (`limited,free`).

#[path = "support/moto.rs"]
#[allow(dead_code)]
mod moto;
#[path = "support/serve.rs"]
mod serve;
#[path = "../tests/support/tcp_meter.rs"]
mod tcp_meter;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use mushroom_backup::service::proto::{self, HealthRequest, RegisterRequest};
use tcp_meter::{Relayed, TcpMeter};

const LIMIT: f64 = 20_000_000.0;
const STORE_LIMIT: f64 = 4_000_000.0;
const LIVE_LIMIT: f64 = 14_000_000.0;
const SCHEDULED_LIMIT: f64 = 8_000_000.0;
const BUCKET: &str = "throttle";

fn bin() -> PathBuf {
    std::env::var_os("MUSHROOM_BACKUP_BIN").map_or_else(
        || env!("CARGO_BIN_EXE_mushroom-backup").into(),
        PathBuf::from,
    )
}

/// `store write` into `dir`: `mb` MB of 64 KiB values in 8 MiB WAL files.
fn write_store(dir: &Path, mb: u64) -> anyhow::Result<()> {
    let commits = (mb * 1_000_000 / 65_536).to_string();
    let status = Command::new(bin())
        .args(["store", "write"])
        .arg(dir)
        .args(["--commits", &commits, "--value-size", "65536"])
        .args(["--rotate-bytes", &(8u64 << 20).to_string()])
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "store write {}", dir.display());
    Ok(())
}

/// The S3 endpoint and the variables `serve` needs for it; moto kept alive with it.
struct S3 {
    url: String,
    env: Vec<(&'static str, String)>,
    _moto: Option<moto::Moto>,
}

impl S3 {
    fn start(tmp: &Path) -> anyhow::Result<S3> {
        if let Ok(url) = std::env::var("THROTTLE_S3_ENDPOINT") {
            return Ok(S3 {
                url,
                env: Vec::new(),
                _moto: None,
            });
        }
        let m = moto::Moto::start(&tmp.join("moto.log"))?;
        let env = vec![
            ("AWS_ACCESS_KEY_ID", "test".to_string()),
            ("AWS_SECRET_ACCESS_KEY", "test".to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
        ];
        Ok(S3 {
            url: m.url.clone(),
            env,
            _moto: Some(m),
        })
    }

    async fn create_bucket(&self, name: &str) -> anyhow::Result<()> {
        use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
        let key = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(key("AWS_REGION", "us-east-1")))
            .credentials_provider(Credentials::new(
                key("AWS_ACCESS_KEY_ID", "test"),
                key("AWS_SECRET_ACCESS_KEY", "test"),
                None,
                None,
                "bench",
            ))
            .endpoint_url(&self.url)
            .force_path_style(true)
            .build();
        let made = aws_sdk_s3::Client::from_conf(conf)
            .create_bucket()
            .bucket(name)
            .send()
            .await;
        if let Err(e) = made {
            let text = format!("{e:?}");
            if !text.contains("BucketAlreadyOwnedByYou") && !text.contains("BucketAlreadyExists") {
                return Err(e).with_context(|| format!("create bucket {name}"));
            }
        }
        Ok(())
    }
}

/// What one run sampled.
struct Sampled {
    /// `(seconds since the first Register, bytes each store sent so far)`, every 100 ms.
    samples: Vec<(f64, Vec<u64>)>,
    /// The committing store's `lag_seconds`, every 100 ms.
    lags: Vec<f64>,
    /// When each change was made (seconds, as the samples), and the limit it set.
    changes: Vec<(f64, f64, &'static str)>,
    /// When the first store finished its first backup.
    first_done: f64,
}

/// `HH:MM` of the first minute boundary at least `ahead` from now (UTC), and how far it is.
fn boundary_after(ahead: Duration) -> (String, String, Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let at = (now + ahead).as_secs().div_ceil(60) * 60;
    let hm = |s: u64| format!("{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60);
    (hm(at), hm(at + 20 * 60), Duration::from_secs(at) - now)
}

async fn run(s3: &S3, limited: bool, stores: usize, mb: u64) -> anyhow::Result<Sampled> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("stores");
    std::fs::create_dir_all(&root)?;
    let dirs: Vec<PathBuf> = (0..stores).map(|i| root.join(format!("s{i:02}"))).collect();
    let started = Instant::now();
    std::thread::scope(|sc| {
        let handles: Vec<_> = dirs
            .iter()
            .map(|d| sc.spawn(|| write_store(d, mb)))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("writer thread"))
    })?;
    println!(
        "  {} stores of {mb} MB written in {:.1} s",
        stores,
        started.elapsed().as_secs_f64()
    );
    let committing = root.join("committing");
    write_store(&committing, 1)?;
    let mut meters = Vec::new();
    for _ in 0..=stores {
        meters.push(TcpMeter::start(&s3.url).await);
    }
    let run = if limited { "limited" } else { "free" };
    let mut config = String::new();
    let mut boundary = None;
    if limited {
        let (from, to, until) = boundary_after(Duration::from_secs(75));
        config = format!(
            "[limits]\nbulk = \"{LIMIT}\"\n\n[[limits.schedule]]\nfrom = \"{from}\"\nto = \"{to}\"\nbulk = \"{SCHEDULED_LIMIT}\"\n"
        );
        boundary = Some(Instant::now() + until);
    }
    let config_path = tmp.path().join("serve.toml");
    std::fs::write(&config_path, &config)?;
    let mut args = format!("--config {}", config_path.display());
    for m in &meters {
        args += &format!(" --allow-endpoint {}", m.url());
    }
    let data = tmp.path().join("data");
    let log = tmp.path().join("serve.log");
    let server = serve::Server::start_with_env(&data, &root, &log, &args, &s3.env)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))?
        .connect()
        .await?;
    let mut client = BackupControlClient::new(channel);
    // A bucket of its own for each store: stores in one bucket reached through several
    // endpoints (a relay each) would be one lease root seen as several.
    for i in 0..=stores {
        s3.create_bucket(&format!("{BUCKET}-{run}-{i}")).await?;
    }
    let url = |i: usize| {
        format!(
            "s3://{BUCKET}-{run}-{i}/store?endpoint={}&region=us-east-1",
            meters[i].url()
        )
    };
    // The committing store first, its writer on.
    let c = client
        .register(RegisterRequest {
            store_dir: committing.display().to_string(),
            destination: url(stores),
            ..RegisterRequest::default()
        })
        .await
        .context("Register the committing store")?
        .into_inner();
    let mut writer = Command::new(bin())
        .args(["store", "write"])
        .arg(&committing)
        .args([
            "--commits",
            "1000000",
            "--rate",
            "100",
            "--value-size",
            "256",
        ])
        .stdout(Stdio::null())
        .spawn()?;
    let lag_of = |h: &proto::HealthResponse| h.stores.first().map_or(0.0, |s| s.lag_seconds);
    let health = |client: &mut BackupControlClient<_>, id: String| {
        let mut client = client.clone();
        async move {
            client
                .health(HealthRequest {
                    store_id: id,
                    fresh: false,
                })
                .await
                .map(|r| r.into_inner())
        }
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The 20 stores at once.
    let t0 = Instant::now();
    let registered = futures::future::join_all((0..stores).map(|i| {
        let mut client = client.clone();
        let options = proto::StoreOptions {
            limits: match limited {
                true => vec![format!("bulk={STORE_LIMIT}")],
                false => Vec::new(),
            },
            ..Default::default()
        };
        let req = RegisterRequest {
            store_dir: dirs[i].display().to_string(),
            destination: url(i),
            options: Some(options),
            ..RegisterRequest::default()
        };
        async move { client.register(req).await.map(|r| r.into_inner().store_id) }
    }))
    .await;
    let ids: Vec<String> = registered.into_iter().collect::<Result<_, _>>()?;
    let counts: Vec<Arc<Relayed>> = meters.iter().map(TcpMeter::counts).collect();
    let base: Vec<u64> = counts
        .iter()
        .map(|c| c.up.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    let mut out = Sampled {
        samples: Vec::new(),
        lags: Vec::new(),
        changes: vec![(0.0, LIMIT, "start")],
        first_done: f64::MAX,
    };
    let mut live_done = !limited;
    let mut done_check = Instant::now();
    let mut first_byte: Option<f64> = None;
    loop {
        let t = t0.elapsed().as_secs_f64();
        let sent: Vec<u64> = counts
            .iter()
            .zip(&base)
            .map(|(c, b)| c.up.load(std::sync::atomic::Ordering::Relaxed) - b)
            .collect();
        if first_byte.is_none() && sent[..stores].iter().any(|b| *b > 0) {
            first_byte = Some(t);
        }
        out.samples.push((t, sent));
        if let Ok(h) = health(&mut client, c.store_id.clone()).await {
            out.lags.push(lag_of(&h));
        }
        if let Some(fb) = first_byte
            && !live_done
            && t >= fb + 25.0
        {
            client
                .set_limits(proto::SetLimitsRequest {
                    limits: vec![format!("bulk={LIVE_LIMIT}")],
                    ..Default::default()
                })
                .await
                .context("SetLimits")?;
            out.changes
                .push((t0.elapsed().as_secs_f64(), LIVE_LIMIT, "SetLimits"));
            live_done = true;
        }
        if let Some(b) = boundary
            && Instant::now() >= b
        {
            out.changes.push((
                b.duration_since(t0).as_secs_f64(),
                SCHEDULED_LIMIT,
                "schedule",
            ));
            boundary = None;
        }
        if done_check.elapsed() > Duration::from_secs(1) {
            done_check = Instant::now();
            let all = health(&mut client, String::new()).await?;
            let done = all
                .stores
                .iter()
                .filter(|s| ids.contains(&s.store_id) && s.restore_point_commit_seq > 0)
                .count();
            if done > 0 && out.first_done == f64::MAX {
                out.first_done = t;
            }
            if done == stores || t > 900.0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = writer.kill();
    let _ = writer.wait();
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let retried = text.lines().filter(|l| l.contains("retrying")).count();
    let timed_out = text.lines().filter(|l| l.contains("timed out")).count();
    println!("  serve's log: {retried} retries, {timed_out} lines saying a request timed out");
    Ok(out)
}

/// The bytes of stores `which` between samples `a` and `b`.
fn sent(s: &Sampled, a: usize, b: usize, which: impl Fn(usize) -> bool) -> u64 {
    let (x, y) = (&s.samples[a].1, &s.samples[b].1);
    (0..x.len())
        .filter(|i| which(*i))
        .map(|i| y[i] - x[i])
        .sum()
}

/// The sample nearest `t` seconds.
fn at(s: &Sampled, t: f64) -> usize {
    s.samples
        .iter()
        .position(|(x, _)| *x >= t)
        .unwrap_or(s.samples.len() - 1)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn report(s: &Sampled, stores: usize) -> (usize, usize) {
    let limit_at = |t: f64| {
        s.changes
            .iter()
            .filter(|(c, _, _)| *c <= t)
            .map(|(_, l, _)| *l)
            .next_back()
            .unwrap_or(LIMIT)
    };
    let first = s
        .samples
        .iter()
        .find(|(_, b)| b.iter().any(|x| *x > 0))
        .map_or(0.0, |(t, _)| *t);
    let (mut windows, mut held) = (0, 0);
    println!("  window (s)      limit MB/s  server MB/s  ratio  store share min..max");
    let mut t = first;
    while t + 10.0 <= s.first_done {
        let limit = limit_at(t);
        let crosses = s
            .changes
            .iter()
            .any(|(c, _, _)| *c > t - 1.0 && *c < t + 11.0 && *c > first);
        if crosses {
            t += 1.0;
            continue;
        }
        let (a, b) = (at(s, t), at(s, t + 10.0));
        let secs = s.samples[b].0 - s.samples[a].0;
        let total = sent(s, a, b, |_| true) as f64 / secs;
        let share = (limit / stores as f64).min(STORE_LIMIT);
        let shares: Vec<f64> = (0..stores)
            .map(|i| sent(s, a, b, |j| j == i) as f64 / secs / share)
            .collect();
        let (lo, hi) = (
            shares.iter().copied().fold(f64::MAX, f64::min),
            shares.iter().copied().fold(0.0, f64::max),
        );
        let ok = (total / limit - 1.0).abs() <= 0.05 && lo >= 0.8 && hi <= 1.2;
        windows += 1;
        held += usize::from(ok);
        println!(
            "  {:>5.1}-{:<6.1}  {:>10.1}  {:>11.2}  {:>5.3}  {lo:.2}..{hi:.2}{}",
            t,
            t + 10.0,
            limit / 1e6,
            total / 1e6,
            total / limit,
            if ok { "" } else { "  (outside)" }
        );
        t += 10.0;
    }
    for (c, limit, what) in s.changes.iter().skip(1) {
        // The first second after the change whose rate over the next second is within 10 %.
        let mut applied = None;
        let mut t = *c;
        while t + 1.0 <= s.first_done && t < c + 10.0 {
            let (a, b) = (at(s, t), at(s, t + 1.0));
            let secs = s.samples[b].0 - s.samples[a].0;
            let rate = sent(s, a, b, |_| true) as f64 / secs;
            if (rate / limit - 1.0).abs() <= 0.10 {
                applied = Some(t - c);
                break;
            }
            t += 0.1;
        }
        match applied {
            Some(d) => println!(
                "  {what} to {:.0} MB/s at {c:.1} s: held within {d:.1} s",
                limit / 1e6
            ),
            None => println!(
                "  {what} to {:.0} MB/s at {c:.1} s: not seen held (stores done at {:.1} s)",
                limit / 1e6,
                s.first_done
            ),
        }
    }
    (windows, held)
}

fn main() -> anyhow::Result<()> {
    let stores: usize = serve::env_or("THROTTLE_STORES", 20)?;
    let mb: u64 = serve::env_or("THROTTLE_STORE_MB", 100)?;
    let runs = std::env::var("THROTTLE_RUNS").unwrap_or_else(|_| "limited,free".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let tmp = tempfile::tempdir()?;
        let s3 = S3::start(tmp.path())?;
        let mut lags = Vec::new();
        for r in runs.split(',') {
            let limited = match r {
                "limited" => true,
                "free" => false,
                other => bail!("THROTTLE_RUNS: unknown run {other:?}"),
            };
            println!("run {r}: {stores} stores of {mb} MB, one committing 100 commits/s, at {}", s3.url);
            let s = run(&s3, limited, stores, mb).await?;
            if limited {
                let (windows, held) = report(&s, stores);
                println!("  {held} of {windows} windows within ±5 % with every store within ±20 % of its share");
            }
            let (p50, p99, max) = (
                percentile(&s.lags, 0.5),
                percentile(&s.lags, 0.99),
                s.lags.iter().copied().fold(0.0, f64::max),
            );
            println!("  WAL lag of the committing store: p50 {p50:.3} s, p99 {p99:.3} s, max {max:.3} s ({} samples)", s.lags.len());
            lags.push((r.to_string(), p99));
        }
        if let [(_, limited), (_, free)] = lags.as_slice() {
            println!("WAL lag p99 limited over free: {:.2} (asked at most 1.1)", limited / free.max(1e-9));
        }
        Ok(())
    })
}
