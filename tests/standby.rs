//! `restore --follow` (a standby; `src/standby/`) with real processes: a crash of the standby at
//! every numbered apply step leaves a directory that the format's reader and the engine open,
//! and a restart resumes and reaches the source's digest; over moto, a standby follows a
//! `backup` follower of a store the reference engine writes (snapshots, rotations, archives),
//! converges to the source's digest, and an idle spell costs only the few LISTs documented.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mushroom_backup::standby::{ApplyStep, CRASH_EXIT, IDLE_AFTER};
use support::binary::{self, FollowSettings, Running};

/// How long any one wait may take (a debug build on a shared machine).
const WAIT: Duration = Duration::from_secs(90);

use support::binary::standby;

/// One apply line of a standby: `(applied, commit_seq)`.
fn applied(line: &binary::Line) -> Option<(String, u64)> {
    if line.stream != binary::Stream::Stdout {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&line.text).ok()?;
    Some((
        v["applied"].as_str()?.to_string(),
        v["commit_seq"].as_u64()?,
    ))
}

/// Waits until the standby says it applied commit `n` (or later); returns every kind of apply
/// it reported on the way.
fn wait_for_commit(s: &mut Running, n: u64) -> Vec<String> {
    let mut kinds = Vec::new();
    s.wait_for(&format!("apply commit {n}"), WAIT, |line| {
        let (kind, seq) = applied(line)?;
        kinds.push(kind);
        (seq >= n).then_some(())
    });
    kinds
}

/// `store write DIR --commits N` with extra flags (seed 0, as fast as it can).
fn write_more(dir: &Path, commits: u64, extra: &[&str]) {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["store", "write"])
        .arg(dir)
        .args(["--commits", &commits.to_string()])
        .args(extra);
    binary::run_ok("store write", cmd, WAIT);
}

/// SIGTERM, then a clean exit 0; returns the last line (where it stopped, requests sent).
fn stop(s: &mut Running) -> serde_json::Value {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(WAIT);
    if !status.success() {
        s.fail(&format!("exited {status} on SIGTERM"));
    }
    binary::json(&s.stdout())
}

/// The directory reads as a store with the format's reader and with the engine, holding a
/// commit between `low` and `high`; nothing staged is left beside it... until the restart.
fn opens(dir: &Path, low: u64, high: u64, context: &str) {
    let read = mushroom_backup::restore::read_back(dir)
        .unwrap_or_else(|e| panic!("{context}: the format's reader refuses the standby: {e}"));
    let image = mushroom_backup::store::engine::read_store(dir)
        .unwrap_or_else(|e| panic!("{context}: the engine refuses the standby: {e}"));
    assert_eq!(read.commit_seq, image.commit_seq, "{context}");
    assert!(
        (low..=high).contains(&read.commit_seq),
        "{context}: the standby holds commit {}, expected {low}..={high}",
        read.commit_seq
    );
}

/// Entries beside `dir` whose names say a standby staged them.
fn staged_beside(dir: &Path) -> Vec<String> {
    let name = dir.file_name().unwrap().to_str().unwrap();
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(&format!("{name}.standby-")))
        .collect()
}

#[test]
fn a_crash_at_every_apply_step_leaves_a_store_that_opens_and_a_restart_resumes() {
    const UNUSED: &str = "http://unused.invalid";
    for step in ApplyStep::ALL {
        let context = format!("crash at step {} ({step:?})", step as u8);
        let tmp = tempfile::tempdir().unwrap();
        let (src, dir) = (tmp.path().join("src"), tmp.path().join("standby"));
        let url = support::file_url(&tmp.path().join("bucket").join("p"));
        let ship = || {
            binary::run_ok(
                "backup --once",
                binary::backup_once(UNUSED, &src, &url, &[]),
                WAIT,
            )
        };
        binary::write_store(&src, 100);
        ship();
        let mut cmd = standby(UNUSED, &url, &dir, 100, 200);
        cmd.args(["--crash-at-step", &(step as u8).to_string()]);
        let mut s = Running::spawn(&format!("standby ({context})"), cmd);
        wait_for_commit(&mut s, 100);

        // Segments of the generation followed (steps 1 to 4), then a new generation (5 to 7).
        let phases: [(&[&str], bool); 2] = [
            (&[], (step as u8) <= 4),
            (&["--snapshot-every", "20"], (step as u8) > 4),
        ];
        let mut before = 100;
        for (extra, crashes_here) in phases {
            write_more(&src, 50, extra);
            ship();
            let source = support::store::digest(&src);
            if crashes_here {
                let status = s.wait_exit(WAIT);
                if status.code() != Some(CRASH_EXIT) {
                    s.fail(&format!(
                        "{context}: exited {status}, not at the crash point"
                    ));
                }
                opens(&dir, before, source.commit_seq, &context);
                if step == ApplyStep::SegmentTorn {
                    let here = mushroom_backup::standby::local::look(&dir).unwrap();
                    assert!(
                        here.wal_len > here.wal_end && here.commit_seq > before,
                        "{context}: no torn tail after whole frames: {here:?}"
                    );
                }
                s = Running::spawn(
                    &format!("standby restarted ({context})"),
                    standby(UNUSED, &url, &dir, 100, 200),
                );
            }
            wait_for_commit(&mut s, source.commit_seq);
            assert_eq!(
                support::store::digest(&dir),
                source,
                "{context}: the standby differs from its source"
            );
            before = source.commit_seq;
        }
        stop(&mut s);
        assert_eq!(staged_beside(&dir), Vec::<String>::new(), "{context}");
    }
}

