//! A `serve` killed with SIGKILL and started again on its data directory resumes shipping for
//! every store at once, not a lease TTL later: its data-directory lock proves the killed
//! process dead, so the restart takes its instance claim, its instance lease and every store
//! lease under it at once (`lease::instance`, `instance_lock`). The lease TTL here is ten
//! minutes: a restart that waited out the leases of the killed process would miss the
//! deadline by far.

mod support;

use std::time::{Duration, Instant};

use mushroom_backup::service::proto;
use support::served::{self, Client, Dirs};

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

async fn wait_shipped(c: &Client, id: &str, commits: u64) -> proto::StoreHealth {
    served::wait_health(
        c,
        id,
        &format!("healthy with {commits} commits shipped"),
        |h| h.healthy && h.shipped_commit_seq == commits,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_serve_restarted_resumes_every_store_at_once_not_a_lease_ttl_later() {
    let d = served::dirs();
    let (mut first, addr) = served::start("serve (to be killed)", serve(&d));
    let c = served::client(addr).await;
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
        assert_eq!(support::store::commit_more(dir, 5), 25);
    }
    let restarted = Instant::now();
    let (_second, addr) = served::start("serve (restarted)", serve(&d));
    let c = served::client(addr).await;
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
