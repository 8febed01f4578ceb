//! A restore of files larger than one GET (`restore::stage::WHOLE_OBJECT_MAX`, 64 MiB): each is
//! fetched as ranges that complete in any order, written in place and read back by the
//! format's reader once complete. The restored store must be the store, byte for byte, from a
//! directory bucket and from both S3 servers, whole and cut by `--at` inside the large archive.

mod support;

use std::path::Path;
use std::time::Duration;

use support::binary;
use support::s3_servers::S3Server;

/// About 85 MB in one archive (rotated past 72 MiB) and a short `wal.bin` after it: the
/// archive is five 16 MiB ranges.
const COMMITS: u64 = 1_300;
const ROTATE: u64 = 72 << 20;

fn large_store(endpoint: &str, root: &Path, url: &str) -> std::path::PathBuf {
    let store = root.join("source");
    let mut cmd = binary::command(endpoint);
    cmd.args(["store", "write"])
        .arg(&store)
        .args(["--commits", &COMMITS.to_string(), "--value-size", "65536"])
        .args(["--rotate-bytes", &ROTATE.to_string()]);
    binary::run_ok("store write", cmd, Duration::from_secs(120));
    let archives: Vec<_> = std::fs::read_dir(store.join("archive"))
        .expect("an archive directory")
        .map(|e| e.expect("an entry").metadata().expect("its size").len())
        .collect();
    assert!(
        archives.iter().any(|len| *len > 64 << 20),
        "an archive larger than one GET: {archives:?}"
    );
    binary::run_ok(
        "backup --once",
        binary::backup_once(endpoint, &store, url, &[]),
        Duration::from_secs(120),
    );
    store
}

fn restores_large_files_byte_for_byte(endpoint: &str, url: &str) {
    let root = tempfile::tempdir().expect("a temp dir");
    let store = large_store(endpoint, root.path(), url);
    let restored = binary::restore_digest(endpoint, url, &root.path().join("whole"));
    assert_eq!(restored, binary::store_digest(&store));

    // Cut inside the large archive: the restore reads its frames up to the commit asked for.
    let at = COMMITS / 2;
    let target = root.path().join("cut");
    let mut cmd = binary::command(endpoint);
    cmd.args([
        "restore",
        "--from",
        url,
        "--json",
        "--at",
        &at.to_string(),
        "--to",
    ])
    .arg(&target);
    binary::run_ok("restore --at", cmd, Duration::from_secs(60));
    assert_eq!(binary::store_digest(&target)["commit_seq"], at);
}

#[test]
fn large_files_restore_byte_for_byte_from_a_directory() {
    let bucket = tempfile::tempdir().expect("a temp dir");
    let url = format!("file://{}", bucket.path().join("prefix").display());
    restores_large_files_byte_for_byte("http://127.0.0.1:9", &url);
}

on_each_s3_server!(#[test] fn large_files_restore_byte_for_byte_from_s3);
fn large_files_restore_byte_for_byte_from_s3(server: &S3Server) {
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(server.create_bucket("ranged"));
    restores_large_files_byte_for_byte(&server.endpoint, &format!("s3://{bucket}/store"));
}
