//! A `serve` killed with SIGKILL and started again on its data directory resumes shipping for
//! every store at once, not a lease TTL later: its data-directory lock proves the killed
//! process dead, so the restart takes its instance claim, its instance lease and every store
//! lease under it at once (`lease::instance`, `instance_lock`). The lease TTL here is ten
//! minutes: a restart that waited out the leases of the killed process would miss the
//! deadline by far.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::store::engine::{Engine, EngineOptions};
use support::served::{self, DEADLINE, Dirs};
use tonic::transport::Channel;

type Client = BackupControlClient<Channel>;

const STORES: usize = 4;
const TTL_MS: &str = "600000";

fn serve(d: &Dirs) -> std::process::Command {
    let mut cmd = served::command(d);
    cmd.args([
        "--lease-ttl-ms",
        TTL_MS,
        "--wal-interval-ms",
        "50",
        "--restore-point-interval-ms",
        "3600000",
    ]);
    cmd
}

async fn client(addr: std::net::SocketAddr) -> Client {
    BackupControlClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

async fn wait_shipped(c: &Client, id: &str, commits: u64) -> proto::StoreHealth {
    support::wait_for(
        DEADLINE,
        &format!("store {id} healthy with {commits} commits shipped"),
        || {
            let mut c = c.clone();
            async move {
                let r = c
                    .health(proto::HealthRequest {
                        store_id: id.into(),
                        fresh: false,
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                let h = r.stores.into_iter().next().ok_or("no store")?;
                if h.healthy && h.shipped_commit_seq == commits {
                    Ok(h)
                } else {
                    Err(format!("{h:?}"))
                }
            }
        },
    )
    .await
}

fn commit_more(dir: &Path, n: u64) -> u64 {
    let mut engine = Engine::open(
        dir,
        EngineOptions {
            group_commit: 0,
            ..Default::default()
        },
    )
    .expect("open the store");
    support::store::commit_synced(&mut engine, n);
    engine.commit_seq()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_serve_restarted_resumes_every_store_at_once_not_a_lease_ttl_later() {
    let d = served::dirs();
    let (mut first, addr) = served::start("serve (to be killed)", serve(&d));
    let c = client(addr).await;
    let mut stores = Vec::new();
    for i in 0..STORES {
        let dir = d.root.join(format!("store-{i}"));
        support::store::write(&dir, 20, 0, 0);
        let id = c
            .clone()
            .register(support::register_req(
                &dir,
                &support::file_url(&d.base.join("buckets").join(format!("b{i}"))),
            ))
            .await
            .expect("Register")
            .into_inner()
            .store_id;
        stores.push((dir, id));
    }
    let mut holders = Vec::new();
    for (_, id) in &stores {
        holders.push(wait_shipped(&c, id, 20).await.lease_holder);
    }
    first.kill();

    for (dir, _) in &stores {
        assert_eq!(commit_more(dir, 5), 25);
    }
    let restarted = Instant::now();
    let (_second, addr) = served::start("serve (restarted)", serve(&d));
    let c = client(addr).await;
    for ((_, id), before) in stores.iter().zip(&holders) {
        let h = wait_shipped(&c, id, 25).await;
        assert_ne!(
            &h.lease_holder, before,
            "the same worker id after a restart"
        );
    }
    let took = restarted.elapsed();
    eprintln!("every store shipped again {took:?} after the restart");
    assert!(
        took < Duration::from_millis(600_000) / 4,
        "resumed only after {took:?}: the restart waited for the killed process's leases"
    );
}
