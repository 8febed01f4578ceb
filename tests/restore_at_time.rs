//! Restore to an instant, through the real binary (`restore --at-time`) and over real gRPC
//! (`Adopt` with `at_time`, `ListRestorePoints`' earliest and latest instants).
//!
//! One history on a `file://` bucket (whose clock is this machine's: objects carry their
//! mtime): five rounds of "write 40 commits, `backup --once`", each bracketed by this test's
//! clock and 60 ms apart (a file's mtime comes from the kernel's coarse clock, a few ms behind).
//! The manifests of rounds 2 and 4 are then deleted, as if those runs had died before writing
//! them, so round 2's commits are reachable only through round 3's manifest (which names its
//! segment: a cut) and round 4's only as segments past round 3's manifest (an extension). An
//! instant after round `i` ended and before round `i + 1` began must restore exactly
//! `40 (i + 1)` commits, with the digest the store had then.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use mushroom_backup::service::proto;
use mushroom_backup::units::{rfc3339_ms, unix_now_ms};
use support::binary::{self, json};
use tonic::Code;

const ROUNDS: usize = 5;
const PER_ROUND: u64 = 40;

/// What round `i` left: the commits and digest the store had, and this test's clock just
/// before the round's backup began and just after it ended.
struct Round {
    commits: u64,
    digest: serde_json::Value,
    before_ms: i64,
    after_ms: i64,
}

struct History {
    /// Where restores go.
    dir: PathBuf,
    url: String,
    rounds: Vec<Round>,
}

fn mb(args: &[&str]) -> Output {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.env("MUSHROOMDB_BACKUP_LOG", "off").args(args);
    cmd.output().expect("run mushroom-backup")
}

fn ok(args: &[&str]) -> String {
    support::binary::succeeded(args, mb(args))
}

/// Fails non-zero with stderr naming every one of `needles`.
fn fails(args: &[&str], needles: &[&str]) -> String {
    let o = mb(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} succeeded: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} does not say {n:?}");
    }
    err
}

/// Writes the history: the store and restores in `dir`, the bucket at `bucket`.
fn history(dir: &Path, bucket: &Path) -> History {
    let store = dir.join("store");
    let url = format!("file://{}", bucket.display());
    let s = store.to_str().unwrap();
    let mut rounds = Vec::new();
    for i in 0..ROUNDS {
        ok(&["store", "write", s, "--commits", &PER_ROUND.to_string()]);
        let digest = json(&ok(&["store", "digest", s]));
        let before_ms = unix_now_ms();
        ok(&["backup", "--store", s, "--to", &url, "--once"]);
        let after_ms = unix_now_ms();
        let commits = PER_ROUND * (i as u64 + 1);
        assert_eq!(digest["commit_seq"], commits);
        rounds.push(Round {
            commits,
            digest,
            before_ms,
            after_ms,
        });
        std::thread::sleep(Duration::from_millis(60));
    }
    for lost in [2, 4] {
        let key = bucket.join(format!(
            "manifests/{:020}.json",
            PER_ROUND * (lost as u64 + 1)
        ));
        std::fs::remove_file(&key).unwrap_or_else(|e| panic!("{}: {e}", key.display()));
    }
    History {
        dir: dir.to_path_buf(),
        url,
        rounds,
    }
}

/// `restore --from URL --to DIR --at-time T EXTRA…` of `h`'s prefix, which must succeed: what it
/// printed.
fn restore_at_time(h: &History, to: &Path, at: &str, extra: &[&str]) -> String {
    let args = [
        &[
            "restore",
            "--from",
            &h.url,
            "--to",
            to.to_str().unwrap(),
            "--at-time",
            at,
        ],
        extra,
    ]
    .concat();
    ok(&args)
}

/// `restore --at-time T --json` into a fresh directory: the report and the restored digest.
fn restore_at(h: &History, at: &str, name: &str) -> (serde_json::Value, serde_json::Value) {
    let to = h.dir.join(name);
    let report = json(&restore_at_time(h, &to, at, &["--json"]));
    (
        report,
        json(&ok(&["store", "digest", to.to_str().unwrap()])),
    )
}

fn in_round(t: i64, r: &Round) -> bool {
    // The kernel stamps files from a coarse clock, up to a few ms behind this test's.
    (r.before_ms - 20..=r.after_ms).contains(&t)
}

#[test]
fn restore_at_instants_between_rounds_gives_exactly_their_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let h = history(tmp.path(), &tmp.path().join("bucket"));
    for (i, r) in h.rounds.iter().enumerate() {
        // Just after the round, and just before the next began.
        let next = h
            .rounds
            .get(i + 1)
            .map_or(unix_now_ms(), |n| n.before_ms - 30);
        for (which, t) in [("after", r.after_ms), ("before next", next)] {
            let at = rfc3339_ms(t);
            let (report, digest) = restore_at(&h, &at, &format!("r{i}-{}", which.len()));
            assert_eq!(
                report["commit_seq"], r.commits,
                "at {at} ({which} round {i})"
            );
            assert_eq!(digest, r.digest, "at {at} ({which} round {i})");
            let time = report["commit_time_unix_ms"]
                .as_i64()
                .expect("a commit time");
            assert!(in_round(time, r), "round {i}: commit time {time} not in it");
        }
    }
    // An offset other than Z names the same instant.
    let r1 = &h.rounds[1];
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(r1.after_ms) * 1_000_000)
        .unwrap()
        .to_offset(time::UtcOffset::from_hms(2, 0, 0).unwrap())
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    assert!(t.ends_with("+02:00"), "{t}");
    let (report, _) = restore_at(&h, &t, "offset");
    assert_eq!(report["commit_seq"], r1.commits);
    // The text output names the commit and its time.
    let out = restore_at_time(&h, &h.dir.join("text"), &rfc3339_ms(r1.after_ms), &[]);
    assert!(out.contains("restored commit 80, shipped at 20"), "{out}");
}

