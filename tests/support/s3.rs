//! An S3 endpoint for tests, and fresh buckets on it.
//!
//! [`endpoint`] is, in order: `MUSHROOM_TEST_S3_ENDPOINT` (what `scripts/test.sh` sets); else
//! a `moto_server` from the crate's `.venv`, started once per test process on a free loopback
//! port and killed with the process; else, under `CI=true`, a panic (a missing S3 must fail CI,
//! never skip); else `None`, with a line saying the test is skipped. [`authenticating_moto`] is
//! a test's own moto that checks credentials.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use mushroom_backup::bucket::DynBucket;
use mushroom_backup::bucket::s3::{S3Bucket, S3Options};

/// The variable naming an S3 endpoint already running.
pub const ENDPOINT_ENV: &str = "MUSHROOM_TEST_S3_ENDPOINT";
/// How long a freshly started moto may take to answer.
const STARTUP: Duration = Duration::from_secs(60);

/// The S3 endpoint URL for tests, or `None` (after printing why) when there is none.
pub fn endpoint() -> Option<String> {
    if let Ok(url) = std::env::var(ENDPOINT_ENV) {
        return Some(url);
    }
    let moto = moto_server()?;
    static SPAWNED: OnceLock<String> = OnceLock::new();
    Some(
        SPAWNED
            .get_or_init(|| {
                let (tx, rx) = std::sync::mpsc::channel();
                // Spawned from a thread that lives as long as the process, because
                // `PR_SET_PDEATHSIG` fires when the spawning *thread* exits: so moto dies with
                // the process, not with the first test that asked for it.
                std::thread::spawn(move || {
                    let started = spawn_moto(&moto, &[]);
                    let url = started.url.clone();
                    let _ = tx.send(url);
                    let _keep = started;
                    loop {
                        std::thread::park();
                    }
                });
                rx.recv().expect("the moto thread answers")
            })
            .clone(),
    )
}

/// The `moto_server` of the crate's `.venv`, or `None` (after printing why) when there is
/// none; under `CI=true` a missing one panics.
fn moto_server() -> Option<std::path::PathBuf> {
    let moto = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if moto.exists() {
        return Some(moto);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("S3 tests need moto: run scripts/test.sh (or set {ENDPOINT_ENV})");
    }
    eprintln!("SKIP: no moto_server (run scripts/test.sh, or set {ENDPOINT_ENV})");
    None
}

/// A moto server of one test's own, that checks every request's credentials
/// (`INITIAL_NO_AUTH_ACTION_COUNT=0`: moto then knows only the access keys created in its
/// IAM, so every key a test passes is refused with a real `403 InvalidAccessKeyId`). Killed
/// when dropped, or when the thread that started it ends.
pub fn authenticating_moto() -> Option<Moto> {
    Some(spawn_moto(
        &moto_server()?,
        &[("INITIAL_NO_AUTH_ACTION_COUNT", "0")],
    ))
}

/// A moto server child and its URL, killed when dropped.
pub struct Moto {
    child: Child,
    pub url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts moto with the extra environment `env` on a free port and waits until it answers.
/// It gets SIGKILL when the calling thread ends (`PR_SET_PDEATHSIG`), so a test that panics
/// leaves no server behind.
fn spawn_moto(moto: &Path, env: &[(&str, &str)]) -> Moto {
    use std::os::unix::process::CommandExt;
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("pick a free port")
        .port();
    let mut cmd = Command::new(moto);
    cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", moto.display()));
    let moto = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + STARTUP;
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer on port {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    moto
}

/// A client for the test endpoint: explicit region, dummy credentials, path-style.
pub fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    Client::from_conf(conf)
}

/// A fresh, uniquely named bucket on the test endpoint (default options), rooted at a prefix.
pub async fn bucket(name_hint: &str) -> Option<DynBucket> {
    Some(Arc::new(s3_bucket(name_hint, S3Options::default()).await?))
}

/// Like [`bucket`], with the given part size (at least 5 MiB) for multipart uploads.
pub async fn bucket_with_part_size(name_hint: &str, part_size: u64) -> Option<DynBucket> {
    let options = S3Options {
        part_size,
        multipart_threshold: part_size,
        ..S3Options::default()
    };
    Some(Arc::new(s3_bucket(name_hint, options).await?))
}

/// A fresh bucket on the test endpoint as an [`S3Bucket`], rooted at the prefix `root`.
pub async fn s3_bucket(name_hint: &str, options: S3Options) -> Option<S3Bucket> {
    let endpoint = endpoint()?;
    let name = create_bucket(&endpoint, name_hint).await;
    Some(S3Bucket::new(client(&endpoint), &name, "root", options).endpoint_named(&endpoint))
}

/// Creates a fresh, uniquely named bucket on `endpoint`; returns its name.
pub async fn create_bucket(endpoint: &str, name_hint: &str) -> String {
    let name = unique_bucket_name(name_hint);
    client(endpoint)
        .create_bucket()
        .bucket(&name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name} at {endpoint}: {e:?}"));
    name
}

/// Creates a fresh, uniquely named bucket with Object Lock enabled (and so versioning) through
/// `client`; returns its name.
pub async fn create_locked_bucket(client: &Client, name_hint: &str) -> String {
    let name = unique_bucket_name(name_hint);
    client
        .create_bucket()
        .bucket(&name)
        .object_lock_enabled_for_bucket(true)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name} with Object Lock: {e:?}"));
    name
}

/// A valid DNS bucket name from the hint, unique in this process and across processes.
fn unique_bucket_name(hint: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut clean: String = hint
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    clean.truncate(30);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "t-{}-{}-{n}-{nanos:x}",
        clean.trim_matches('-'),
        std::process::id()
    )
}

/// Every version and delete marker under `prefix` in `bucket`, by key: the version ids of each
/// key, and the keys with delete markers (what the server records of every write and delete).
#[allow(dead_code)] // not every test binary counts versions
pub async fn object_versions(
    client: &Client,
    bucket: &str,
    prefix: &str,
) -> (std::collections::BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut by_key: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut markers = Vec::new();
    let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
    loop {
        let out = client
            .list_object_versions()
            .bucket(bucket)
            .prefix(prefix)
            .set_key_marker(key_marker.clone())
            .set_version_id_marker(version_marker.clone())
            .send()
            .await
            .expect("list versions");
        for v in out.versions() {
            by_key
                .entry(v.key().unwrap().to_string())
                .or_default()
                .push(v.version_id().unwrap_or("null").to_string());
        }
        for d in out.delete_markers() {
            markers.push(d.key().unwrap().to_string());
        }
        if out.is_truncated() != Some(true) {
            return (by_key, markers);
        }
        key_marker = out.next_key_marker().map(str::to_string);
        version_marker = out.next_version_id_marker().map(str::to_string);
    }
}
