//! `Branch` over gRPC and `ctl branch`: a branch of a registered store's prefix at a commit,
//! optionally restored into a directory and registered as a store of its own (whose backups go
//! to the branch prefix); the store restored holds exactly the parent's state at the fork; bad
//! requests are refused with the code and field they deserve, and change nothing.

mod support;

use std::time::Duration;

use mushroom_backup::service::proto;
use support::binary::{command, json, run_ok, store_digest};
use support::store::{config, digest, fs_bucket, worker, write};
use tonic::Code;

type Client = proto::backup_control_client::BackupControlClient<tonic::transport::Channel>;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_over_grpc_is_restored_registered_and_backed_up_to_its_own_prefix() {
    let d = support::service::dirs();
    let parent_dir = d.root.join("parent");
    for _ in 0..2 {
        write(&parent_dir, 200, 150, 0);
        worker(&parent_dir, fs_bucket(&d.buckets.join("parent")), config())
            .run_once()
            .await
            .unwrap();
    }
    let parent_url = d.bucket("parent");
    let fork = 390;
    let expected = {
        let into = d.base.join("expected");
        let mut cmd = command("http://127.0.0.1:9");
        cmd.args([
            "restore",
            "--progress",
            "none",
            "--json",
            "--at",
            "390",
            "--from",
        ])
        .arg(&parent_url)
        .arg("--to")
        .arg(&into);
        run_ok("restore --at", cmd, T);
        store_digest(&into)
    };
    let server = support::service::Server::start(
        "serve",
        support::service::serve_command(&d, "a", None, &[]),
    );
    let mut c = server.client().await;
    let registered = c
        .register(proto::RegisterRequest {
            store_dir: d.store("parent"),
            destination: parent_url.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    let b = c
        .branch(proto::BranchRequest {
            store_id: registered.store_id.clone(),
            at_commit_seq: fork,
            destination: d.bucket("branch"),
            store_dir: d.store("branched"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.commit_seq, fork, "{b:?}");
    assert!(b.requests <= 10 && b.bytes_written <= 64 << 10, "{b:?}");
    assert!(!b.store_id.is_empty() && !b.node_token.is_empty(), "{b:?}");
    assert_eq!(b.holder, parent_url, "{b:?}");
    assert_eq!(store_digest(&d.root.join("branched")), expected);

    // The registered branch backs up into the branch prefix, never the parent's.
    let health = c
        .health(proto::HealthRequest {
            store_id: b.store_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let h = &health.stores[0];
    assert_eq!(h.destination, d.bucket("branch"), "{h:?}");
    let parent_generations = std::fs::read_dir(d.buckets.join("parent/gen"))
        .unwrap()
        .count();
    write(&d.root.join("branched"), 40, 0, 0);
    c.trigger(proto::TriggerRequest {
        store_id: b.store_id.clone(),
        kind: proto::TriggerKind::RestorePoint.into(),
    })
    .await
    .unwrap();
    let own = d.buckets.join("branch/gen");
    let deadline = std::time::Instant::now() + T;
    while !own.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        own.exists(),
        "the branch store wrote no generation into its prefix"
    );
    assert_eq!(
        std::fs::read_dir(d.buckets.join("parent/gen"))
            .unwrap()
            .count(),
        parent_generations,
        "the branch store wrote into its parent's prefix"
    );

    // Its health names the parent and the fork commit; the parent's names no branch.
    let deadline = std::time::Instant::now() + T;
    let branch_of = loop {
        let mut cmd = command("http://127.0.0.1:9");
        cmd.args(["ctl", "--server", &server.url(), "--json", "health"])
            .arg(&b.store_id);
        let out = json(&run_ok("ctl health", cmd, T));
        let of = out["stores"][0]["branch_of"].clone();
        if !of.is_null() || std::time::Instant::now() > deadline {
            break of;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(branch_of["parent"], parent_url.as_str(), "{branch_of}");
    assert_eq!(branch_of["commit_seq"], fork, "{branch_of}");
    assert_eq!(
        branch_of["parent_manifest"],
        b.parent_manifest.as_str(),
        "{branch_of}"
    );
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args(["ctl", "--server", &server.url(), "health"])
        .arg(&b.store_id);
    let text = run_ok("ctl health", cmd, T);
    assert!(
        text.contains(&format!("branch of {parent_url} at commit {fork}")),
        "{text}"
    );
    let parent_health = c
        .health(proto::HealthRequest {
            store_id: registered.store_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(parent_health.stores[0].branch_of, None);

    // `ctl branch` without a directory: the branch alone.
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args(["ctl", "--server", &server.url(), "--json", "branch"])
        .arg(&registered.store_id)
        .args(["--at", "395", "--destination", &d.bucket("branch-2")]);
    let out = json(&run_ok("ctl branch", cmd, T));
    assert_eq!(out["commit_seq"], 395, "{out}");
    assert_eq!(out["store_id"], "", "{out}");

    // Refusals.
    let refused = |req: proto::BranchRequest| {
        let mut c = c.clone();
        async move { c.branch(req).await.unwrap_err() }
    };
    let base = proto::BranchRequest {
        store_id: registered.store_id.clone(),
        destination: d.bucket("branch-3"),
        ..Default::default()
    };
    let s = refused(base.clone()).await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("at_commit_seq"), "{s:?}");
    let s = refused(proto::BranchRequest {
        at_commit_seq: fork,
        at_time: "2026-12-02T10:00:00Z".into(),
        ..base.clone()
    })
    .await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let s = refused(proto::BranchRequest {
        at_commit_seq: fork,
        destination: format!("{parent_url}/inner"),
        ..base.clone()
    })
    .await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("overlaps"), "{s:?}");
    let s = refused(proto::BranchRequest {
        at_commit_seq: 99_999,
        ..base.clone()
    })
    .await;
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains("reachable"), "{s:?}");
    let s = refused(proto::BranchRequest {
        store_id: "00000000-0000-4000-8000-000000000000".into(),
        at_commit_seq: fork,
        ..base.clone()
    })
    .await;
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    assert!(
        !d.buckets.join("branch-3").join("manifests").exists(),
        "a refused branch wrote a manifest"
    );
    server.terminate();
}

/// Cost: once the parent moves to a new generation and its retention drops the restore point a
/// branch was cut from, what only the branch keeps is charged to it: the parent's usage says
/// how much it keeps for branches, the registered branch's how much it is charged, and each
/// one's storage cost is priced on its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_only_a_branch_keeps_of_its_parent_is_charged_to_it() {
    let d = support::service::dirs();
    let parent_dir = d.root.join("parent");
    write(&parent_dir, 200, 150, 0);
    let parent_url = d.bucket("parent");
    let server = support::service::Server::start(
        "serve",
        support::service::serve_command(&d, "a", None, &[]),
    );
    let mut c = server.client().await;
    let registered = c
        .register(proto::RegisterRequest {
            store_dir: d.store("parent"),
            destination: parent_url.clone(),
            // The most aggressive retention: only the newest generation's restore points.
            options: Some(proto::StoreOptions {
                keep_for_ms: 1,
                keep_generations: 1,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let fork = digest(&parent_dir).commit_seq;
    let deadline = std::time::Instant::now() + T;
    let b = loop {
        match c
            .branch(proto::BranchRequest {
                store_id: registered.store_id.clone(),
                at_commit_seq: fork,
                destination: d.bucket("branch"),
                store_dir: d.store("branched"),
                ..Default::default()
            })
            .await
        {
            Ok(b) => break b.into_inner(),
            // Before the parent's first restore point.
            Err(s)
                if s.code() == Code::FailedPrecondition && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(s) => panic!("{s:?}"),
        }
    };
    assert_eq!(b.commit_seq, fork);

    // The parent moves on to a new generation; its retention drops the branch's restore point.
    write(&parent_dir, 200, 150, 0);
    for kind in [
        proto::TriggerKind::RestorePoint,
        proto::TriggerKind::Retention,
    ] {
        c.trigger(proto::TriggerRequest {
            store_id: registered.store_id.clone(),
            kind: kind.into(),
        })
        .await
        .unwrap();
    }
    let deadline = std::time::Instant::now() + T;
    let (held, charged) = loop {
        let held = usage(&mut c, &registered.store_id).await;
        let charged = usage(&mut c, &b.store_id).await;
        if (held.held_for_branches_bytes > 0 && charged.pinned_in_parent_bytes > 0)
            || std::time::Instant::now() > deadline
        {
            break (held, charged);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // One branch: all the parent keeps only for branches is charged to it.
    assert!(held.held_for_branches_bytes > 0, "{held:?}");
    assert_eq!(
        charged.pinned_in_parent_bytes, held.held_for_branches_bytes,
        "{charged:?} of {held:?}"
    );
    let billed = |u: &proto::Usage, bytes: i64| {
        let gb = bytes as f64 / (1u64 << 30) as f64;
        (u.storage_monthly_cost_usd - gb * 0.023).abs() < 1e-9
    };
    assert!(
        billed(
            &held,
            held.bytes_stored as i64 - held.held_for_branches_bytes as i64
        ),
        "{held:?}"
    );
    assert!(
        billed(
            &charged,
            (charged.bytes_stored + charged.pinned_in_parent_bytes) as i64
        ),
        "{charged:?}"
    );
    // `ctl cost` says it.
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args(["ctl", "--server", &server.url(), "cost"]);
    let text = run_ok("ctl cost", cmd, T);
    assert!(text.contains("kept only for branches"), "{text}");
    assert!(text.contains("kept only for this branch"), "{text}");
    server.terminate();
}

/// A store's usage, as its health shows it.
async fn usage(c: &mut Client, store_id: &str) -> proto::Usage {
    let health = c
        .health(proto::HealthRequest {
            store_id: store_id.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    health.stores[0].usage.expect("a local store's usage")
}