#[test]
fn bad_instants_are_refused_naming_why_and_leave_no_target() {
    let tmp = tempfile::tempdir().unwrap();
    let h = history(tmp.path(), &tmp.path().join("bucket"));
    let to = h.dir.join("refused");
    let t = to.to_str().unwrap();
    let restore = |at: &str| -> Vec<String> {
        ["restore", "--from", &h.url, "--to", t, "--at-time", at]
            .map(String::from)
            .to_vec()
    };
    let run = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, needles);
        assert!(!to.exists(), "{args:?} left {}", to.display());
    };
    run(restore("2026-12-02T10:00:00"), &["no UTC offset", "Z"]);
    run(restore("yesterday"), &["\"yesterday\"", "RFC 3339"]);
    run(restore("2026-13-02T10:00:00Z"), &["RFC 3339"]);
    run(restore("9999-12-31T23:59:59Z"), &["in the future"]);
    let first = &h.rounds[0];
    let err = {
        let args = restore(&rfc3339_ms(first.before_ms - 5_000));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails(&args, &["before the earliest restorable instant"])
    };
    assert!(!to.exists());
    // The earliest it names is round 0's manifest's time.
    let named = err
        .split("earliest restorable instant ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("names the earliest");
    let ms = mushroom_backup::manifest::parse_time_ms(named.trim_end_matches([')', ',', ';', ':']))
        .unwrap_or_else(|| panic!("{named:?} in {err:?} is not a time"));
    assert!(in_round(ms, first), "{err}");
    let mut both = restore(&rfc3339_ms(first.after_ms));
    both.extend(["--at".to_string(), "10".to_string()]);
    run(both, &["--at"]);
}

type Client = proto::backup_control_client::BackupControlClient<tonic::transport::Channel>;

fn adopt_request(d: &support::service::Dirs, name: &str, url: &str) -> proto::AdoptRequest {
    proto::AdoptRequest {
        store_dir: d.store(name),
        destination: url.to_string(),
        ..Default::default()
    }
}

/// `req` is refused with `code`, a message naming every one of `needles`, and no target.
async fn refused(c: &mut Client, req: proto::AdoptRequest, code: Code, needles: &[&str]) {
    let target = PathBuf::from(&req.store_dir);
    let status = c.adopt(req).await.expect_err("Adopt should be refused");
    assert_eq!(status.code(), code, "{status:?}");
    for n in needles {
        assert!(
            status.message().contains(n),
            "{status:?} does not say {n:?}"
        );
    }
    assert!(
        !target.exists(),
        "a refused Adopt left {}",
        target.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_at_an_instant_and_the_restorable_span_over_grpc() {
    let d = support::service::dirs();
    // The bucket is under buckets/, where the service may restore from.
    let work = d.base.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let h = tokio::task::block_in_place(|| history(&work, &d.buckets.join("history")));
    let url = d.bucket("history");
    let server = support::service::Server::start(
        "serve",
        support::service::serve_command(&d, "a", None, &[]),
    );
    let mut c = server.client().await;
    let r2 = &h.rounds[2];

    // Refused before the good one: once a store backs up to the prefix, Adopt refuses it.
    // Each: the target's name, `at_time`, `at_commit_seq`, the code and what it says.
    let cases: [(&str, String, u64, Code, &[&str]); 3] = [
        (
            "no-offset",
            "2026-12-02T10:00:00".into(),
            0,
            Code::InvalidArgument,
            &["at_time", "no UTC offset"],
        ),
        (
            "both",
            rfc3339_ms(r2.after_ms),
            10,
            Code::InvalidArgument,
            &["at_commit_seq", "at_time"],
        ),
        (
            "too-early",
            rfc3339_ms(h.rounds[0].before_ms - 5_000),
            0,
            Code::FailedPrecondition,
            &["before the earliest restorable instant"],
        ),
    ];
    for (name, at_time, at_commit_seq, code, says) in cases {
        let req = proto::AdoptRequest {
            at_time,
            at_commit_seq,
            ..adopt_request(&d, name, &url)
        };
        refused(&mut c, req, code, says).await;
    }

    let adopted = c
        .adopt(proto::AdoptRequest {
            at_time: rfc3339_ms(r2.after_ms),
            ..adopt_request(&d, "adopted", &url)
        })
        .await
        .expect("Adopt at round 2's end")
        .into_inner();
    assert_eq!(adopted.commit_seq, r2.commits, "{adopted:?}");
    assert!(in_round(adopted.commit_time_unix_ms, r2), "{adopted:?}");
    let got = tokio::task::block_in_place(|| binary::store_digest(Path::new(&d.store("adopted"))));
    assert_eq!(got, r2.digest);

    let page = c
        .list_restore_points(proto::ListRestorePointsRequest {
            store_id: adopted.store_id.clone(),
            ..Default::default()
        })
        .await
        .expect("ListRestorePoints")
        .into_inner();
    assert!(
        in_round(page.earliest_unix_ms, &h.rounds[0]),
        "earliest {} not round 0's",
        page.earliest_unix_ms
    );
    // The adopted store's worker may have shipped since: the latest is round 4's or later.
    let last = &h.rounds[ROUNDS - 1];
    assert!(
        page.latest_unix_ms >= last.before_ms - 20 && page.latest_unix_ms <= unix_now_ms(),
        "latest {} before round {}",
        page.latest_unix_ms,
        ROUNDS - 1
    );
}
