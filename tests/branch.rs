//! Branches (`mushroom-backup branch`, `crate::branch`): a branch restores to exactly the
//! parent's state at its fork, byte for byte, for a handful of requests and a few KiB
//! written; it survives the parent's most aggressive retention (its pin holds what it names);
//! writes to the branch and to the parent do not see each other; `branch delete` releases
//! the pin and the next retention reclaims what only the branch held (the bucket's inventory
//! before and after); a pin whose branch never appeared is reclaimed after its grace.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use mushroom_backup::bucket::{self, DynBucket};
use mushroom_backup::manifest::{self, Manifest};
use mushroom_backup::worker::RetentionPolicy;
use mushroom_backup::worker::retention_pass::pass;
use support::binary::{command, json, run_ok, store_digest, verify_ok};
use support::store::{config, digest, fs_bucket, worker, write};

const T: Duration = Duration::from_secs(60);

fn url(p: &Path) -> String {
    support::store::file_url(p)
}

async fn keys(b: &DynBucket) -> BTreeSet<String> {
    support::store::keys_under(b, "").await
}

async fn manifests(b: &DynBucket) -> Vec<Manifest> {
    let mut out = Vec::new();
    for o in bucket::list_all(b.as_ref(), manifest::MANIFESTS_PREFIX)
        .await
        .unwrap()
    {
        let got = b.get(&o.key).await.unwrap();
        out.push(Manifest::decode(&o.key, &got.data).unwrap());
    }
    out
}

use support::store::newest_generation_only as aggressive;

fn branch(from: &str, at: u64, to: &str) -> serde_json::Value {
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args([
        "branch",
        "--from",
        from,
        "--at",
        &at.to_string(),
        "--to",
        to,
        "--json",
    ]);
    json(&run_ok("branch", cmd, T))
}

fn restored(from: &str, into: &Path, at: Option<u64>) -> serde_json::Value {
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args([
        "restore",
        "--from",
        from,
        "--json",
        "--progress",
        "none",
        "--to",
    ])
    .arg(into);
    if let Some(n) = at {
        cmd.args(["--at", &n.to_string()]);
    }
    run_ok("restore", cmd, T);
    store_digest(into)
}

