//! Restores of encoded objects (compressed, sealed, or both) through the binary over `file://`:
//! every one decodes in one pass in memory and, for archives and `wal.bin`, is read by the
//! format's reader as it is written (`src/restore/decode.rs`). A restore gives the store's
//! digest; a byte flipped in any data object, in whichever of its chunks it falls, fails the
//! restore with an error naming that object and leaves neither a target nor a temporary
//! directory.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::binary::{command, run_ok, store_digest};

const NO_S3: &str = "http://unused.invalid";

fn write(store: &Path, kind: &str) {
    let mut cmd = command(NO_S3);
    cmd.args(["store", "write"])
        .arg(store)
        .args(["--commits", "3000", "--value-size", "1024"])
        .args(["--value-kind", kind, "--snapshot-every", "1000"])
        .args(["--rotate-bytes", "524288", "--seed", "7"]);
    run_ok("store write", cmd, Duration::from_secs(300));
}

fn run(mut cmd: Command) -> (bool, String) {
    let out = cmd.output().expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh key file (0600).
fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("key");
    let out = command(NO_S3).args(["key", "new"]).output().unwrap();
    assert!(out.status.success());
    std::fs::write(&path, out.stdout).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Every `"key"` a manifest names (its data objects), into `out`.
fn named_keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("key", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => named_keys(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| named_keys(v, out)),
        _ => {}
    }
}

fn restore(url: &str, target: &Path, extra: &[String]) -> (bool, String) {
    let mut cmd = command(NO_S3);
    cmd.env("MUSHROOMDB_BACKUP_LOG", "off")
        .args(["restore", "--from", url, "--to"])
        .arg(target)
        .args(extra);
    run(cmd)
}

/// Backs up a `kind` store (with a key when `encrypt`), checks the manifest's codecs with
/// `codec_wanted`, restores it whole, then flips a byte of each data object in turn.
fn flipped_bytes_fail_naming_the_object(kind: &str, encrypt: bool, codec_wanted: &str) {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let work = t.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let url = format!("file://{}", bucket.display());
    write(&store, kind);
    let key_args: Vec<String> = if encrypt {
        let key = key_file(t.path());
        vec![
            "--encryption-key-file".into(),
            key.to_string_lossy().into_owned(),
        ]
    } else {
        Vec::new()
    };
    let mut cmd = command(NO_S3);
    cmd.arg("backup")
        .arg("--store")
        .arg(&store)
        .args(["--to", &url, "--once"])
        .args(&key_args);
    let (ok, err) = run(cmd);
    assert!(ok, "backup failed: {err}");

    let mut objects = Vec::new();
    let mut codecs = String::new();
    for m in std::fs::read_dir(bucket.join("manifests")).unwrap() {
        let text = std::fs::read_to_string(m.unwrap().path()).unwrap();
        named_keys(&serde_json::from_str(&text).unwrap(), &mut objects);
        codecs += &text;
    }
    objects.sort();
    objects.dedup();
    for what in ["snapshot.bin", "/archive/", ".seg"] {
        assert!(
            objects.iter().any(|k| k.contains(what)),
            "no {what} object in {objects:?}"
        );
    }
    assert!(
        codecs.contains(codec_wanted),
        "no {codec_wanted} in the manifests: {codecs}"
    );

    let whole = work.join("whole");
    let (ok, err) = restore(&url, &whole, &key_args);
    assert!(ok, "restore failed: {err}");
    assert_eq!(store_digest(&whole), store_digest(&store));
    std::fs::remove_dir_all(&whole).unwrap();

    for key in &objects {
        let path = bucket.join(key);
        let good = std::fs::read(&path).unwrap();
        // The middle byte, and one in the last 64 KiB chunk of a sealed stream.
        for at in [good.len() / 2, good.len().saturating_sub(3)] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let target = work.join("target");
            let (ok, err) = restore(&url, &target, &key_args);
            assert!(!ok, "a restore with byte {at} of {key} flipped succeeded");
            assert!(
                err.contains(key.as_str()),
                "the error does not name {key}: {err}"
            );
            assert!(!target.exists(), "a failed restore left its target ({key})");
            let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
            assert!(left.is_empty(), "a failed restore left {left:?} ({key})");
        }
        std::fs::write(&path, &good).unwrap();
    }
}

#[test]
fn sealed_compressed_objects_restore_and_a_flipped_byte_fails_naming_the_object() {
    flipped_bytes_fail_naming_the_object("text", true, "\"codec\": \"zstd\"");
}

#[test]
fn sealed_raw_objects_restore_and_a_flipped_byte_fails_naming_the_object() {
    flipped_bytes_fail_naming_the_object("random", true, "\"encrypted\": true");
}

#[test]
fn compressed_objects_restore_and_a_flipped_byte_fails_naming_the_object() {
    flipped_bytes_fail_naming_the_object("text", false, "\"codec\": \"zstd\"");
}