#[test]
fn a_standby_follows_a_backup_on_s3_across_generations_and_idles_on_a_few_lists() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bucket = rt.block_on(support::s3::create_bucket(&endpoint, "standby"));
    let url = format!("s3://{bucket}/p");
    let tmp = tempfile::tempdir().unwrap();
    let (src, dir) = (tmp.path().join("src"), tmp.path().join("standby"));
    binary::write_store(&src, 200);
    binary::run_ok(
        "backup --once",
        binary::backup_once(&endpoint, &src, &url, &[]),
        WAIT,
    );
    let settings = FollowSettings {
        lease_ttl: Duration::from_secs(3),
        wal_interval: Duration::from_millis(200),
        restore_point_interval: Duration::from_millis(1000),
    };
    let _backup = Running::spawn(
        "backup (follow)",
        binary::follower(&endpoint, &src, &url, &settings),
    );
    let mut s = Running::spawn("standby", standby(&endpoint, &url, &dir, 200, 2000));
    wait_for_commit(&mut s, 200);

    // The engine commits at 200/s, snapshotting and rotating as it goes (archives).
    write_more(
        &src,
        800,
        &[
            "--rate",
            "200",
            "--snapshot-every",
            "300",
            "--rotate-bytes",
            "20000",
        ],
    );
    let source = support::store::digest(&src);
    let kinds = wait_for_commit(&mut s, source.commit_seq);
    for kind in ["segments", "generation"] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "the standby never applied {kind}: {kinds:?}"
        );
    }
    assert_eq!(support::store::digest(&dir), source, "the standby differs");
    let keys = rt.block_on(async {
        support::s3::client(&endpoint)
            .list_objects_v2()
            .bucket(&bucket)
            .prefix("p/gen/")
            .send()
            .await
            .unwrap()
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect::<Vec<_>>()
    });
    assert!(
        keys.iter().any(|k| k.contains("/archive/")),
        "no archived WAL was shipped: {keys:?}"
    );
    stop(&mut s);

    // Idle: a restarted standby on a quiet prefix resumes (LATEST, its manifest, one LIST of
    // the generation's segments), then polls: IDLE_AFTER at 200 ms, 400, 800 and 1600 ms,
    // then every 2 s.
    let mut s = Running::spawn("standby (idle)", standby(&endpoint, &url, &dir, 200, 2000));
    s.wait_for("resume", WAIT, |l| {
        applied(l).filter(|(k, _)| k == "resumed")
    });
    let idle = Duration::from_secs(20);
    std::thread::sleep(idle);
    let last = stop(&mut s);
    let requests = &last["requests"];
    let ramp = Duration::from_millis(200) * IDLE_AFTER + Duration::from_millis(2800);
    let polls = u64::from(IDLE_AFTER) + 3 + (idle - ramp).as_secs().div_ceil(2) + 1;
    eprintln!("idle standby, {idle:?} at 200 ms / 2 s polls: {requests} (polls at most {polls})");
    assert_eq!(requests["put"], 0, "a standby wrote: {requests}");
    assert_eq!(requests["delete"], 0, "a standby deleted: {requests}");
    assert!(
        requests["list"].as_u64().unwrap() <= polls + 1,
        "an idle standby listed more than it polls: {requests}"
    );
    assert!(
        requests["get"].as_u64().unwrap() <= 2,
        "an idle standby read more than its resume: {requests}"
    );
    assert_eq!(last["stopped"]["commit_seq"], source.commit_seq);
}

