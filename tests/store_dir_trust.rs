//! What the backup side trusts a store directory for, and what it does not (issue 11, items 3
//! and 4): a registered directory later replaced by a link out of the allowed root, or by
//! another directory, is refused at the next look, with the path and the root in health, and
//! nothing of what is there reaches the bucket; files in a store directory are regular files,
//! never followed, and small files are capped — a symlinked `store.meta` never copies a secret
//! into the bucket, a FIFO never wedges the worker, a huge sparse file is refused unread.
//!
//! The directory tests run the real `serve` binary over gRPC; the file tests run the real
//! worker against a local-directory bucket, one through the real `backup --once` binary, and
//! one through the service.

mod support;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use mushroom_backup::store::disk;
use mushroom_backup::store::engine::WriteOptions;
use support::binary::BIN;
use support::serve::Serve;
use support::store::{config, fs_bucket, tree, worker, write, write_with};
use tonic::transport::Channel;

const ADMIN: &str = "admin-secret-for-store-dir-tests";
/// Generous: the machine running the tests may be busy. Liveness only, never a measurement.
const DEADLINE: Duration = Duration::from_secs(120);

/// A test's directories: an allowed root, a place outside it, a bucket, a data dir.
struct Dirs {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    outside: PathBuf,
    bucket: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let (root, outside, bucket) = (
        base.join("stores"),
        base.join("outside"),
        base.join("bucket"),
    );
    for d in [&root, &outside, &bucket] {
        std::fs::create_dir_all(d).unwrap();
    }
    Dirs {
        _tmp: tmp,
        base,
        root,
        outside,
        bucket,
    }
}

/// `serve` over the test's data dir and root, with the admin token.
fn serve(d: &Dirs) -> Serve {
    let mut cmd = support::serve::command(&d.base.join("data"), &d.root, &[]);
    cmd.env("MUSHROOMDB_BACKUP_LOG", "info")
        .env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", ADMIN);
    Serve::start("serve", cmd)
}

fn admin<T>(msg: T) -> tonic::Request<T> {
    support::with_token(msg, ADMIN)
}

async fn client(s: &Serve) -> BackupControlClient<Channel> {
    BackupControlClient::connect(s.url()).await.unwrap()
}

async fn register(c: &mut BackupControlClient<Channel>, dir: &Path, bucket: &Path) -> String {
    c.register(admin(proto::RegisterRequest {
        store_dir: dir.to_str().unwrap().into(),
        destination: format!("file://{}", bucket.display()),
        ..Default::default()
    }))
    .await
    .expect("Register")
    .into_inner()
    .store_id
}

async fn health(c: &mut BackupControlClient<Channel>, id: &str) -> proto::StoreHealth {
    support::served::health_of(c, id, admin).await
}