fn fails(args: &[&str]) -> String {
    let out = command("http://127.0.0.1:9").args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn branches_restore_the_parent_at_their_fork_through_its_retention_and_go_with_delete() {
    let t = tempfile::tempdir().unwrap();
    let (store, p) = (t.path().join("s"), t.path().join("b/parent"));
    // Four generations (a snapshot every 150 commits), a restore point each.
    support::store::generations(&store, &p, 4).await;
    let parent = fs_bucket(&p);
    // Forks inside every restore point's WAL, at its end, and a branch of a branch.
    let mut forks = Vec::new();
    for m in manifests(&parent).await {
        let snap = m.snapshot.as_ref().map_or(0, |s| s.commit_seq);
        forks.push(snap + (m.commit_seq - snap) / 3);
        forks.push(m.commit_seq);
    }
    let mut branches = Vec::new();
    for (i, n) in forks.iter().enumerate() {
        let b = t.path().join(format!("b/branch-{i}"));
        let expected = restored(&url(&p), &t.path().join(format!("expected-{i}")), Some(*n));
        let report = branch(&url(&p), *n, &url(&b));
        assert_eq!(report["commit_seq"], *n, "{report}");
        assert!(report["requests"].as_u64().unwrap() <= 10, "{report}");
        assert!(
            report["bytes_written"].as_u64().unwrap() <= 64 << 10,
            "{report}"
        );
        branches.push((b, *n, expected));
    }
    let (b0, n0, e0) = branches[0].clone();
    let c = t.path().join("b/branch-of-branch");
    let report = branch(&url(&b0), n0, &url(&c));
    assert_eq!(
        report["holder"],
        url(&p),
        "a branch of a branch pins the parent: {report}"
    );
    branches.push((c, n0, e0));

    // `ls` of a branch: its fork point; a restore below the fork from the branch's own objects.
    let mut ls = command("http://127.0.0.1:9");
    ls.args(["ls", "--json", "--from", &url(&branches[1].0)]);
    let points = json(&run_ok("ls", ls, T));
    assert_eq!(points[0]["commit_seq"], branches[1].1, "{points}");

    // The most aggressive retention on the parent: every branch still restores, and verifies.
    let inventory = keys(&parent).await;
    let report = pass(&parent, &aggressive()).await.unwrap();
    assert!(report.deleted > 0, "the parent's retention deleted nothing");
    // Each branch is charged what it keeps alive only through its pin: every byte pinned and
    // named by no remaining restore point of the parent, each charged once across branches.
    let named: BTreeSet<String> = manifests(&parent)
        .await
        .iter()
        .flat_map(|m| m.objects().map(|o| o.key.clone()).collect::<Vec<_>>())
        .collect();
    let mut pinned = BTreeSet::new();
    for o in bucket::list_all(parent.as_ref(), manifest::PINS_PREFIX)
        .await
        .unwrap()
    {
        let got = parent.get(&o.key).await.unwrap();
        pinned.extend(manifest::Pin::decode(&o.key, &got.data).unwrap().keys);
    }
    let sizes: std::collections::BTreeMap<String, u64> = bucket::list_all(parent.as_ref(), "")
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.key, o.len))
        .collect();
    let only_pinned: u64 = pinned.difference(&named).map(|k| sizes[k]).sum();
    let charged: u64 = report.branch_charges.iter().map(|c| c.bytes).sum();
    assert!(only_pinned > 0, "no object is kept only for a branch");
    assert_eq!(charged, only_pinned, "{:?}", report.branch_charges);
    assert_eq!(
        report.branch_charges.len(),
        branches.len(),
        "one charge per live pin"
    );
    for (i, (b, _, expected)) in branches.iter().enumerate() {
        let got = restored(
            &url(b),
            &t.path().join(format!("after-retention-{i}")),
            None,
        );
        assert_eq!(
            &got,
            expected,
            "branch {} after the parent's retention",
            b.display()
        );
        verify_ok(
            "http://127.0.0.1:9",
            &url(b),
            "a branch after the parent's retention",
        );
    }
    let pinned: BTreeSet<String> = keys(&parent)
        .await
        .into_iter()
        .filter(|k| k.starts_with("gen/0000000001/"))
        .collect();
    assert!(
        !pinned.is_empty(),
        "nothing of the first generation is held"
    );

    // Deleted, the next retention reclaims what only the branches held.
    for (b, _, _) in &branches {
        let mut cmd = command("http://127.0.0.1:9");
        cmd.args(["branch", "delete", "--json", "--at", &url(b)]);
        let report = json(&run_ok("branch delete", cmd, T));
        assert_eq!(report["holder"], url(&p), "{report}");
    }
    let report = pass(&parent, &aggressive()).await.unwrap();
    assert!(
        report.deleted > 0,
        "nothing reclaimed after the branches went"
    );
    let after = keys(&parent).await;
    let newest = manifests(&parent).await;
    let named: BTreeSet<String> = newest
        .iter()
        .flat_map(|m| m.objects().map(|o| o.key.clone()))
        .collect();
    // A generation's claim stays while a remaining manifest names an object of it (a side
    // file reused since).
    let claim_kept =
        |k: &str| k.ends_with("/GENERATION") && named.iter().any(|n| n.starts_with(&k[..15]));
    for k in &pinned {
        assert!(
            named.contains(k) || claim_kept(k) || !after.contains(k),
            "{k} stayed after every branch holding it was deleted"
        );
    }
    assert!(
        !after.iter().any(|k| k.starts_with(manifest::PINS_PREFIX)),
        "pins or releases left: {after:?}"
    );
    assert!(after.len() < inventory.len(), "{inventory:?} -> {after:?}");
    verify_ok(
        "http://127.0.0.1:9",
        &url(&p),
        "the parent after the branches went",
    );
}