/// The environment of a short-lived lease and quick shipping.
fn quick(cmd: &mut Command) -> &mut Command {
    cmd.env("MUSHROOMDB_BACKUP_LEASE_TTL_MS", "2000")
        .env("MUSHROOMDB_BACKUP_WAL_INTERVAL_MS", "200")
        .env("MUSHROOMDB_BACKUP_RESTORE_POINT_INTERVAL_MS", "1000")
}

/// Runs `cmd` to its end, which must be a failure saying `says`.
fn refused(name: &str, mut cmd: Command, says: &str) -> String {
    let out = cmd.output().expect("the binary runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{name} was not refused: {err}");
    assert!(
        err.contains(says),
        "{name}: refused, but not saying {says:?}: {err}"
    );
    err
}

#[test]
fn promote_fences_the_old_primary_and_the_promoted_store_ships_as_a_new_lineage() {
    const UNUSED: &str = "http://unused.invalid";
    let tmp = tempfile::tempdir().unwrap();
    let (src, dir) = (tmp.path().join("src"), tmp.path().join("standby"));
    let bucket = tmp.path().join("bucket").join("p");
    let url = support::file_url(&bucket);
    binary::write_store(&src, 100);
    binary::run_ok(
        "backup --once",
        binary::backup_once(UNUSED, &src, &url, &[]),
        WAIT,
    );
    let mut s = Running::spawn("standby", standby(UNUSED, &url, &dir, 100, 200));
    wait_for_commit(&mut s, 100);
    write_more(&src, 50, &[]);
    let settings = FollowSettings {
        lease_ttl: Duration::from_secs(2),
        wal_interval: Duration::from_millis(200),
        restore_point_interval: Duration::from_millis(1000),
    };
    let mut old = Running::spawn(
        "old primary",
        binary::follower(UNUSED, &src, &url, &settings),
    );
    wait_for_commit(&mut s, 150);
    stop(&mut s);

    let promote = |wait: bool| {
        let mut cmd = binary::command(UNUSED);
        cmd.args(["promote", "--from", &url, "--dir"]).arg(&dir);
        if wait {
            cmd.arg("--wait-for-lease");
        }
        quick(&mut cmd);
        cmd
    };
    // A live old primary under writes (20 commits a second): the promotion takes its lease
    // over at once, waits out its deadline by the bucket's clock, catches up and claims.
    let writer = std::thread::spawn({
        let src = src.clone();
        move || write_more(&src, 100, &["--rate", "20"])
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut p = Running::spawn("promoted", promote(false));
    let promoted = p.wait_for("promote", WAIT, |l| {
        let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
        v.get("promoted").cloned()
    });
    let applied = promoted["applied"]["commit_seq"].as_u64().unwrap();
    assert!(applied >= 150, "{promoted}");
    assert!(promoted["parent"]["commit_seq"].as_u64().unwrap() <= applied);
    let new_lineage = promoted["new_lineage"].as_str().unwrap().to_string();
    assert_ne!(
        promoted["parent"]["lineage"].as_str(),
        Some(new_lineage.as_str())
    );
    // The old primary reports that it lost the lease, and ships nothing after the promotion
    // although its store goes on committing.
    let mut held = false;
    old.wait_for_health("report that it lost the lease", WAIT, |h| {
        held |= h.lease_held;
        held && !h.lease_held
    });
    let old_gen = bucket.join(format!(
        "gen/{:010}",
        promoted["applied"]["generation"].as_u64().unwrap()
    ));
    let shipped = support::store::tree(&old_gen);
    writer.join().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        support::store::tree(&old_gen).keys().collect::<Vec<_>>(),
        shipped.keys().collect::<Vec<_>>(),
        "the old primary shipped after the promotion"
    );
    assert!(support::store::digest(&src).commit_seq > applied);

    // The old primary comes back: refused by the lease the promoted store's backup holds.
    write_more(&src, 5, &[]);
    let old_once = || {
        let mut cmd = binary::backup_once(UNUSED, &src, &url, &[]);
        quick(&mut cmd);
        cmd
    };
    refused("the old primary", old_once(), "the bucket lease is held by");

    // A node on the promoted store commits; its commits ship under the new lineage.
    write_more(&dir, 20, &[]);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let latest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
        if latest["lineage"] == new_lineage.as_str() && latest["commit_seq"] == applied + 20 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "LATEST never named the promoted store's commit {}: {latest}",
            applied + 20
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "the promoted backup exited {status}");

    // Afterwards the old primary is refused by the lineage rule, and the prefix restores to
    // exactly the promoted store. Its continuous run stops first: once the promoted backup
    // released the lease it may take it again for a moment (its next step is refused and
    // releases it), and a `--once` in that moment is refused by the lease, not the lineage.
    old.signal(libc::SIGTERM);
    old.wait_exit(WAIT);
    refused("the old primary", old_once(), "prefix refused");
    let restored = tmp.path().join("restored");
    binary::restore_digest(UNUSED, &url, &restored);
    assert_eq!(
        support::store::digest(&restored),
        support::store::digest(&dir)
    );
    assert_eq!(support::store::digest(&dir).commit_seq, applied + 20);
    // Every restore point after the promotion is the new lineage's.
    for (path, data) in support::store::tree(&bucket.join("manifests")) {
        let m: serde_json::Value = serde_json::from_slice(&data).unwrap();
        if m["commit_seq"].as_u64().unwrap() > applied {
            assert_eq!(m["lineage"], new_lineage.as_str(), "{}", path.display());
        }
    }
}

