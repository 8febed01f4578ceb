//! Compression end to end, through the binary, over `file://` and S3 (moto): a `text` store
//! stores at most half its bytes in the bucket, a `random` store costs at most 1% over its
//! size; compressed backups restore to the store's digest, also across a switch of
//! `--compression` within one prefix; a corrupted compressed object fails restore and
//! verify naming it and leaves no target; the flags are checked.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::binary::{
    backup_once, command, json, restore_digest, run_ok, store_digest, verify_ok,
};
use support::dest::{NO_S3, destinations};

fn write(store: &Path, commits: u64, kind: &str) {
    let mut cmd = command(NO_S3);
    cmd.args(["store", "write"])
        .arg(store)
        .args(["--commits", &commits.to_string(), "--value-size", "1024"])
        .args(["--value-kind", kind, "--snapshot-every", "8000"])
        .args(["--rotate-bytes", "4194304", "--seed", "5"]);
    run_ok("store write", cmd, Duration::from_secs(300));
}

fn backup(endpoint: &str, store: &Path, to: &str, extra: &[&str]) -> serde_json::Value {
    let cmd = backup_once(endpoint, store, to, extra);
    json(&run_ok("backup", cmd, Duration::from_secs(300)))
}

/// Bytes of the store's files (what a backup must hold).
fn store_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        if m.is_dir() {
            n += store_bytes(&e.path());
        } else {
            n += m.len();
        }
    }
    n
}

#[test]
fn a_text_store_stores_at_most_half_its_bytes_and_restores() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("text");
    write(&store, 20_000, "text");
    let size = store_bytes(&store);
    let want = store_digest(&store);
    for (i, dest) in destinations(t.path(), "text").into_iter().enumerate() {
        let summary = backup(dest.endpoint(), &store, &dest.url(), &[]);
        let stored = dest.bytes();
        println!(
            "text store {size} bytes; bucket {stored} bytes ({:.1}%); summary {summary}",
            100.0 * stored as f64 / size as f64
        );
        assert!(
            stored * 2 <= size,
            "{}: the bucket holds {stored} bytes of a {size}-byte text store",
            dest.url()
        );
        let (s, l) = (
            summary["bytes_stored"].as_u64().unwrap(),
            summary["bytes_logical"].as_u64().unwrap(),
        );
        assert!(s * 2 <= l, "summary: stored {s} of logical {l}");
        verify_ok(dest.endpoint(), &dest.url(), "text store");
        let into = t.path().join(format!("restored-{i}"));
        assert_eq!(restore_digest(dest.endpoint(), &dest.url(), &into), want);
    }
}

#[test]
fn a_random_store_costs_at_most_one_percent_over_its_size() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("random");
    write(&store, 20_000, "random");
    let size = store_bytes(&store);
    let want = store_digest(&store);
    for (i, dest) in destinations(t.path(), "random").into_iter().enumerate() {
        backup(dest.endpoint(), &store, &dest.url(), &[]);
        let stored = dest.bytes();
        println!(
            "random store {size} bytes; bucket {stored} bytes ({:+.2}%)",
            100.0 * (stored as f64 - size as f64) / size as f64
        );
        assert!(
            stored * 100 <= size * 101,
            "{}: the bucket holds {stored} bytes of a {size}-byte random store",
            dest.url()
        );
        let into = t.path().join(format!("restored-{i}"));
        assert_eq!(restore_digest(dest.endpoint(), &dest.url(), &into), want);
    }
}

/// Every object entry of every manifest in a `file://` bucket.
fn entries(bucket: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(bucket.join("manifests")).unwrap() {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap();
        if !m["snapshot"].is_null() {
            out.push(m["snapshot"].clone());
        }
        for list in ["archives", "segments", "side_files"] {
            out.extend(m[list].as_array().unwrap().iter().cloned());
        }
    }
    out
}

#[test]
fn a_prefix_mixing_codecs_restores() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let url = format!("file://{}", bucket.display());
    write(&store, 5000, "text");
    backup(NO_S3, &store, &url, &["--compression", "none"]);
    let first = store_digest(&store);
    // A snapshot at 8000 starts a new generation; its objects go up compressed.
    write(&store, 5000, "text");
    backup(NO_S3, &store, &url, &["--compression-level", "5"]);
    let all = entries(&bucket);
    let zstd = all.iter().filter(|e| e["codec"] == "zstd").count();
    let raw = all.iter().filter(|e| e["codec"].is_null()).count();
    assert!(
        zstd > 0 && raw > 0,
        "codecs: {zstd} zstd, {raw} raw entries"
    );
    verify_ok(NO_S3, &url, "mixed codecs");
    assert_eq!(
        restore_digest(NO_S3, &url, &t.path().join("r1")),
        store_digest(&store)
    );
    // The restore point of the raw generation restores too.
    let mut cmd = command(NO_S3);
    cmd.args(["restore", "--from", &url, "--at", "5000", "--to"])
        .arg(t.path().join("r0"));
    run_ok("restore --at", cmd, Duration::from_secs(60));
    assert_eq!(store_digest(&t.path().join("r0")), first);
}

#[test]
fn a_corrupted_compressed_object_fails_restore_and_verify_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let url = format!("file://{}", bucket.display());
    write(&store, 9000, "text");
    backup(NO_S3, &store, &url, &[]);
    let snapshot = entries(&bucket)
        .into_iter()
        .find(|e| e["codec"] == "zstd" && e["key"].as_str().unwrap().ends_with("snapshot.bin"))
        .expect("a compressed snapshot");
    let key = snapshot["key"].as_str().unwrap().to_string();
    let path = bucket.join(&key);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    let target = t.path().join("restored");
    let out = Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
        .args(["restore", "--from", &url, "--to"])
        .arg(&target)
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a corrupted object restored: {err}");
    assert!(err.contains(&key), "the error does not name {key}: {err}");
    assert!(!target.exists(), "a failed restore left its target");
    let left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("restore"))
        .collect();
    assert!(left.is_empty(), "a failed restore left {left:?}");

    let out = Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
        .args(["verify", "--from", &url])
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "verify passed a corrupted object: {said}"
    );
    assert!(said.contains(&key) && said.contains("FAIL"), "{said}");
}

#[test]
fn compression_flags_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 10, "text");
    let url = format!("file://{}", t.path().join("b").display());
    for (args, needle) in [
        (vec!["--compression-level", "40"], "1 to 19"),
        (vec!["--compression-level", "0"], "1 to 19"),
        (vec!["--compression", "lz4"], "zstd or none"),
        (
            vec!["--compression", "none", "--compression-level", "3"],
            "applies to",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
            .arg("backup")
            .arg("--store")
            .arg(&store)
            .args(["--to", &url, "--once"])
            .args(&args)
            .env("MUSHROOMDB_BACKUP_LOG", "off")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            !t.path().join("b").join("manifests").exists(),
            "{args:?} uploaded"
        );
    }
}
