//! The cost of forwarding (issue 15): the same call made directly to a store's owner and
//! through another instance that forwards it (`src/service/forward.rs`), on the same machine
//! in the same run.
//!
//! Three release `serve` instances, `a`, `b` and `c`, share one registry (a SQLite file they
//! all open, or the PostgreSQL of `FORWARD_REGISTRY=postgres://…`, e.g. `bash
//! scripts/postgres.sh start`). One store is registered on `a`. The call is `Health {
//! store_id, fresh: true }`: on `a` it is answered from the worker's state; on `b` it is
//! forwarded to `a` (the owner as the owner cache remembers it, then the gRPC hop); on `c`,
//! started with `--owner-cache-ms 0`, it is forwarded after a registry read of the owner and
//! its address for every call (forwarding before the owner cache).
//!
//! It prints, for direct calls and calls through `b` and through `c`:
//! - latency of sequential calls (`FORWARD_CALLS`, default 2000, in alternating blocks of 250):
//!   median, p90, p99, and what the hop adds at the median;
//! - throughput with `FORWARD_CONCURRENCY` (default 16) callers for `FORWARD_SECS` (default 3)
//!   seconds each, alternating twice: calls per second and the ratio to direct.
//!
//! `cargo bench --bench forward`. Nothing is asserted: the figures go in docs/testing.md.

#[path = "support/serve.rs"]
mod serve;

use std::time::{Duration, Instant};

use anyhow::Context;
use tonic::transport::Channel;

use mushroom_backup::service::proto::backup_control_client::BackupControlClient;
use mushroom_backup::service::proto::{HealthRequest, RegisterRequest};

type Client = BackupControlClient<Channel>;

async fn connect(addr: &str) -> anyhow::Result<Client> {
    Ok(BackupControlClient::connect(format!("http://{addr}")).await?)
}

async fn call(c: &mut Client, id: &str) -> anyhow::Result<()> {
    let h = c
        .health(HealthRequest {
            store_id: id.to_string(),
            fresh: true,
        })
        .await?
        .into_inner();
    anyhow::ensure!(h.stores.len() == 1, "Health answered {h:?}");
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Calls per second of `concurrency` callers on `addr` for `secs`.
async fn throughput(addr: &str, id: &str, concurrency: usize, secs: f64) -> anyhow::Result<f64> {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let mut c = connect(addr).await?;
        let id = id.to_string();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                call(&mut c, &id).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / secs)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let calls: usize = serve::env_or("FORWARD_CALLS", 2000)?;
    let concurrency: usize = serve::env_or("FORWARD_CONCURRENCY", 16)?;
    let secs: f64 = serve::env_or("FORWARD_SECS", 3.0)?;
    let tmp = tempfile::tempdir()?;
    let base = tmp.path().canonicalize()?;
    let root = base.join("stores");
    std::fs::create_dir_all(&root)?;
    let registry = std::env::var("FORWARD_REGISTRY")
        .unwrap_or_else(|_| format!("sqlite://{}", base.join("registry.db").display()));

    let store = root.join("s");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
        .args(["store", "write"])
        .arg(&store)
        .args(["--commits", "20"])
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "store write failed");

    let start = |id: &str, extra: &str| {
        serve::Server::start(
            &base.join(format!("data-{id}")),
            &root,
            &base.join(format!("serve-{id}.log")),
            &format!("--registry {registry} --instance-id {id} {extra}"),
        )
    };
    let a = start("a", "")?;
    // b remembers the store's owner (the default, 1 s); c reads the registry for every call
    // (`--owner-cache-ms 0`: what forwarding did before the owner cache).
    let b = start("b", "")?;
    let c = start("c", "--owner-cache-ms 0")?;
    let mut ca = connect(&a.addr).await?;
    let mut cb = connect(&b.addr).await?;
    let mut cc = connect(&c.addr).await?;
    let id = ca
        .register(RegisterRequest {
            store_dir: store.display().to_string(),
            destination: format!("file://{}", base.join("bucket").display()),
            ..Default::default()
        })
        .await
        .context("Register on a")?
        .into_inner()
        .store_id;
    for _ in 0..200 {
        call(&mut ca, &id).await?;
        call(&mut cb, &id).await?;
        call(&mut cc, &id).await?;
    }

    let names = [
        "direct to the owner",
        "through b (owner cache)",
        "through c (no cache)",
    ];
    let mut lat: [Vec<Duration>; 3] = Default::default();
    let block = 250;
    while lat[0].len() < calls {
        for (c, out) in [&mut ca, &mut cb, &mut cc].into_iter().zip(lat.iter_mut()) {
            for _ in 0..block {
                let t = Instant::now();
                call(c, &id).await?;
                out.push(t.elapsed());
            }
        }
    }
    for l in &mut lat {
        l.sort();
    }
    println!(
        "forwarding, {} sequential Health(fresh) calls each ({registry_kind} registry)",
        lat[0].len(),
        registry_kind = if registry.starts_with("postgres") {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    println!("| | median | p90 | p99 |\n| --- | ---: | ---: | ---: |");
    for (name, d) in names.iter().zip(&lat) {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.3} ms |",
            ms(percentile(d, 0.5)),
            ms(percentile(d, 0.9)),
            ms(percentile(d, 0.99))
        );
    }
    let median = |i: usize| ms(percentile(&lat[i], 0.5));
    println!(
        "the hop adds {:.3} ms at the median with the owner cache, {:.3} ms without",
        median(1) - median(0),
        median(2) - median(0)
    );

    let mut runs: [Vec<f64>; 3] = Default::default();
    for _ in 0..2 {
        for (addr, out) in [&a.addr, &b.addr, &c.addr].into_iter().zip(runs.iter_mut()) {
            out.push(throughput(addr, &id, concurrency, secs).await?);
        }
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("throughput, {concurrency} callers:");
    for (name, r) in names.iter().zip(&runs) {
        println!(
            "  {name}: {:.0} calls/s (ratio to direct {:.2}); runs {r:.0?}",
            avg(r),
            avg(r) / avg(&runs[0])
        );
    }
    drop((a, b, c));
    Ok(())
}