#[test]
fn poll_intervals_outside_their_range_are_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let url = support::file_url(&tmp.path().join("bucket"));
    for (flag, value) in [
        ("--poll-interval-ms", "99"),
        ("--poll-interval-ms", "3600001"),
        ("--idle-poll-interval-ms", "0"),
    ] {
        let mut cmd = binary::command("http://unused.invalid");
        cmd.args(["restore", "--follow", "--from", &url, "--to"])
            .arg(tmp.path().join("standby"))
            .args([flag, value]);
        refused(flag, cmd, flag);
    }
    let mut cmd = standby(
        "http://unused.invalid",
        &url,
        &tmp.path().join("standby"),
        2000,
        1000,
    );
    cmd.env_remove("MUSHROOMDB_BACKUP_LOG");
    refused(
        "idle below poll",
        cmd,
        "--idle-poll-interval-ms 1000 is below",
    );
    assert!(!tmp.path().join("standby").exists());
}

/// A promotion claims LATEST before it says "promoted" (`adopted_by`, `standby::promote`):
/// stopped before its first commit, the promoted store still holds the prefix against the old
/// primary (refused by the lineage rule once the lease is free), and its own backup goes on.
#[test]
fn a_promotion_stopped_before_any_commit_keeps_the_prefix_from_the_old_primary() {
    const UNUSED: &str = "http://unused.invalid";
    let tmp = tempfile::tempdir().unwrap();
    let (src, dir) = (tmp.path().join("src"), tmp.path().join("standby"));
    let bucket = tmp.path().join("bucket").join("p");
    let url = support::file_url(&bucket);
    binary::write_store(&src, 60);
    let once = |store: &Path| {
        let mut cmd = binary::backup_once(UNUSED, store, &url, &[]);
        quick(&mut cmd);
        cmd
    };
    binary::run_ok("backup --once", once(&src), WAIT);
    let mut s = Running::spawn("standby", standby(UNUSED, &url, &dir, 100, 200));
    wait_for_commit(&mut s, 60);
    stop(&mut s);
    let parent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
    // What the old primary ships next, kept aside: it lands after the promotion below (a
    // write delayed in the network).
    let aside = tmp.path().join("aside").join("p");
    copy_tree(&bucket, &aside);
    write_more(&src, 4, &[]);
    binary::run_ok(
        "the old primary's next segment",
        binary::backup_once(UNUSED, &src, &support::file_url(&aside), &[]),
        WAIT,
    );

    let mut cmd = binary::command(UNUSED);
    cmd.args(["promote", "--from", &url, "--dir"]).arg(&dir);
    quick(&mut cmd);
    let mut p = Running::spawn("promoted", cmd);
    let promoted = p.wait_for("promote", WAIT, |l| {
        let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
        v.get("promoted").cloned()
    });
    let new_lineage = promoted["new_lineage"].as_str().unwrap().to_string();
    // Already claimed when it says so: the parent's restore point, given to the new lineage.
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
    assert_eq!(latest["adopted_by"], new_lineage.as_str(), "{latest}");
    for field in ["manifest", "commit_seq", "lineage"] {
        assert_eq!(latest[field], parent[field], "{field}: {latest}");
    }
    assert_eq!(latest["adopted_at"]["commit_seq"], 60, "{latest}");
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "the promoted backup exited {status}");
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
    assert_eq!(latest["adopted_by"], new_lineage.as_str(), "{latest}");
    // The old primary's delayed segment lands now, continuing the generation LATEST names: a
    // restore stops where the promoted store's history ends (`adopted_at`), not past it.
    let wal = format!(
        "gen/{:010}/wal",
        promoted["applied"]["generation"].as_u64().unwrap()
    );
    let mut landed = 0;
    for e in std::fs::read_dir(aside.join(&wal)).unwrap() {
        let e = e.unwrap();
        let to = bucket.join(&wal).join(e.file_name());
        if !to.exists() {
            std::fs::copy(e.path(), &to).unwrap();
            landed += 1;
        }
    }
    assert!(landed > 0, "the old primary shipped no segment aside");
    // The restore says so: refused (exit 3) naming the segment past the claim, until told
    // that a partial restore is what is wanted.
    let cut = tmp.path().join("cut");
    let out = binary::command(UNUSED)
        .args(["restore", "--from", &url, "--json", "--to"])
        .arg(&cut)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&wal) && stderr.contains("claim"),
        "{stderr}"
    );
    assert!(!cut.exists());
    let out = binary::command(UNUSED)
        .args([
            "restore",
            "--from",
            &url,
            "--json",
            "--allow-partial",
            "--to",
        ])
        .arg(&cut)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(support::store::digest(&cut), support::store::digest(&dir));

    // The old primary, with new commits, once the lease is free (at once, or a TTL after the
    // promoted backup stopped before it took the lease over), is refused all the same;
    // nothing of it lands in the prefix.
    write_more(&src, 5, &[]);
    let before = support::store::tree_but_leases(&bucket);
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let out = once(&src).output().expect("the binary runs");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !out.status.success(),
            "the old primary was not refused: {err}"
        );
        if err.contains("the prefix was promoted") {
            break;
        }
        assert!(
            err.contains("the bucket lease is held by") && std::time::Instant::now() < deadline,
            "the old primary: refused, but not for the promotion: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(support::store::tree_but_leases(&bucket), before);
    // A second promotion of another standby of the same lineage is refused too.
    let other = tmp.path().join("other");
    let out = binary::command(UNUSED)
        .args(["restore", "--from", &url, "--allow-partial", "--to"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut cmd = binary::command(UNUSED);
    cmd.args(["promote", "--from", &url, "--dir"]).arg(&other);
    quick(&mut cmd);
    refused("a second promotion", cmd, "promoted already");

    // The promoted store's backup goes on: its first commit moves LATEST to its lineage, and
    // the prefix restores to it.
    write_more(&dir, 7, &[]);
    binary::run_ok("backup --once of the promoted store", once(&dir), WAIT);
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
    assert_eq!(latest["lineage"], new_lineage.as_str(), "{latest}");
    assert!(latest.get("adopted_by").is_none(), "{latest}");
    let restored = tmp.path().join("restored");
    binary::restore_digest(UNUSED, &url, &restored);
    assert_eq!(
        support::store::digest(&restored),
        support::store::digest(&dir)
    );
    assert_eq!(support::store::digest(&dir).commit_seq, 67);
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Two promotions racing on one prefix (two standbys of it, the old primary gone): exactly one
/// wins (the lease object's conditional create or takeover lets one write land), and the other
/// is refused, nothing changed, naming the winner's store.
#[test]
fn two_promotions_racing_one_wins_and_the_other_names_it() {
    const UNUSED: &str = "http://unused.invalid";
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let bucket = tmp.path().join("bucket").join("p");
    let url = support::file_url(&bucket);
    binary::write_store(&src, 40);
    binary::run_ok(
        "backup --once",
        binary::backup_once(UNUSED, &src, &url, &[]),
        WAIT,
    );
    let dirs = [tmp.path().join("a"), tmp.path().join("b")];
    for dir in &dirs {
        let mut s = Running::spawn("standby", standby(UNUSED, &url, dir, 100, 200));
        wait_for_commit(&mut s, 40);
        stop(&mut s);
    }
    let mut racers: Vec<Running> = dirs
        .iter()
        .map(|dir| {
            let mut cmd = binary::command(UNUSED);
            cmd.args(["promote", "--from", &url, "--dir"]).arg(dir);
            quick(&mut cmd);
            Running::spawn("promote", cmd)
        })
        .collect();
    // The loser ends (refused); the winner backs up until stopped.
    let deadline = std::time::Instant::now() + WAIT;
    let loser = loop {
        if let Some(i) = racers.iter_mut().position(|r| r.try_exit().is_some()) {
            break i;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "neither promotion ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let winner = 1 - loser;
    let status = racers[loser].try_exit().unwrap();
    let err = racers[loser].stderr();
    assert!(!status.success(), "both promotions ended: {err}");
    assert!(!dirs[loser].join("backup.parent").exists());
    let promoted_line = |l: &binary::Line| {
        let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
        v.get("promoted").cloned()
    };
    // Polling for the loser's exit read the winner's lines too.
    let promoted = match racers[winner].seen().iter().find_map(promoted_line) {
        Some(p) => p,
        None => racers[winner].wait_for("promoted", WAIT, promoted_line),
    };
    // Refused at the lease (its write landed second), or, when it took the lease from the
    // winner in between, at LATEST, which the winner claimed first.
    let at_lease = err.contains("refused, nothing changed")
        && err.contains("held by")
        && err.contains(&format!("(store {})", dirs[winner].display()));
    let at_latest = err.contains(&format!(
        "promoted already: LATEST gives manifests/{:020}.json to lineage {}",
        40,
        promoted["new_lineage"].as_str().unwrap()
    ));
    assert!(
        at_lease || at_latest,
        "the loser does not name the winner: {err}"
    );
    let latest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bucket.join("LATEST")).unwrap()).unwrap();
    assert_eq!(latest["adopted_by"], promoted["new_lineage"], "{latest}");
    stop(&mut racers[winner]);
}

/// `promote` of an encrypted prefix takes the prefix's key (`--encryption-key-file`, or its
/// variable): the catch-up opens the sealed segments past the standby with it, and the
/// promoted store's backup wraps its generation's key with it. Found by the promotion soak
/// with `SOAK_KEY=1` (issue 40): the flag did not exist, the catch-up opened nothing and the
/// promoted backup was refused for good ("the prefix holds encrypted generations and this
/// backup has no encryption key"). Without the key, the promotion is refused naming it and
/// leaves LATEST as it was.
#[test]
fn an_encrypted_prefix_is_promoted_with_its_key_and_its_promoted_store_ships() {
    const UNUSED: &str = "http://unused.invalid";
    let tmp = tempfile::tempdir().unwrap();
    let (src, dir) = (tmp.path().join("src"), tmp.path().join("standby"));
    let bucket = tmp.path().join("bucket").join("p");
    let url = support::file_url(&bucket);
    let kf = tmp.path().join("k.key");
    let mut new = binary::command(UNUSED);
    new.args(["key", "new"]);
    std::fs::write(&kf, binary::run_ok("key new", new, WAIT)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key = ["--encryption-key-file", kf.to_str().unwrap()];

    binary::write_store(&src, 40);
    binary::run_ok(
        "backup --once",
        binary::backup_once(UNUSED, &src, &url, &key),
        WAIT,
    );
    let mut follow = standby(UNUSED, &url, &dir, 100, 200);
    follow.args(key);
    let mut s = Running::spawn("standby", follow);
    wait_for_commit(&mut s, 40);
    stop(&mut s);
    // More shipped past the standby, sealed, for the catch-up to open.
    write_more(&src, 20, &[]);
    binary::run_ok(
        "backup --once",
        binary::backup_once(UNUSED, &src, &url, &key),
        WAIT,
    );
    let latest = std::fs::read(bucket.join("LATEST")).unwrap();

    let promote = |with_key: bool| {
        let mut cmd = binary::command(UNUSED);
        cmd.env_remove("MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE")
            .args(["promote", "--from", &url, "--dir"])
            .arg(&dir);
        if with_key {
            cmd.args(key);
        }
        quick(&mut cmd);
        cmd
    };
    let err = refused("promote without the key", promote(false), "key");
    assert!(err.contains("refused") || err.contains("wrapped"), "{err}");
    assert_eq!(
        std::fs::read(bucket.join("LATEST")).unwrap(),
        latest,
        "a refused promotion changed LATEST"
    );

    let mut p = Running::spawn("promoted", promote(true));
    let promoted = p.wait_for("promote", WAIT, |l| {
        let v: serde_json::Value = serde_json::from_str(&l.text).ok()?;
        v.get("promoted").cloned()
    });
    let applied = promoted["applied"]["commit_seq"].as_u64().unwrap();
    assert_eq!(applied, 60, "{promoted}");
    write_more(&dir, 5, &[]);
    binary::wait_shipped_past(&mut p, applied, WAIT);
    stop(&mut p);
}