#[tokio::test]
async fn writes_to_a_branch_and_to_its_parent_do_not_see_each_other() {
    let t = tempfile::tempdir().unwrap();
    let (store, p, b) = (
        t.path().join("s"),
        t.path().join("b/parent"),
        t.path().join("b/branch"),
    );
    write(&store, 300, 100, 0);
    worker(&store, fs_bucket(&p), config())
        .run_once()
        .await
        .unwrap();
    let at_fork = digest(&store);
    branch(&url(&p), 300, &url(&b));
    let parent_before = keys(&fs_bucket(&p)).await;

    // The branch, restored as a store of its own and written to, backs up into its prefix.
    let forked = t.path().join("forked");
    let mut cmd = command("http://127.0.0.1:9");
    cmd.args([
        "restore",
        "--adopt",
        "--json",
        "--progress",
        "none",
        "--from",
        &url(&b),
        "--to",
    ])
    .arg(&forked);
    run_ok("restore --adopt", cmd, T);
    assert_eq!(digest(&forked).commit_seq, at_fork.commit_seq);
    support::store::write_with(
        &forked,
        mushroom_backup::store::engine::WriteOptions {
            commits: 80,
            seed: 2,
            ..Default::default()
        },
    );
    worker(&forked, fs_bucket(&b), config())
        .run_once()
        .await
        .unwrap();
    // A second run resumes from the store's own restore point: what it writes still names
    // where the prefix came from (health shows it, `ctl health`).
    write(&forked, 20, 0, 0);
    worker(&forked, fs_bucket(&b), config())
        .run_once()
        .await
        .unwrap();
    let in_branch = manifests(&fs_bucket(&b)).await;
    let fork = in_branch
        .iter()
        .find_map(|m| m.branch.clone())
        .expect("the branch manifest");
    assert_eq!(
        (fork.prefix.as_str(), fork.commit_seq),
        (url(&p).as_str(), 300)
    );
    let own: Vec<_> = in_branch.iter().filter(|m| m.branch.is_none()).collect();
    assert!(
        own.len() >= 2,
        "{} restore points of the branch store",
        own.len()
    );
    for m in own {
        assert_eq!(m.branched_from.as_ref(), Some(&fork), "{m:?}");
        assert_eq!(m.origin(), Some(&fork));
    }
    assert!(
        manifests(&fs_bucket(&p))
            .await
            .iter()
            .all(|m| m.origin().is_none()),
        "the parent's restore points name no branch"
    );
    let parent_after_branch = keys(&fs_bucket(&p)).await;
    assert_eq!(
        parent_before, parent_after_branch,
        "the branch wrote into its parent"
    );

    // The parent goes on too.
    write(&store, 50, 0, 0);
    worker(&store, fs_bucket(&p), config())
        .run_once()
        .await
        .unwrap();
    let got_parent = restored(&url(&p), &t.path().join("p-latest"), None);
    let got_branch = restored(&url(&b), &t.path().join("b-latest"), None);
    assert_eq!(got_parent, store_digest(&store));
    assert_eq!(got_branch, store_digest(&forked));
    assert_ne!(got_parent, got_branch);
    let got_fork = restored(&url(&b), &t.path().join("b-fork"), Some(300));
    assert_eq!(got_fork["digest"], at_fork.digest.to_string());
}

