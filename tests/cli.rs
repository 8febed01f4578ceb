//! The binary: every command exits non-zero with a one-line reason on bad input, and the
//! happy path (write, backup, ls, verify, restore, digest) works end to end.

use std::path::Path;
use std::process::{Command, Output};

fn mb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
        .args(args)
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .output()
        .expect("run mushroom-backup")
}

fn ok(args: &[&str]) -> String {
    let o = mb(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Fails with exactly one `error:` line naming `needle`.
fn fails(args: &[&str], needle: &str) {
    let o = mb(args);
    assert!(!o.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: {err} does not say {needle:?}"
    );
}

fn url(p: &Path) -> String {
    format!("file://{}", p.display())
}

#[test]
fn the_happy_path_and_its_json() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, out) = (
        t.path().join("s"),
        url(&t.path().join("b")),
        t.path().join("r"),
    );
    let s = store.to_str().unwrap();
    ok(&[
        "store",
        "write",
        s,
        "--commits",
        "1200",
        "--snapshot-every",
        "500",
        "--rotate-bytes",
        "8192",
    ]);
    ok(&["backup", "--store", s, "--to", &bucket, "--once"]);
    let ls: serde_json::Value =
        serde_json::from_str(&ok(&["ls", "--from", &bucket, "--json"])).unwrap();
    assert_eq!(ls[0]["commit_seq"], 1200);
    assert_eq!(ls[0]["is_latest"], true);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["verify", "--from", &bucket, "--json"])).unwrap();
    assert_eq!(v["ok"], true);
    ok(&["restore", "--from", &bucket, "--to", out.to_str().unwrap()]);
    assert_eq!(
        ok(&["store", "digest", s]),
        ok(&["store", "digest", out.to_str().unwrap()])
    );
}

#[test]
fn bad_input_gets_one_line_naming_what_was_wrong() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), url(&t.path().join("b")));
    let s = store.to_str().unwrap();
    fails(
        &["backup", "--store", s, "--to", &bucket, "--once"],
        "not a store",
    );
    ok(&["store", "write", s, "--commits", "10"]);
    fails(
        &["backup", "--store", s, "--to", "ftp://x/y", "--once"],
        "file:// or s3://",
    );
    fails(
        &[
            "backup",
            "--store",
            s,
            "--to",
            "file://relative/path",
            "--once",
        ],
        "absolute path",
    );
    fails(
        &[
            "backup",
            "--store",
            s,
            "--to",
            &bucket,
            "--once",
            "--wal-interval-ms",
            "0",
        ],
        "--wal-interval-ms",
    );
    // Every number a flag takes has a range; past it, one line naming the flag and the range
    // (`keep_for` of 2^63 ms once wrapped negative and deleted what it should keep; an
    // interval of u64::MAX ms overflowed the clock it was added to).
    for (flag, value) in [
        ("--keep-for-ms", "9223372036854775808"),
        ("--orphan-grace-ms", "18446744073709551615"),
        ("--retention-interval-ms", "18446744073709551615"),
        ("--restore-point-interval-ms", "0"),
        ("--keep-generations", "0"),
    ] {
        fails(
            &[
                "backup", "--store", s, "--to", &bucket, "--once", flag, value,
            ],
            &format!("{flag} = {value} is out of range"),
        );
    }
    for (flag, value) in [
        ("--health-report-interval-ms", "0"),
        ("--owner-silent-after-ms", "18446744073709551615"),
        ("--lease-ttl-ms", "0"),
    ] {
        let data = t.path().join("serve-data");
        fails(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                data.to_str().unwrap(),
                flag,
                value,
            ],
            &format!("{flag} = {value} is out of range"),
        );
    }
    fails(
        &[
            "restore",
            "--from",
            &bucket,
            "--to",
            t.path().join("r").to_str().unwrap(),
        ],
        "no restore point",
    );
    fails(
        &[
            "store",
            "digest",
            t.path().join("nothing").to_str().unwrap(),
        ],
        "not a store",
    );
    fails(
        &["store", "write", s, "--commits", "1", "--rate", "0"],
        "rate",
    );
    ok(&["backup", "--store", s, "--to", &bucket, "--once"]);
    fails(&["restore", "--from", &bucket, "--to", s], "not empty");
    fails(
        &[
            "restore",
            "--from",
            &bucket,
            "--to",
            t.path().join("r").to_str().unwrap(),
            "--at",
            "11",
        ],
        "reachable: 0..=10",
    );
    assert!(!t.path().join("r").exists());
}

#[test]
fn a_junk_manifest_is_reported_never_a_panic() {
    let t = tempfile::tempdir().unwrap();
    let (store, root) = (t.path().join("s"), t.path().join("b"));
    let s = store.to_str().unwrap();
    ok(&["store", "write", s, "--commits", "50"]);
    ok(&["backup", "--store", s, "--to", &url(&root), "--once"]);
    std::fs::write(
        root.join("manifests/00000000000000000007.json"),
        b"{\"format\": 1, \"lineage\": 3",
    )
    .unwrap();
    let o = mb(&["verify", "--from", &url(&root)]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("FAIL") && out.contains("00000000000000000007.json"),
        "{out}"
    );
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    let ls = ok(&["ls", "--from", &url(&root)]);
    assert!(
        ls.contains("00000000000000000007.json") && ls.contains("INVALID"),
        "{ls}"
    );
    // The valid restore point still restores.
    ok(&[
        "restore",
        "--from",
        &url(&root),
        "--to",
        t.path().join("r").to_str().unwrap(),
    ]);
}
