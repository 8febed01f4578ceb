//! Resumable restores (issue 42, part 2): a restore SIGKILLed at ten points of its run and run
//! again each time with the same command finishes byte-identical to an uninterrupted one,
//! fetching each object about once; a staging directory of another restore point is
//! discarded and named; `--fresh` starts over.
//!
//! The restores are the real binary against moto through a proxy that counts the bytes of
//! every answer it passes back (`support::fault_proxy`, with no faults): what was fetched is
//! counted at the server side of the connection, not by the process that is killed.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::binary::{self, Running};
use support::fault_proxy::{FaultPlan, FaultProxy};

/// Downloads in flight in the killed restores: few, so that a kill finds most of the store
/// either complete or not begun.
const PARALLELISM: u64 = 2;
/// Files fsynced at once by a restore (`restore::stage::FSYNCS_IN_FLIGHT`): complete objects
/// waiting for their fsync are not in the record yet either.
const FSYNCS: u64 = 4;

/// A store of about 48 MB: 3,000 commits of 16 KiB, `wal.bin` rotated past 512 KiB (some 95
/// archives), backed up to `url` once.
fn backed_up_store(endpoint: &str, root: &Path, url: &str) -> PathBuf {
    let store = root.join("source");
    let mut cmd = binary::command(endpoint);
    cmd.args(["store", "write"])
        .arg(&store)
        .args(["--commits", "3000", "--value-size", "16384"])
        .args(["--rotate-bytes", "524288"]);
    binary::run_ok("store write", cmd, Duration::from_secs(120));
    binary::run_ok(
        "backup --once",
        binary::backup_once(endpoint, &store, url, &[]),
        Duration::from_secs(120),
    );
    store
}

fn restore_cmd(endpoint: &str, url: &str, to: &Path, extra: &[&str]) -> Command {
    let mut cmd = binary::command(endpoint);
    cmd.args(["restore", "--from", url, "--json", "--to"])
        .arg(to)
        .args(["--parallelism", &PARALLELISM.to_string()])
        .args(extra);
    cmd
}

/// Every file under `dir` (relative path, bytes), sorted.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// The bytes a run said it kept from earlier runs ("… (N bytes) complete and checked are
/// kept"), 0 when it continued nothing.
fn kept_bytes(stderr: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            l.split_once("continuing the interrupted restore")?
                .1
                .split_once(" objects (")?
                .1
                .split_once(" bytes)")?
                .0
                .parse()
                .ok()
        })
        .next_back()
        .unwrap_or(0)
}

