//! The node client's example engine (`crates/node-client/examples/engine.rs`) built and run
//! against the real service: `serve` on loopback, the store registered, the engine commits and
//! reports, and the service's health shows those commits durable and shipped; then the service
//! goes away, the engine sees its stream lost, and still shuts down cleanly.
//!
//! The engine holds `store.lock` while it runs and writes no `wal.position`, so while it runs
//! the service learns its position from the node client's stream alone (a locked store's
//! files say nothing of what is fsynced, DESIGN.md section 3).

use std::process::Command;

use mushroom_backup::service::proto;
use support::binary::{Running, Stream};
use support::serve::{self, DEADLINE, Serve};

mod support;

const COMMITS: u64 = 7;

/// Builds the example (with the workspace's default members, as the test build did: nothing
/// to do when it is fresh) and returns its executable.
fn build_example() -> std::path::PathBuf {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--offline", "--example", "engine"])
        .args(["--message-format", "json-render-diagnostics"])
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --example engine failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "engine")
        .find_map(|m| m["executable"].as_str().map(std::path::PathBuf::from))
        .expect("cargo named the example's executable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_engine_reports_its_commits_to_the_service() {
    let engine = tokio::task::block_in_place(build_example);
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = std::fs::canonicalize(tmp.path()).expect("canonical temp dir");
    let (root, bucket) = (base.join("stores"), base.join("bucket"));
    let store = root.join("engine");
    std::fs::create_dir_all(&store).unwrap();

    let server = Serve::start("serve", serve::command(&base.join("data"), &root, &[]));
    let mut c = server.client().await;
    let reg = c
        .register(support::register_req(&store, &support::file_url(&bucket)))
        .await
        .expect("Register")
        .into_inner();

    let mut cmd = Command::new(&engine);
    cmd.arg(server.url())
        .arg(&reg.store_id)
        .arg(&store)
        .arg(COMMITS.to_string())
        .env("MUSHROOM_NODE_TOKEN", &reg.node_token);
    let mut node = Running::spawn("engine", cmd);
    let flushed = format!("flushed {COMMITS}");
    tokio::task::block_in_place(|| {
        node.wait_for("the engine to flush its commits", DEADLINE, |l| {
            (l.stream == Stream::Stdout && l.text == flushed).then_some(())
        })
    });

    // The engine is still running (store.lock held): what health shows came on its stream.
    support::wait_for(
        DEADLINE,
        &format!("store {} healthy with {COMMITS} shipped", reg.store_id),
        || {
            let mut c = c.clone();
            let id = reg.store_id.clone();
            async move {
                let r = c
                    .health(proto::HealthRequest {
                        store_id: id,
                        fresh: false,
                    })
                    .await
                    .map_err(|s| format!("Health: {s}"))?
                    .into_inner();
                match r.stores.as_slice() {
                    [h] if h.healthy
                        && h.durable_commit_seq == COMMITS
                        && h.shipped_commit_seq == COMMITS =>
                    {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;

    // The service goes away: the engine sees its stream lost and keeps running.
    drop(c);
    server.terminate();
    tokio::task::block_in_place(|| {
        node.wait_for("the engine to see its stream lost", DEADLINE, |l| {
            (l.stream == Stream::Stderr && l.text.starts_with("backup stream: lost")).then_some(())
        })
    });

    // SIGTERM: the engine closes the client (nothing to wait for with the service gone) and
    // exits cleanly.
    node.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| node.wait_exit(DEADLINE));
    assert!(
        status.success(),
        "the engine exited with {status}:\n{}",
        node.output()
    );
    assert!(
        node.stdout()
            .lines()
            .any(|l| l == format!("closed {COMMITS}")),
        "the engine did not close cleanly:\n{}",
        node.output()
    );
}
