//! The binary: every command exits non-zero with a one-line reason on bad input, and the
//! happy path (write, backup, ls, verify, restore, digest) works end to end. The read-only
//! commands create nothing in a destination; a missing destination, refused credentials and an
//! unreachable endpoint are each one line in words (against moto, a moto that checks
//! credentials, and a closed port), in the error and in the retry lines alike; no credentials
//! at all, and no region, are one line at once, without the SDK's warnings. `ls` and
//! `verify` of a prefix that holds no backup fail naming what it holds; a backup without a
//! restore point yet lists as such, exit 0.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::modes_under;
use support::s3_servers::S3Server;

fn mb(args: &[&str]) -> Output {
    mb_env(args, &[])
}

fn mb_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mushroom-backup"))
        .args(args)
        .env("MUSHROOMDB_BACKUP_LOG", "off")
        .env_remove(mushroom_backup::bucket::fs::FILE_MODE_ENV)
        .envs(env.iter().copied())
        .output()
        .expect("run mushroom-backup")
}

fn ok(args: &[&str]) -> String {
    support::binary::succeeded(args, mb(args))
}

/// `backup --store STORE --to TO --once EXTRA…` fails as [`fails`] does, naming `needle`.
fn backup_once_fails(store: &str, to: &str, extra: &[&str], needle: &str) {
    let args = [&["backup", "--store", store, "--to", to, "--once"], extra].concat();
    fails(&args, needle);
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
    backup_once_fails(s, &bucket, &[], "not a store");
    ok(&["store", "write", s, "--commits", "10"]);
    backup_once_fails(s, "ftp://x/y", &[], "file:// or s3://");
    backup_once_fails(
        s,
        &bucket,
        &["--object-lock", "compliance"],
        "--object-lock compliance needs an s3:// destination",
    );
    fails(
        &[
            "ls",
            "--from",
            &bucket,
            "--bucket-as-of",
            "2026-12-02T10:00:00Z",
        ],
        "read as of an instant only from S3 object versions",
    );
    fails(
        &[
            "restore",
            "--from",
            "s3://b/p",
            "--to",
            s,
            "--bucket-as-of",
            "yesterday",
        ],
        "--bucket-as-of \"yesterday\" is not an RFC 3339 time",
    );
    fails(
        &[
            "backup",
            "--store",
            s,
            "--to",
            "s3://b/p",
            "--object-lock",
            "governance",
            "--conditional",
            "off",
        ],
        "needs conditional writes",
    );
    backup_once_fails(s, "file://relative/path", &[], "absolute path");
    backup_once_fails(s, &bucket, &["--wal-interval-ms", "0"], "--wal-interval-ms");
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
        backup_once_fails(
            s,
            &bucket,
            &[flag, value],
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
    let target = t.path().join("r");
    let r = target.to_str().unwrap();
    // No backup has run: the bucket directory was never made.
    fails(&["restore", "--from", &bucket, "--to", r], "does not exist");
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
        &["restore", "--from", &bucket, "--to", r, "--at", "11"],
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

#[test]
fn read_only_commands_create_nothing_and_name_a_missing_destination() {
    let t = tempfile::tempdir().unwrap();
    let typo = t.path().join("typo");
    let target = t.path().join("r");
    let missing = format!("{} does not exist", url(&typo));
    fails(&["ls", "--from", &url(&typo)], &missing);
    fails(&["ls", "--from", &url(&typo), "--json"], &missing);
    fails(&["verify", "--from", &url(&typo)], &missing);
    fails(
        &[
            "restore",
            "--from",
            &url(&typo),
            "--to",
            target.to_str().unwrap(),
        ],
        &missing,
    );
    assert!(
        !typo.exists(),
        "a read-only command created {}",
        typo.display()
    );
    assert!(!target.exists());

    // An existing directory that holds nothing of a backup (a typo): ls and verify fail
    // saying so, and leave it empty.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let nothing = format!("{} holds no backup", url(&empty));
    fails(&["ls", "--from", &url(&empty)], &nothing);
    fails(
        &["ls", "--from", &url(&empty), "--json"],
        "it holds no object at all",
    );
    fails(&["verify", "--from", &url(&empty)], &nothing);
    fails(&["verify", "--from", &url(&empty), "--json"], &nothing);
    fails(
        &[
            "restore",
            "--from",
            &url(&empty),
            "--to",
            target.to_str().unwrap(),
        ],
        "no restore point",
    );
    let left: Vec<_> = std::fs::read_dir(&empty).unwrap().collect();
    assert!(left.is_empty(), "ls or restore created {left:?}");

    // A file where the directory should be.
    let file = t.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    fails(&["ls", "--from", &url(&file)], "not a directory");
}

/// A path a level too high (the backup is under it) fails `ls` and `verify`, naming what it
/// holds; a backup whose first restore point is not written yet (a generation, no manifest)
/// is a valid state: "no restore points yet", exit 0.
#[test]
fn a_prefix_a_level_too_high_is_named_and_a_backup_without_restore_points_yet_is_not_an_error() {
    let t = tempfile::tempdir().unwrap();
    let (store, up) = (t.path().join("s"), t.path().join("up"));
    let s = store.to_str().unwrap();
    ok(&["store", "write", s, "--commits", "50"]);
    let node1 = up.join("node1");
    ok(&["backup", "--store", s, "--to", &url(&node1), "--once"]);
    let hint = format!(
        "{} holds no backup (no LATEST, lease, manifests/ or gen/ under it): it holds node1/; \
         is the backup a level down, e.g. {}?",
        url(&up),
        url(&node1)
    );
    fails(&["ls", "--from", &url(&up)], &hint);
    fails(&["verify", "--from", &url(&up)], &hint);

    // The same backup with its restore points gone: a generation, no manifest, no LATEST.
    std::fs::remove_dir_all(node1.join("manifests")).unwrap();
    std::fs::remove_file(node1.join("LATEST")).unwrap();
    assert_eq!(
        ok(&["ls", "--from", &url(&node1)]),
        "no restore points yet\n"
    );
    assert_eq!(ok(&["ls", "--from", &url(&node1), "--json"]).trim(), "[]");
    assert!(
        ok(&["verify", "--from", &url(&node1)]).contains("no restore points yet"),
        "verify of a backup without restore points yet"
    );
}

/// `store write STORE --commits 300 --snapshot-every 100`: a small store with snapshots.
fn small_store(store: &str) {
    ok(&[
        "store",
        "write",
        store,
        "--commits",
        "300",
        "--snapshot-every",
        "100",
    ]);
}

#[test]
fn backups_on_file_destinations_are_private_unless_configured() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    let s = store.to_str().unwrap();
    small_store(s);
    for (setting, file, dir) in [(None, 0o600, 0o700), (Some("0640"), 0o640, 0o750)] {
        let root = t.path().join(format!("b-{}", setting.unwrap_or("default")));
        let env: Vec<(&str, &str)> = setting
            .map(|m| (mushroom_backup::bucket::fs::FILE_MODE_ENV, m))
            .into_iter()
            .collect();
        let o = mb_env(
            &["backup", "--store", s, "--to", &url(&root), "--once"],
            &env,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let modes = modes_under(&root);
        assert!(
            modes.iter().filter(|(_, is_dir, _)| !is_dir).count() > 5,
            "{modes:?}"
        );
        for (path, is_dir, mode) in &modes {
            let want = if *is_dir { dir } else { file };
            assert_eq!(
                *mode, want,
                "{setting:?}: {path:?} is {mode:o}, not {want:o}"
            );
        }
        // Restored from, it restores.
        ok(&[
            "restore",
            "--from",
            &url(&root),
            "--to",
            t.path()
                .join(format!("r-{}", setting.unwrap_or("default")))
                .to_str()
                .unwrap(),
        ]);
    }
    for bad in ["0777", "0644x", "0400", "640 "] {
        let o = mb_env(
            &[
                "backup",
                "--store",
                s,
                "--to",
                &url(&t.path().join("b-bad")),
                "--once",
            ],
            &[(mushroom_backup::bucket::fs::FILE_MODE_ENV, bad)],
        );
        assert!(!o.status.success(), "{bad:?} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.starts_with("error: ") && err.contains(mushroom_backup::bucket::fs::FILE_MODE_ENV),
            "{bad:?}: {err}"
        );
        assert!(!t.path().join("b-bad").exists());
    }
    // The service refuses it at start, before its first `file://` store.
    let data = t.path().join("data");
    let o = mb_env(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--allow-root",
            t.path().to_str().unwrap(),
        ],
        &[
            (mushroom_backup::bucket::fs::FILE_MODE_ENV, "0755"),
            ("MUSHROOMDB_BACKUP_ADMIN_TOKEN", "a-token-for-tests"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "serve started: {err}");
    assert!(
        err.trim().lines().count() == 1 && err.contains("no execute bits"),
        "{err}"
    );
    assert!(!data.exists());
}

/// What the binary printed on stderr, when `args` run against the S3 endpoint `endpoint`
/// (logging retries) failed: its one `error:` line must contain `needle`, and no line an SDK
/// `Debug` dump.
fn fails_on_s3(endpoint: &str, args: &[&str], needle: &str) -> Vec<String> {
    let o = support::binary::command(endpoint)
        .args(args)
        .env("MUSHROOMDB_BACKUP_LOG", "info")
        .output()
        .expect("run mushroom-backup");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    let lines: Vec<String> = err.lines().map(str::to_string).collect();
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{args:?}: {err}");
    assert!(
        errors[0].contains(needle),
        "{args:?}: {err}\ndoes not say {needle:?}"
    );
    for line in &lines {
        for dump in [
            "ErrorMetadata",
            "ServiceError(",
            "DispatchFailure(",
            "ConnectorError {",
        ] {
            assert!(
                !line.contains(dump),
                "{args:?}: a Debug dump ({dump}) in {line}"
            );
        }
    }
    lines
}

/// A store `s` of five commits in a fresh temp dir.
fn store_of_five_commits() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    ok(&["store", "write", store.to_str().unwrap(), "--commits", "5"]);
    (t, store)
}

on_each_s3_server!(#[test] fn a_missing_bucket_is_named);
fn a_missing_bucket_is_named(server: &S3Server) {
    let endpoint = server.endpoint.clone();
    let (t, store) = store_of_five_commits();
    let name = format!("missing-{}", std::process::id());
    let from = format!("s3://{name}/p");
    let said = format!("bucket {name} does not exist");
    let target = t.path().join("r");
    fails_on_s3(&endpoint, &["ls", "--from", &from], &said);
    fails_on_s3(&endpoint, &["verify", "--from", &from], &said);
    fails_on_s3(
        &endpoint,
        &["restore", "--from", &from, "--to", target.to_str().unwrap()],
        &said,
    );
    assert!(!target.exists());
    // A backup says the same.
    fails_on_s3(
        &endpoint,
        &[
            "backup",
            "--store",
            store.to_str().unwrap(),
            "--to",
            &from,
            "--once",
        ],
        &said,
    );
}

#[test]
fn refused_credentials_are_access_denied() {
    let Some(moto) = support::s3::authenticating_moto() else {
        return;
    };
    let said = format!(
        "access denied to s3://b/p (check the credentials for {})",
        moto.url
    );
    let lines = fails_on_s3(&moto.url, &["ls", "--from", "s3://b/p"], &said);
    assert!(
        lines.iter().any(|l| l.contains("InvalidAccessKeyId")),
        "the store's code is not shown: {lines:?}"
    );
    let t = tempfile::tempdir().unwrap();
    fails_on_s3(
        &moto.url,
        &[
            "restore",
            "--from",
            "s3://b/p",
            "--to",
            t.path().join("r").to_str().unwrap(),
        ],
        &said,
    );
}

#[test]
fn an_unreachable_endpoint_is_named_in_the_error_and_every_retry() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let said = format!("cannot reach the endpoint {endpoint}: ");
    let lines = fails_on_s3(&endpoint, &["ls", "--from", "s3://b/p"], &said);
    let retries: Vec<&String> = lines.iter().filter(|l| l.contains("retrying")).collect();
    assert!(!retries.is_empty(), "no retry was logged: {lines:?}");
    for line in lines
        .iter()
        .filter(|l| l.contains("retrying") || l.contains("giving up"))
    {
        assert!(line.contains(&said), "{line}");
    }
}

/// A link planted inside a `file://` bucket is never followed (issue 25, part 2). A backup into
/// a bucket whose `gen` is a link to another directory exits non-zero naming the link and
/// writes nothing behind it (it used to put a whole generation there and exit 0); restore,
/// verify and a retention pass through a `gen` link, and `ls` through a `manifests` link, are
/// refused naming it, and what lies behind each link is left exactly as it was. The bucket's
/// root itself may be reached through a link: the operator names it.
#[test]
fn links_inside_a_file_bucket_are_refused_never_followed() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let store = t.join("s");
    let s = store.to_str().unwrap();
    small_store(s);
    let link = |target: &Path, at: &Path| std::os::unix::fs::symlink(target, at).unwrap();

    // A fresh bucket with a planted `gen` link.
    let elsewhere = t.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let planted = t.join("planted");
    std::fs::create_dir(&planted).unwrap();
    link(&elsewhere, &planted.join("gen"));
    let named = format!("{} is a symbolic link", planted.join("gen").display());
    fails(
        &["backup", "--store", s, "--to", &url(&planted), "--once"],
        &named,
    );
    let behind: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(
        behind.is_empty(),
        "the backup wrote behind the link: {behind:?}"
    );

    // A root reached through a link backs up, and restores.
    let bucket = t.join("b");
    std::fs::create_dir(&bucket).unwrap();
    link(&bucket, &t.join("b-link"));
    ok(&[
        "backup",
        "--store",
        s,
        "--to",
        &url(&t.join("b-link")),
        "--once",
    ]);
    ok(&[
        "restore",
        "--from",
        &url(&t.join("b-link")),
        "--to",
        t.join("r0").to_str().unwrap(),
    ]);

    // Its `gen` moved out and linked back in: nothing reads or deletes through it.
    let gen_elsewhere = t.join("gen-elsewhere");
    std::fs::rename(bucket.join("gen"), &gen_elsewhere).unwrap();
    link(&gen_elsewhere, &bucket.join("gen"));
    let before = support::store::tree(&gen_elsewhere);
    let named = format!("{} is a symbolic link", bucket.join("gen").display());
    let into = t.join("r1");
    fails(
        &[
            "restore",
            "--from",
            &url(&bucket),
            "--to",
            into.to_str().unwrap(),
        ],
        &named,
    );
    assert!(!into.exists(), "a refused restore left {}", into.display());
    fails(&["verify", "--from", &url(&bucket)], &named);
    fails(&["retention", "--from", &url(&bucket)], &named);
    assert_eq!(support::store::tree(&gen_elsewhere), before);

    // `gen` put back, `manifests` linked instead: `ls` refuses, naming it.
    std::fs::remove_file(bucket.join("gen")).unwrap();
    std::fs::rename(&gen_elsewhere, bucket.join("gen")).unwrap();
    let manifests_elsewhere = t.join("manifests-elsewhere");
    std::fs::rename(bucket.join("manifests"), &manifests_elsewhere).unwrap();
    link(&manifests_elsewhere, &bucket.join("manifests"));
    let named = format!("{} is a symbolic link", bucket.join("manifests").display());
    fails(&["ls", "--from", &url(&bucket)], &named);
    assert_eq!(support::store::tree(&bucket.join("gen")), before);
}

/// `args` against moto with no AWS credentials anywhere (no variables, a `HOME` without
/// `~/.aws`, no instance metadata) and `env_remove`d too, `env` set, logging as by default (neither
/// `MUSHROOMDB_BACKUP_LOG` nor `RUST_LOG`): its stderr, after it exited non-zero (a bounded
/// wait).
fn without_aws_settings(
    endpoint: &str,
    args: &[&str],
    env_remove: &[&str],
    env: &[(&str, &str)],
) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = support::binary::command(endpoint);
    cmd.args(args)
        .env("HOME", home.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env_remove("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        .env_remove("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        .env_remove("AWS_DEFAULT_REGION")
        .env_remove("MUSHROOMDB_BACKUP_LOG")
        .env_remove("RUST_LOG");
    for name in env_remove {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let mut child = support::binary::Running::spawn("mushroom-backup", cmd);
    let status = child.wait_exit(std::time::Duration::from_secs(120));
    let err: String = child
        .seen()
        .iter()
        .filter(|l| l.stream == support::binary::Stream::Stderr)
        .map(|l| format!("{}\n", l.text))
        .collect();
    assert!(!status.success(), "{args:?} succeeded: {err}");
    err
}

on_each_s3_server!(#[test] fn missing_credentials_and_region_are_said_at_once_without_sdk_noise);
/// No credentials at all: one error line saying so, at once (no retry: the endpoint was up),
/// and none of the SDK's warnings at the default log level. No region: the same, without the
/// SDK's region warnings.
fn missing_credentials_and_region_are_said_at_once_without_sdk_noise(server: &S3Server) {
    let endpoint = server.endpoint.clone();
    let (_t, store) = store_of_five_commits();
    // One error line; no retry; no line of the SDK's (their targets start with `aws_`).
    let check = |what: &str, err: &str, says: &str| {
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(
            errors.len() == 1 && errors[0].contains(says),
            "{what}: {err}"
        );
        for line in err.lines() {
            assert!(
                !line.contains("retrying") && !line.contains(" aws_"),
                "{what}: {line}\n{err}"
            );
        }
    };
    let none = "no AWS credentials found (";
    let err = without_aws_settings(&endpoint, &["ls", "--from", "s3://b/p"], &[], &[]);
    check("ls without credentials", &err, none);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("for s3://b/p: set AWS_ACCESS_KEY_ID"), "{err}");
    let err = without_aws_settings(
        &endpoint,
        &[
            "backup",
            "--store",
            store.to_str().unwrap(),
            "--to",
            "s3://b/p",
            "--once",
        ],
        &[],
        &[],
    );
    check("backup without credentials", &err, none);
    // Without a region the SDK asks the instance metadata service for one: here a closed
    // port, so each attempt fails at once and the SDK warns about it (three lines of ~250
    // characters before the fix).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let imds = format!("http://127.0.0.1:{port}");
    let err = without_aws_settings(
        &endpoint,
        &["ls", "--from", "s3://b/p"],
        &["AWS_REGION", "AWS_EC2_METADATA_DISABLED"],
        &[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &imds)],
    );
    check("ls without a region", &err, "no AWS region configured");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
