//! Branches on real S3 servers (moto and SeaweedFS), in every mode a parent can have: plain,
//! compressed (zstd), encrypted and compressed. A branch of each restores byte-identical to
//! `restore --at` of the parent at its fork (an encrypted branch with the parent's key, and
//! refused without it, naming the key), for at most 10 requests and 64 KiB written; its pin is
//! in the parent's prefix; a branch of a replica destination (`backup --replica`) restores like
//! one of the primary; a branch into another bucket is refused, the parent unchanged.

mod support;

use std::path::Path;
use std::time::Duration;

use support::binary::{command, json, run_ok, store_digest};
use support::s3_servers::S3Server;

const T: Duration = Duration::from_secs(120);

fn run(server: &S3Server, name: &str, args: &[&str]) -> serde_json::Value {
    let mut cmd = command(&server.endpoint);
    cmd.args(args);
    json(&run_ok(name, cmd, T))
}

fn backup(server: &S3Server, store: &Path, to: &str, mode: &[&str]) {
    let mut args = vec![
        "backup",
        "--once",
        "--store",
        store.to_str().unwrap(),
        "--to",
        to,
    ];
    args.extend_from_slice(mode);
    let mut cmd = command(&server.endpoint);
    cmd.args(&args);
    run_ok("backup --once", cmd, T);
}

fn restore(server: &S3Server, from: &str, into: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["restore", "--json", "--progress", "none", "--from", from];
    args.extend_from_slice(extra);
    let mut cmd = command(&server.endpoint);
    cmd.args(&args).arg("--to").arg(into);
    run_ok("restore", cmd, T);
    store_digest(into)
}

fn write(store: &Path, commits: u64) {
    support::binary::write_store(store, commits);
}

async fn branches_in_every_mode(server: &S3Server) {
    let t = tempfile::tempdir().unwrap();
    let bucket = server.create_bucket("branch-modes").await;
    let key = t.path().join("backup.key");
    let mut cmd = command(&server.endpoint);
    cmd.args(["key", "new"]);
    std::fs::write(&key, run_ok("key new", cmd, T)).unwrap();
    let key = key.to_str().unwrap().to_string();
    let modes: [(&str, Vec<&str>); 3] = [
        ("plain", vec![]),
        ("zstd", vec!["--compression", "zstd"]),
        (
            "sealed",
            vec!["--compression", "zstd", "--encryption-key-file", &key],
        ),
    ];
    for (name, mode) in &modes {
        let store = t.path().join(format!("store-{name}"));
        let parent = format!("s3://{bucket}/{name}/parent");
        write(&store, 400);
        backup(server, &store, &parent, mode);
        write(&store, 300);
        backup(server, &store, &parent, mode);
        let keys: Vec<&str> = mode
            .iter()
            .position(|a| *a == "--encryption-key-file")
            .map_or(vec![], |i| mode[i..i + 2].to_vec());
        for (i, at) in [350u64, 555, 700].iter().enumerate() {
            let expected = restore(
                server,
                &parent,
                &t.path().join(format!("{name}-expected-{i}")),
                &[&["--at", &at.to_string()][..], &keys].concat(),
            );
            let branch = format!("s3://{bucket}/{name}/branch-{i}");
            let mut args = vec!["branch", "--json", "--from", &parent, "--to", &branch];
            let at_s = at.to_string();
            args.extend_from_slice(&["--at", &at_s]);
            let report = run(server, "branch", &args);
            assert_eq!(report["commit_seq"], *at, "{name}: {report}");
            assert!(
                report["requests"].as_u64().unwrap() <= 10,
                "{name}: {report}"
            );
            assert!(
                report["bytes_written"].as_u64().unwrap() <= 64 << 10,
                "{name}: {report}"
            );
            let got = restore(
                server,
                &branch,
                &t.path().join(format!("{name}-{i}")),
                &keys,
            );
            assert_eq!(got, expected, "{name}: branch at {at}");
            if !keys.is_empty() {
                let mut cmd = command(&server.endpoint);
                cmd.args(["restore", "--progress", "none", "--from", &branch, "--to"])
                    .arg(t.path().join(format!("{name}-nokey-{i}")));
                let out = cmd.output().unwrap();
                assert!(
                    !out.status.success(),
                    "{name}: an encrypted branch restored without a key"
                );
                let e = String::from_utf8_lossy(&out.stderr);
                assert!(e.contains("key"), "{name}: the refusal names no key: {e}");
            }
        }
        // The pins are in the parent's prefix.
        let listed = server
            .client()
            .list_objects_v2()
            .bucket(&bucket)
            .prefix(format!("{name}/parent/pins/"))
            .send()
            .await
            .unwrap();
        assert_eq!(listed.key_count(), Some(3), "{name}: {listed:?}");
    }
    // A replica destination (`backup --replica`): a branch of the replica's prefix is a branch
    // of the same history, pinned in the replica, restoring byte-identical to the primary at
    // the fork.
    let replica_bucket = server.create_bucket("branch-replica").await;
    let store = t.path().join("store-replicated");
    let primary = format!("s3://{bucket}/replicated/parent");
    let replica = format!("s3://{replica_bucket}/parent");
    for commits in [400, 300] {
        write(&store, commits);
        backup(server, &store, &primary, &["--replica", &replica]);
    }
    let expected = restore(
        server,
        &primary,
        &t.path().join("replicated-expected"),
        &["--at", "555"],
    );
    let branch = format!("s3://{replica_bucket}/branch");
    let report = run(
        server,
        "branch of the replica",
        &[
            "branch", "--json", "--from", &replica, "--to", &branch, "--at", "555",
        ],
    );
    assert_eq!(report["holder"], replica.as_str(), "{report}");
    assert!(report["requests"].as_u64().unwrap() <= 10, "{report}");
    let got = restore(server, &branch, &t.path().join("replicated-branch"), &[]);
    assert_eq!(got, expected, "a branch of the replica at 555");
    let listed = server
        .client()
        .list_objects_v2()
        .bucket(&replica_bucket)
        .prefix("parent/pins/")
        .send()
        .await
        .unwrap();
    assert_eq!(listed.key_count(), Some(1), "{listed:?}");

    // Another bucket is refused, and changes nothing.
    let other = server.create_bucket("branch-other").await;
    let mut cmd = command(&server.endpoint);
    cmd.args([
        "branch",
        "--from",
        &format!("s3://{bucket}/plain/parent"),
        "--at",
        "350",
        "--to",
        &format!("s3://{other}/branch"),
    ]);
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("another bucket"), "{e}");
}

on_each_s3_server!(
    #[tokio::test]
    async fn branches_in_every_mode
);