/// Polls health until `f` holds; panics after [`DEADLINE`] with the last health and the
/// server's output.
async fn wait_health(
    c: &mut BackupControlClient<Channel>,
    s: &Serve,
    id: &str,
    what: &str,
    f: impl Fn(&proto::StoreHealth) -> bool,
) -> proto::StoreHealth {
    let start = Instant::now();
    loop {
        let h = health(c, id).await;
        if f(&h) {
            return h;
        }
        if start.elapsed() > DEADLINE {
            s.child
                .fail(&format!("store {id} never got {what}; last health: {h:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for two more failed steps with the same reason as `h`: the worker kept looking, and
/// kept refusing.
async fn more_refused_steps(
    c: &mut BackupControlClient<Channel>,
    s: &Serve,
    id: &str,
    h: &proto::StoreHealth,
) {
    let (failures, reason) = (h.consecutive_failures, h.reason.clone());
    wait_health(c, s, id, "two more refused steps", |now| {
        now.consecutive_failures >= failures + 2 && now.reason == reason
    })
    .await;
}

/// The bucket's files but the lease (which the worker renews whatever it does).
fn bucket_tree(root: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut t = tree(root);
    t.retain(|k, _| !k.ends_with("lease"));
    t
}

/// Whether any file under `root` holds `needle`.
fn holds(root: &Path, needle: &[u8]) -> Option<PathBuf> {
    tree(root)
        .into_iter()
        .find(|(_, bytes)| bytes.windows(needle.len()).any(|w| w == needle))
        .map(|(k, _)| k)
}

/// A store whose `store.meta` says `marker`, so that its side file is recognisable.
fn marked_store(dir: &Path, commits: u64, seed: u64, marker: &str) {
    write_with(
        dir,
        WriteOptions {
            commits,
            seed,
            ..WriteOptions::default()
        },
    );
    let meta = std::fs::read(dir.join(disk::META_FILE)).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    v["marker"] = marker.into();
    std::fs::write(dir.join(disk::META_FILE), serde_json::to_vec(&v).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_planted_where_a_registered_store_will_be_is_refused_and_nothing_is_written_there() {
    let d = dirs();
    let server = serve(&d);
    let mut c = client(&server).await;
    // Registered before it exists (allowed: what does not exist cannot be a link)…
    let path = d.root.join("later");
    let id = register(&mut c, &path, &d.bucket).await;
    // … then a link to a store outside every root is planted there.
    let elsewhere = d.outside.join("someone-elses");
    marked_store(&elsewhere, 200, 3, "OUTSIDE-STORE-MARKER");
    let elsewhere_before = tree(&elsewhere);
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();

    let h = wait_health(&mut c, &server, &id, "the refusal", |h| {
        h.reason.contains("outside every allowed root")
    })
    .await;
    assert!(!h.healthy, "{h:?}");
    for part in [&path, &elsewhere, &d.root] {
        assert!(
            h.reason.contains(part.to_str().unwrap()),
            "the reason does not name {}: {}",
            part.display(),
            h.reason
        );
    }
    // More refused looks, then: nothing read from there reached the bucket, nothing was
    // written there.
    more_refused_steps(&mut c, &server, &id, &h).await;
    assert!(
        !elsewhere.join(disk::LINEAGE_FILE).exists(),
        "the worker wrote backup.lineage outside every root"
    );
    assert_eq!(
        tree(&elsewhere),
        elsewhere_before,
        "the outside store changed"
    );
    let objects: Vec<PathBuf> = bucket_tree(&d.bucket).into_keys().collect();
    assert!(
        objects.is_empty(),
        "objects reached the bucket: {objects:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_directory_swapped_for_a_link_out_of_its_root_or_for_another_directory_is_refused()
{
    let d = dirs();
    let server = serve(&d);
    let mut c = client(&server).await;
    let path = d.root.join("node1");
    marked_store(&path, 300, 1, "INSIDE-STORE-MARKER");
    let id = register(&mut c, &path, &d.bucket).await;
    wait_health(&mut c, &server, &id, "its first restore point", |h| {
        h.healthy && h.shipped_commit_seq == 300 && h.restore_point_commit_seq == 300
    })
    .await;
    let before = bucket_tree(&d.bucket);
    assert!(holds(&d.bucket, b"INSIDE-STORE-MARKER").is_some());

    // The directory is moved aside and a link to another store, outside the root, put in its
    // place.
    let elsewhere = d.outside.join("someone-elses");
    marked_store(&elsewhere, 500, 9, "OUTSIDE-STORE-MARKER");
    std::fs::rename(&path, d.base.join("aside")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let elsewhere_before = tree(&elsewhere);
    let h = wait_health(&mut c, &server, &id, "the refusal", |h| {
        h.reason.contains("outside every allowed root")
    })
    .await;
    assert!(!h.healthy);
    assert!(
        h.reason.contains(path.to_str().unwrap())
            && h.reason.contains(elsewhere.to_str().unwrap())
            && h.reason.contains(d.root.to_str().unwrap()),
        "{}",
        h.reason
    );
    c.trigger(admin(proto::TriggerRequest {
        store_id: id.clone(),
        kind: proto::TriggerKind::RestorePoint as i32,
    }))
    .await
    .unwrap();
    more_refused_steps(&mut c, &server, &id, &h).await;
    assert_eq!(
        bucket_tree(&d.bucket),
        before,
        "the bucket changed after the store directory left its root"
    );
    assert_eq!(holds(&d.bucket, b"OUTSIDE-STORE-MARKER"), None);
    assert!(!elsewhere.join(disk::LINEAGE_FILE).exists());
    assert_eq!(tree(&elsewhere), elsewhere_before);

    // Another directory inside the root at the same path: not the one opened, refused too.
    std::fs::remove_file(&path).unwrap();
    marked_store(&path, 400, 5, "REPLACEMENT-MARKER");
    let h = wait_health(&mut c, &server, &id, "the replacement refused", |h| {
        h.reason.contains("was replaced")
    })
    .await;
    assert!(h.reason.contains(path.to_str().unwrap()), "{}", h.reason);
    more_refused_steps(&mut c, &server, &id, &h).await;
    assert_eq!(bucket_tree(&d.bucket), before);
    assert_eq!(holds(&d.bucket, b"REPLACEMENT-MARKER"), None);
    server.child.signal(libc::SIGTERM);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_store_meta_is_refused_by_the_service_and_the_secret_never_reaches_the_bucket()
{
    let d = dirs();
    let secret = d.outside.join("secret.txt");
    std::fs::write(&secret, b"TOP-SECRET-CREDENTIALS").unwrap();
    let path = d.root.join("node1");
    write(&path, 200, 0, 0);
    std::fs::remove_file(path.join(disk::META_FILE)).unwrap();
    std::os::unix::fs::symlink(&secret, path.join(disk::META_FILE)).unwrap();

    let server = serve(&d);
    let mut c = client(&server).await;
    let id = register(&mut c, &path, &d.bucket).await;
    let h = wait_health(&mut c, &server, &id, "the refusal", |h| {
        h.reason.contains("store.meta is a symbolic link")
    })
    .await;
    assert!(!h.healthy);
    assert!(
        h.reason.contains("side files must be regular files"),
        "{}",
        h.reason
    );
    more_refused_steps(&mut c, &server, &id, &h).await;
    assert_eq!(holds(&d.bucket, b"TOP-SECRET-CREDENTIALS"), None);
    let gens: Vec<PathBuf> = bucket_tree(&d.bucket)
        .into_keys()
        .filter(|k| k.starts_with("gen"))
        .collect();
    assert!(gens.is_empty(), "a generation was claimed: {gens:?}");

    // Fixed by the operator: the next step goes through and health clears.
    std::fs::remove_file(path.join(disk::META_FILE)).unwrap();
    std::fs::write(path.join(disk::META_FILE), b"{}").unwrap();
    wait_health(&mut c, &server, &id, "healthy again", |h| {
        h.healthy && h.shipped_commit_seq == 200
    })
    .await;
    assert_eq!(holds(&d.bucket, b"TOP-SECRET-CREDENTIALS"), None);
}

/// Every kind of link in a store directory is refused, naming the file, before anything is
/// claimed: the worker never reads through a link.
#[tokio::test]
async fn no_file_of_a_store_is_read_through_a_link() {
    for name in [
        disk::META_FILE,
        disk::LINEAGE_FILE,
        disk::PARENT_FILE,
        disk::WAL_FILE,
        disk::SNAPSHOT_FILE,
        disk::ARCHIVE_DIR,
    ] {
        let t = tempfile::tempdir().unwrap();
        let (store, bucket, secret) = (t.path().join("s"), t.path().join("b"), t.path().join("x"));
        // A snapshot, and archives after it.
        write(&store, 400, 300, 2048);
        let name = if name == disk::ARCHIVE_DIR {
            let first = std::fs::read_dir(store.join(name))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .min()
                .expect("the test store has archives");
            format!("{name}/{first}")
        } else {
            name.to_string()
        };
        let name = name.as_str();
        let target = store.join(name);
        assert!(
            target.exists() || matches!(name, disk::LINEAGE_FILE | disk::PARENT_FILE),
            "the test store has no {name}"
        );
        if target.exists() {
            std::fs::rename(&target, &secret).unwrap();
        } else {
            std::fs::write(&secret, b"{}").unwrap();
        }
        std::os::unix::fs::symlink(&secret, &target).unwrap();
        let e = worker(&store, fs_bucket(&bucket), config())
            .run_once()
            .await
            .expect_err(name);
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{name} is a symbolic link")),
            "{name}: {msg}"
        );
        assert!(e.store_refusal().is_some(), "{name}: {e:?}");
        let gens: Vec<PathBuf> = tree(&bucket)
            .into_keys()
            .filter(|k| k.starts_with("gen"))
            .collect();
        assert!(
            gens.is_empty(),
            "{name}: a generation was claimed: {gens:?}"
        );
    }
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A FIFO as a side file fails the step with a reason instead of blocking a thread for ever
/// (no process ever opens its other end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_side_file_fails_the_step_and_does_not_wedge_the_worker() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    write(&store, 200, 0, 0);
    let meta = store.join(disk::META_FILE);
    std::fs::remove_file(&meta).unwrap();
    mkfifo(&meta);
    let mut w = worker(&store, fs_bucket(&bucket), config());
    let r = tokio::time::timeout(DEADLINE, w.run_once()).await;
    let Ok(r) = r else {
        // Unblock the reader (so the runtime can shut down), then fail.
        let _ = std::fs::OpenOptions::new().write(true).open(&meta);
        panic!("the worker was still reading the FIFO after {DEADLINE:?}");
    };
    let e = r.expect_err("a FIFO side file is refused");
    assert!(
        e.to_string()
            .contains("store.meta is a FIFO; side files must be regular files"),
        "{e}"
    );
    assert!(tree(&bucket).keys().all(|k| !k.starts_with("gen")));
}

/// A side file far over the cap (sparse: it costs no disk) is refused by its size, unread.
#[tokio::test]
async fn an_oversize_side_file_is_refused_without_being_read() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    write(&store, 200, 0, 0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(store.join(disk::META_FILE))
        .unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let e = worker(&store, fs_bucket(&bucket), config())
        .run_once()
        .await
        .expect_err("a 1 GiB store.meta is refused");
    let msg = e.to_string();
    assert!(
        msg.contains("store.meta is 1073741824 bytes, over the limit of"),
        "{msg}"
    );
    assert!(tree(&bucket).keys().all(|k| !k.starts_with("gen")));
}

/// The standalone `backup --once` says which file it refused, in one line, and exits non-zero.
#[test]
fn the_backup_command_names_a_refused_side_file() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, secret) = (t.path().join("s"), t.path().join("b"), t.path().join("x"));
    write(&store, 100, 0, 0);
    std::fs::write(&secret, b"TOP-SECRET-CREDENTIALS").unwrap();
    std::fs::remove_file(store.join(disk::META_FILE)).unwrap();
    std::os::unix::fs::symlink(&secret, store.join(disk::META_FILE)).unwrap();
    let out = Command::new(BIN)
        .arg("backup")
        .arg("--store")
        .arg(&store)
        .arg("--to")
        .arg(format!("file://{}", bucket.display()))
        .arg("--once")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("store.meta is a symbolic link; side files must be regular files"),
        "{stderr}"
    );
    assert_eq!(holds(&bucket, b"TOP-SECRET-CREDENTIALS"), None);
}

/// The largest resident set this process has had, in bytes.
fn max_rss() -> u64 {
    // SAFETY: getrusage fills a struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    u64::try_from(u.ru_maxrss).unwrap() * 1024
}

/// A `wal.bin` with a huge hole after its frames (sparse: it costs no disk) is scanned a
/// chunk at a time: the offline source finds the frames, and never holds the file in memory.
#[tokio::test]
async fn the_offline_source_scans_a_huge_wal_in_bounded_memory() {
    use mushroom_backup::wal_source::{OfflineSource, WalSource};
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 300, 0, 0);
    let wal = store.join(disk::WAL_FILE);
    let frames_end = std::fs::metadata(&wal).unwrap().len();
    const HOLE: u64 = 2 << 30;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(frames_end + HOLE)
        .unwrap();
    let pos = OfflineSource::new(&store)
        .durable_wal_position()
        .await
        .unwrap();
    assert_eq!((pos.durable_len, pos.commit_seq), (frames_end, 300));
    let rss = max_rss();
    assert!(
        rss < HOLE / 4,
        "reading the position took {rss} bytes of memory: the WAL was read whole"
    );
}

/// Frames that cross the scan's chunks, and frames larger than a chunk, are all found.
#[tokio::test]
async fn the_offline_source_finds_frames_across_and_above_its_chunks() {
    use mushroom_backup::wal_source::{OFFLINE_SCAN_CHUNK, OfflineSource, WalSource};
    for (value_size, commits) in [(3 << 20, 7), (OFFLINE_SCAN_CHUNK + 4096, 3)] {
        let t = tempfile::tempdir().unwrap();
        let store = t.path().join("s");
        write_with(
            &store,
            WriteOptions {
                commits,
                value_size,
                ..WriteOptions::default()
            },
        );
        let len = std::fs::metadata(store.join(disk::WAL_FILE)).unwrap().len();
        assert!(len > 2 * OFFLINE_SCAN_CHUNK as u64, "{len}");
        let pos = OfflineSource::new(&store)
            .durable_wal_position()
            .await
            .unwrap();
        assert_eq!(
            (pos.durable_len, pos.commit_seq),
            (len, commits),
            "{value_size}"
        );
    }
}

/// Without allowed roots (the standalone worker), the directory is still the one opened: one
/// put in its place is refused, and a worker started afresh takes it.
#[tokio::test]
async fn a_worker_refuses_a_directory_put_in_place_of_the_one_it_opened() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    write(&store, 200, 0, 0);
    let mut w = worker(&store, fs_bucket(&bucket), config());
    w.run_once().await.unwrap();
    let before = tree(&bucket);
    std::fs::rename(&store, t.path().join("old")).unwrap();
    write(&store, 300, 0, 0);
    let e = w
        .run_once()
        .await
        .expect_err("a replaced directory is refused");
    assert!(
        e.to_string().contains("was replaced") && e.store_refusal().is_some(),
        "{e}"
    );
    assert_eq!(
        tree(&bucket),
        before,
        "something was uploaded from the new directory"
    );
    // The new directory has no lineage and the prefix has restore points: a fresh worker
    // refuses the prefix, as it would any other store's.
    let e = worker(&store, fs_bucket(&bucket), config())
        .run_once()
        .await
        .expect_err("another store on a used prefix");
    assert!(e.to_string().contains("no backup.lineage"), "{e}");
}