#[tokio::test]
async fn a_pin_whose_branch_never_appeared_is_reclaimed_after_its_grace_and_junk_holds_nothing() {
    let t = tempfile::tempdir().unwrap();
    let (store, p) = (t.path().join("s"), t.path().join("b/parent"));
    support::store::generations(&store, &p, 2).await;
    let parent = fs_bucket(&p);
    // The generations were claimed two hours ago: past the grace below, so only the pin can
    // keep the first one's objects within it.
    let two_hours_ago =
        mushroom_backup::units::rfc3339_ms(mushroom_backup::units::unix_now_ms() - 2 * 3_600_000);
    for key in keys(&parent)
        .await
        .iter()
        .filter(|k| k.ends_with("/GENERATION"))
    {
        let got = parent.get(key).await.unwrap();
        let mut claim = manifest::GenerationClaim::decode(key, &got.data).unwrap();
        claim.created_at = two_hours_ago.clone();
        parent
            .put(key, claim.encode().into(), bucket::PutCondition::None)
            .await
            .unwrap();
    }
    let first = manifests(&parent).await.remove(0);
    // What a branch crashed right after its pin leaves: the pin, no branch manifest.
    let lineage = uuid::Uuid::new_v4();
    let pin = manifest::Pin {
        branch: url(&t.path().join("b/never")),
        lineage,
        manifest: first.key(),
        commit_seq: first.commit_seq,
        created_at: manifest::now_rfc3339(),
        keys: first.objects().map(|o| o.key.clone()).collect(),
        lens: first.objects().map(|o| o.len).collect(),
    };
    parent
        .put(
            &manifest::pin_key(lineage),
            pin.encode().into(),
            bucket::PutCondition::IfNoneMatch,
        )
        .await
        .unwrap();
    let junk = manifest::pin_key(uuid::Uuid::new_v4());
    parent
        .put(
            &junk,
            b"{not a pin".to_vec().into(),
            bucket::PutCondition::None,
        )
        .await
        .unwrap();
    // Within its grace it holds (the first generation's objects are named by no manifest the
    // pass keeps, and are past their own grace).
    let held = RetentionPolicy {
        orphan_grace: Duration::from_secs(3600),
        ..aggressive()
    };
    pass(&parent, &held).await.unwrap();
    let listed = keys(&parent).await;
    assert!(listed.contains(&manifest::pin_key(lineage)));
    for o in first.objects() {
        assert!(
            listed.contains(&o.key),
            "{} went within the pin's grace",
            o.key
        );
    }
    // Past it, with no branch manifest behind it, it is reclaimed and so is what it held; the
    // junk pin stays (no branch wrote it) and held nothing.
    pass(&parent, &aggressive()).await.unwrap();
    let listed = keys(&parent).await;
    assert!(!listed.contains(&manifest::pin_key(lineage)), "{listed:?}");
    assert!(listed.contains(&junk));
    let newest: BTreeSet<String> = manifests(&parent)
        .await
        .iter()
        .flat_map(|m| m.objects().map(|o| o.key.clone()))
        .collect();
    for o in first.objects().filter(|o| !newest.contains(&o.key)) {
        assert!(
            !listed.contains(&o.key),
            "{} stayed for a pin without a branch",
            o.key
        );
    }
}