/// Runs `cmd` until it has said it is restoring (its staging open) and `done()`, then SIGKILLs
/// it; panics if it ends first. Returns its stderr.
fn kill_when(name: &str, cmd: Command, mut done: impl FnMut() -> bool) -> String {
    let mut run = Running::spawn(name, cmd);
    let deadline = Instant::now() + Duration::from_secs(120);
    let staged = |run: &Running| run.seen().iter().any(|l| l.text.contains("restoring into"));
    while !(staged(&run) && done()) {
        if let Some(status) = run.try_exit() {
            run.fail(&format!("ended ({status}) before its kill point"));
        }
        if Instant::now() > deadline {
            run.fail("the kill point never came");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    run.kill();
    run.stderr()
}

/// Objects the staging record of the one staging directory beside `target` names complete
/// (its lines but the first, which names the restore).
fn recorded(target: &Path) -> u64 {
    let name = target.file_name().unwrap().to_string_lossy();
    leftovers(target.parent().unwrap(), &name)
        .first()
        .and_then(|d| std::fs::read_to_string(d.join(".restore.record")).ok())
        .map_or(0, |r| r.lines().count().saturating_sub(1) as u64)
}

fn leftovers(parent: &Path, name: &str) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!(".{name}.restore-"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_killed_at_ten_points_finishes_byte_identical_fetching_each_object_about_once() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "resume").await;
    let url = format!("s3://{bucket}/store");
    let tmp = tempfile::tempdir().unwrap();
    backed_up_store(&endpoint, tmp.path(), &url);
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());

    // An uninterrupted restore through the proxy: the store's bytes, and what a run costs
    // beside its objects (listing, LATEST, manifest).
    let reference = tmp.path().join("reference");
    let out = binary::run_ok(
        "reference restore",
        restore_cmd(proxy.url(), &url, &reference, &[]),
        Duration::from_secs(120),
    );
    let report = binary::json(&out);
    let store_bytes = report["bytes"].as_u64().unwrap();
    let objects = report["objects"].as_u64().unwrap();
    let overhead = proxy.counts().answered_bytes.saturating_sub(store_bytes);
    let reference_files = files(&reference);
    let largest = reference_files
        .iter()
        .map(|(_, b)| b.len() as u64)
        .max()
        .unwrap();
    assert!(
        report["objects"].as_u64().unwrap() >= 20,
        "the store should be many objects: {report}"
    );
    assert_eq!(report["resumed_bytes"], 0, "{report}");
    eprintln!("store: {store_bytes} bytes, per-run overhead {overhead}, largest file {largest}");

    // Fetched over all runs: the store once, plus at each kill what was in flight (at most
    // PARALLELISM objects downloading and FSYNCS complete ones waiting for their fsync, each
    // no larger than the largest file) and each run's listing and manifest.
    let in_flight = (PARALLELISM + FSYNCS) * largest + overhead;
    let target = tmp.path().join("target");
    let start = proxy.counts().answered_bytes;
    let mut kept_before = 0u64;
    let mut recorded_before = 0u64;
    // Each request held a little, so that a run's progress is seen before it ends.
    proxy.set_hold(Some(Duration::from_millis(20)));
    for k in 1..=10u64 {
        // Run k is killed once the staging record names k elevenths of the objects complete
        // (and at least one more than the run before it left): ten points spread over the
        // restore.
        let until = (k * objects / 11).max(recorded_before + 1);
        let cmd = restore_cmd(proxy.url(), &url, &target, &["--progress", "json"]);
        let stderr = kill_when(&format!("restore (run {k})"), cmd, || {
            recorded(&target) >= until
        });
        recorded_before = recorded(&target);
        // What this run kept from the runs before it: more each time.
        let kept_now = kept_bytes(&stderr);
        if k > 1 {
            assert!(
                kept_now > kept_before,
                "run {k} kept no more than run {}: {kept_now} <= {kept_before}\n{stderr}",
                k - 1
            );
        }
        kept_before = kept_now;
        assert!(!target.exists(), "a killed restore left a target");
        assert_eq!(
            leftovers(tmp.path(), "target").len(),
            1,
            "one staging directory"
        );
    }
    // The last run, to its end.
    let cmd = restore_cmd(proxy.url(), &url, &target, &["--progress", "json"]);
    let mut last = Running::spawn("restore (last run)", cmd);
    let status = last.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "the last run failed:\n{}", last.output());
    let report = binary::json(last.stdout().lines().last().unwrap());
    let last_stderr = last.stderr();
    let total = proxy.counts().answered_bytes - start;

    assert_eq!(
        files(&target),
        reference_files,
        "the resumed restore differs from the reference"
    );
    assert!(
        leftovers(tmp.path(), "target").is_empty(),
        "the staging directory was left"
    );
    let resumed = report["resumed_bytes"].as_u64().unwrap();
    let fetched = report["fetched_bytes"].as_u64().unwrap();
    assert_eq!(resumed + fetched, store_bytes, "{report}");
    assert_eq!(resumed, kept_bytes(&last_stderr), "{report}\n{last_stderr}");
    assert!(
        resumed > kept_before,
        "the last run kept no more than the one before: {report}"
    );
    // Progress lines are JSON objects with the fields runbooks read.
    let progress: Vec<serde_json::Value> = last_stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = progress.last().expect("a progress line");
    assert_eq!(end["bytes_done"], end["bytes_total"], "{end}");
    assert_eq!(end["bytes_total"].as_u64(), Some(store_bytes), "{end}");
    assert!(end.get("eta_seconds").is_some(), "{end}");

    let bound = store_bytes + 10 * in_flight + overhead;
    eprintln!(
        "fetched over 11 runs: {total} bytes for a {store_bytes}-byte store (bound {bound}); \
         the last run kept {resumed} and fetched {fetched}"
    );
    assert!(
        total <= bound,
        "fetched {total} bytes over all runs, more than {bound}"
    );
    assert!(
        total < 2 * store_bytes,
        "fetched {total}: resuming saved little"
    );
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_directory_of_another_restore_point_is_discarded_and_fresh_starts_over() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "resume-other").await;
    let url = format!("s3://{bucket}/store");
    let tmp = tempfile::tempdir().unwrap();
    backed_up_store(&endpoint, tmp.path(), &url);
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());
    let target = tmp.path().join("target");

    // A restore of commit 2000 killed half-way leaves its staging directory.
    let half = proxy.counts().answered_bytes + 20_000_000;
    let kill_at = |name: &str, cmd, _: &FaultProxy, until: u64| {
        kill_when(name, cmd, || proxy.counts().answered_bytes >= until)
    };
    kill_at(
        "restore --at 2000",
        restore_cmd(proxy.url(), &url, &target, &["--at", "2000"]),
        &proxy,
        half,
    );
    let left = leftovers(tmp.path(), "target");
    assert_eq!(left.len(), 1);

    // The newest restore point is another restore: that directory is discarded, by name.
    let half = proxy.counts().answered_bytes + 20_000_000;
    let stderr = kill_at(
        "restore (newest)",
        restore_cmd(proxy.url(), &url, &target, &[]),
        &proxy,
        half,
    );
    let named = left[0].display().to_string();
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("discarding") && l.contains(&named) && l.contains("commit 2000")),
        "the other restore's staging was not discarded by name:\n{stderr}"
    );
    assert_eq!(kept_bytes(&stderr), 0, "{stderr}");

    // A staging directory another user could have written into is never continued.
    let left = leftovers(tmp.path(), "target");
    assert_eq!(left.len(), 1);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&left[0], std::fs::Permissions::from_mode(0o777)).unwrap();
    let half = proxy.counts().answered_bytes + 5_000_000;
    let stderr = kill_at(
        "restore (newest, again)",
        restore_cmd(proxy.url(), &url, &target, &[]),
        &proxy,
        half,
    );
    assert!(
        stderr.contains("not a directory of this user's alone"),
        "a world-writable staging directory was not refused:\n{stderr}"
    );
    assert_eq!(kept_bytes(&stderr), 0, "{stderr}");

    // --fresh discards even this restore's own.
    let mut fresh = Running::spawn(
        "restore --fresh",
        restore_cmd(proxy.url(), &url, &target, &["--fresh"]),
    );
    assert!(
        fresh.wait_exit(Duration::from_secs(120)).success(),
        "{}",
        fresh.output()
    );
    let report = binary::json(fresh.stdout().lines().last().unwrap());
    assert_eq!(report["resumed_bytes"], 0, "{report}");
    assert!(
        fresh
            .stderr()
            .lines()
            .any(|l| l.contains("--fresh discards")),
        "{}",
        fresh.stderr()
    );
    assert_eq!(binary::store_digest(&target)["commit_seq"], 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_off_by_a_lost_network_keeps_its_staging_and_the_same_command_continues() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let bucket = support::s3::create_bucket(&endpoint, "resume-network").await;
    let url = format!("s3://{bucket}/store");
    let tmp = tempfile::tempdir().unwrap();
    let source = backed_up_store(&endpoint, tmp.path(), &url);
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());
    proxy.set_hold(Some(Duration::from_millis(20)));
    let target = tmp.path().join("target");

    // The endpoint goes away once a third of the objects are complete: the restore retries,
    // gives up, and keeps what it completed.
    let mut cut = Running::spawn(
        "restore (network lost)",
        restore_cmd(proxy.url(), &url, &target, &[]),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while recorded(&target) < 16 {
        assert!(cut.try_exit().is_none(), "ended early:\n{}", cut.output());
        assert!(Instant::now() < deadline, "no progress:\n{}", cut.output());
        std::thread::sleep(Duration::from_millis(2));
    }
    proxy.set_down(true);
    let status = cut.wait_exit(Duration::from_secs(120));
    assert!(
        !status.success(),
        "it restored without a network:\n{}",
        cut.output()
    );
    assert!(!target.exists(), "a failed restore left a target");
    assert!(
        cut.stderr()
            .contains("for the next run of this restore to continue"),
        "it did not say it kept its staging:\n{}",
        cut.stderr()
    );
    assert_eq!(leftovers(tmp.path(), "target").len(), 1);

    // The network back, the same command continues.
    proxy.set_down(false);
    let out = binary::run_ok(
        "restore (again)",
        restore_cmd(proxy.url(), &url, &target, &[]),
        Duration::from_secs(120),
    );
    let report = binary::json(&out);
    assert!(
        report["resumed_bytes"].as_u64().unwrap() >= 16 * 500_000,
        "kept too little: {report}"
    );
    assert_eq!(binary::store_digest(&target), binary::store_digest(&source));
    assert!(leftovers(tmp.path(), "target").is_empty());
}
