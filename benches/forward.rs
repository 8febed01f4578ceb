//! The cost of forwarding (issue 15): the same call made directly to a store's owner and
//! through another instance that forwards it (`src/service/forward.rs`), on the same machine
//! in the same run.
//!
//! Two release `serve` instances, `a` and `b`, share one registry (a SQLite file both open, or
//! the PostgreSQL of `FORWARD_REGISTRY=postgres://…`, e.g. `bash scripts/postgres.sh start`).
//! One store is registered on `a`. The call is `Health { store_id, fresh: true }`: on `a` it is
//! answered from the worker's state; on `b` it is forwarded to `a` (a registry lookup of the
//! store's owner and of the owner's address, then the gRPC hop).
//!
//! It prints, for direct and forwarded calls:
//! - latency of sequential calls (`FORWARD_CALLS`, default 2000, in alternating blocks of 250):
//!   median, p90, p99, and what the hop adds at the median;
//! - throughput with `FORWARD_CONCURRENCY` (default 16) callers for `FORWARD_SECS` (default 3)
//!   seconds each, alternating twice: calls per second and the ratio forwarded / direct.
//!
//! `cargo bench --bench forward`. Nothing is asserted: the figures go in the README.

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

    let start = |id: &str| {
        serve::Server::start(
            &base.join(format!("data-{id}")),
            &root,
            &base.join(format!("serve-{id}.log")),
            &format!("--registry {registry} --instance-id {id}"),
        )
    };
    let a = start("a")?;
    let b = start("b")?;
    let mut ca = connect(&a.addr).await?;
    let mut cb = connect(&b.addr).await?;
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
    }

    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    let block = 250;
    while direct.len() < calls {
        for (c, out) in [(&mut ca, &mut direct), (&mut cb, &mut forwarded)] {
            for _ in 0..block {
                let t = Instant::now();
                call(c, &id).await?;
                out.push(t.elapsed());
            }
        }
    }
    direct.sort();
    forwarded.sort();
    println!(
        "forwarding, {} sequential Health(fresh) calls each ({registry_kind} registry)",
        direct.len(),
        registry_kind = if registry.starts_with("postgres") {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    println!("| | median | p90 | p99 |\n| --- | ---: | ---: | ---: |");
    for (name, d) in [("direct to the owner", &direct), ("through b", &forwarded)] {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.3} ms |",
            ms(percentile(d, 0.5)),
            ms(percentile(d, 0.9)),
            ms(percentile(d, 0.99))
        );
    }
    println!(
        "the hop adds {:.3} ms at the median",
        ms(percentile(&forwarded, 0.5)) - ms(percentile(&direct, 0.5))
    );

    let (mut td, mut tf) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        td.push(throughput(&a.addr, &id, concurrency, secs).await?);
        tf.push(throughput(&b.addr, &id, concurrency, secs).await?);
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "throughput, {concurrency} callers: direct {:.0} calls/s, through b {:.0} calls/s \
         (ratio {:.2}); runs: direct {td:.0?}, through b {tf:.0?}",
        avg(&td),
        avg(&tf),
        avg(&tf) / avg(&td)
    );
    drop((a, b));
    Ok(())
}