#[tokio::test]
async fn a_branch_refuses_what_it_cannot_be_and_names_why() {
    let t = tempfile::tempdir().unwrap();
    let (store, p) = (t.path().join("s"), t.path().join("b/parent"));
    write(&store, 300, 100, 0);
    worker(&store, fs_bucket(&p), config())
        .run_once()
        .await
        .unwrap();
    let from = url(&p);
    let inventory = keys(&fs_bucket(&p)).await;
    let inside = url(&p.join("inner"));
    let e = fails(&["branch", "--from", &from, "--at", "250", "--to", &inside]);
    assert!(e.contains("overlaps"), "{e}");
    let e = fails(&["branch", "--from", &from, "--at", "250", "--to", &from]);
    assert!(e.contains("overlaps"), "{e}");
    let busy = t.path().join("b/busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("something"), b"x").unwrap();
    let e = fails(&[
        "branch",
        "--from",
        &from,
        "--at",
        "250",
        "--to",
        &url(&busy),
    ]);
    assert!(e.contains("holds something already"), "{e}");
    let e = fails(&[
        "branch",
        "--from",
        &from,
        "--at",
        "9999",
        "--to",
        &url(&t.path().join("b/x")),
    ]);
    assert!(
        e.contains("reachable"),
        "the refusal names what is reachable: {e}"
    );
    let e = fails(&["branch", "delete", "--at", &from]);
    assert!(e.contains("is not a branch"), "{e}");
    assert_eq!(
        keys(&fs_bucket(&p)).await,
        inventory,
        "a refused branch changed the parent"
    );
}

/// `branch --at-time` finds its fork from the newest restore point at the instant and its
/// generation's segments (`branch::fork::at_time`), not from every manifest: at every instant
/// of a parent's history (each manifest's and segment's time in the bucket, and a millisecond
/// either side) it forks at the commit `restore --at-time` restores, for at most nine requests
/// of its own; and a restore of the branch at its own instant restores the fork.
#[tokio::test]
async fn a_branch_at_an_instant_forks_where_restore_at_time_restores_in_few_requests() {
    let t = tempfile::tempdir().unwrap();
    let (store, p) = (t.path().join("s"), t.path().join("b/parent"));
    support::store::generations(&store, &p, 3).await;
    // Four more rounds in the last generation, whose manifests are then deleted but the
    // third's, as if those runs had died before writing them: the first two rounds' segments
    // are named only by a later manifest (a cut), the fourth's by none (an extension).
    let parent = fs_bucket(&p);
    let mut lost = Vec::new();
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(20));
        let before = keys(&parent).await;
        write(&store, 20, 0, 0);
        worker(&store, fs_bucket(&p), config())
            .run_once()
            .await
            .unwrap();
        if round != 2 {
            let new = keys(&parent).await;
            lost.extend(
                new.difference(&before)
                    .filter(|k| k.starts_with(manifest::MANIFESTS_PREFIX))
                    .cloned(),
            );
        }
    }
    assert_eq!(lost.len(), 3, "{lost:?}");
    for k in &lost {
        std::fs::remove_file(p.join(k)).unwrap();
    }
    let mut instants = BTreeSet::new();
    for o in bucket::list_all(parent.as_ref(), "").await.unwrap() {
        if o.key.starts_with(manifest::MANIFESTS_PREFIX) || o.key.contains("/wal/") {
            let ms = o.modified_ms.expect("a file's time");
            instants.extend([ms - 1, ms, ms + 1]);
        }
    }
    let at_time = |args: &[&str], ms: i64| {
        let mut cmd = command("http://127.0.0.1:9");
        cmd.args(args)
            .args(["--at-time", &mushroom_backup::units::rfc3339_ms(ms)]);
        cmd
    };
    let (mut compared, mut in_tail) = (0, 0);
    let points = manifests(&parent).await;
    assert!(points.len() >= 3, "{} restore points", points.len());
    let last_manifest = points.iter().map(|m| m.commit_seq).max().unwrap();
    for (i, ms) in instants.into_iter().enumerate() {
        let into = t.path().join(format!("r-{i}"));
        let mut restore = at_time(&["restore", "--json", "--progress", "none"], ms);
        restore.arg("--from").arg(url(&p)).arg("--to").arg(&into);
        let out = restore.output().unwrap();
        if !out.status.success() {
            // Before the earliest restorable instant: the branch is refused too.
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("earliest"), "{err}");
            let b = url(&t.path().join(format!("b/refused-{i}")));
            let mut cmd = at_time(&["branch", "--from", &url(&p), "--to", &b], ms);
            assert!(
                !cmd.output().unwrap().status.success(),
                "branched before the earliest"
            );
            continue;
        }
        let restored = json(&String::from_utf8_lossy(&out.stdout));
        let b = t.path().join(format!("b/at-{i}"));
        let report = json(&run_ok(
            "branch --at-time",
            at_time(
                &["branch", "--json", "--from", &url(&p), "--to", &url(&b)],
                ms,
            ),
            T,
        ));
        assert_eq!(
            report["commit_seq"], restored["commit_seq"],
            "at {ms}: {report}"
        );
        // Nine at most, and one more for each segment past the restore point it had to read
        // (a fork in segments no manifest names yet).
        let fork = &manifests(&fs_bucket(&b)).await[0];
        let point = manifests(&parent)
            .await
            .into_iter()
            .find(|m| manifest::manifest_key(m.commit_seq) == report["parent_manifest"])
            .unwrap();
        let read = (fork.segments.len() as u64).saturating_sub(point.segments.len() as u64);
        let read = if point.commit_seq < fork.commit_seq {
            read
        } else {
            0
        };
        assert!(
            report["requests"].as_u64().unwrap() <= 9 + read,
            "at {ms}: {read} segments read: {report}"
        );
        compared += 1;
        let n = report["commit_seq"].as_u64().unwrap();
        in_tail += u64::from(n > last_manifest);
        if i % 7 == 0 {
            // The branch at its own fork manifest's instant: the fork, cut where it was cut.
            let fork_ms = bucket::list_all(fs_bucket(&b).as_ref(), manifest::MANIFESTS_PREFIX)
                .await
                .unwrap()[0]
                .modified_ms
                .unwrap();
            let into = t.path().join(format!("rb-{i}"));
            let mut restore = at_time(&["restore", "--json", "--progress", "none"], fork_ms);
            restore.arg("--from").arg(url(&b)).arg("--to").arg(&into);
            let got = json(&run_ok("restore --at-time of the branch", restore, T));
            assert_eq!(got["commit_seq"], n, "{got}");
        }
    }
    assert!(
        compared >= 20 && in_tail > 0,
        "{compared} instants, {in_tail} in the tail"
    );
}
