//! What opening many S3 buckets costs, with one S3 client per bucket (each open loads the AWS
//! configuration and builds its own client, as every store's open did before
//! `bucket::s3::Clients`) and with one client shared through a `bucket::Opener` (as the
//! service's fleet opens its stores now).
//!
//! Each way runs in a child process of its own (so one's allocations do not hide the other's):
//! it opens `OPEN_BUCKETS` (default 10,000) destinations `s3://fleet/store-N` read-write,
//! holds them all, and reports the wall time of the opens and the growth of its resident
//! memory (`VmRSS`) over them. Nothing is sent: a read-write open of an S3 destination makes
//! no request, and the credentials are static (`AWS_ACCESS_KEY_ID`…, set for the children with
//! an endpoint on a closed port and the instance metadata lookup off).
//!
//! `cargo bench --bench open`.

use std::process::{Command, ExitCode};
use std::time::Instant;

use mushroom_backup::bucket::{DynBucket, Open, Opener};
use tokio_util::sync::CancellationToken;

const MODE_ENV: &str = "OPEN_BENCH_MODE";

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The child: opens `n` buckets one way, prints one line of figures.
fn child(mode: &str, n: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cancel = CancellationToken::new();
        let opener = Opener::new(cancel.clone());
        let urls: Vec<String> = (0..n).map(|i| format!("s3://fleet/store-{i:05}")).collect();
        let before = rss_mib();
        let t = Instant::now();
        let mut held: Vec<DynBucket> = Vec::with_capacity(n);
        for url in &urls {
            held.push(match mode {
                "shared" => opener.read_write(url).open().await?,
                _ => Open::read_write(url, &cancel).open().await?,
            });
        }
        let took = t.elapsed();
        let grown = rss_mib() - before;
        println!(
            "{mode:<8} {n:>6} buckets: opened in {:>8.1} ms ({:>7.1} µs each), resident memory +{:>7.1} MiB ({:>6.1} KiB each)",
            took.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e6 / n as f64,
            grown,
            grown * 1024.0 / n as f64,
        );
        drop(held);
        anyhow::Ok(())
    })
}

fn main() -> ExitCode {
    let n: usize = std::env::var("OPEN_BUCKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    if let Ok(mode) = std::env::var(MODE_ENV) {
        return match child(&mode, n) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("open ({mode}): {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let me = std::env::current_exe().expect("the bench's own path");
    for mode in ["own", "shared"] {
        let status = Command::new(&me)
            .env(MODE_ENV, mode)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
            .env("AWS_CONFIG_FILE", "/nonexistent")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE")
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("open: the {mode} run failed");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
