//! Retention by tiers through the real binary on a local-directory bucket: `retention
//! --dry-run` names what a pass would delete and why and deletes nothing, and a pass
//! (`retention` without `--dry-run`) deletes exactly that, under the bucket lease, refused
//! while another holder's lease is live; `backup --once --keep-daily 1 --keep-for-ms 0` drops the
//! older restore points of the same day (which `keep_generations` alone would keep), and the
//! restore point kept still restores. (Which points each tier keeps over a simulated month
//! at chosen times is property-tested in `src/worker/tiers.rs`.)

mod support;

use std::path::Path;
use std::time::Duration;

use support::binary;

const WITHIN: Duration = Duration::from_secs(120);

fn mb(args: &[&str]) -> String {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(args);
    binary::run_ok(args[0], cmd, WITHIN)
}

fn manifests(bucket: &Path) -> usize {
    std::fs::read_dir(bucket.join("manifests"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
fn dry_run_names_what_goes_and_a_tiered_pass_keeps_only_the_newest_of_the_day() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, bucket) = (tmp.path().join("store"), tmp.path().join("bucket"));
    support::store::write(&store, 10, 0, 0);
    let url = support::file_url(&bucket);
    let s = store.to_str().unwrap();
    // Three restore points, at 10, 15 and 20 commits, one generation; nothing deleted.
    mb(&["backup", "--store", s, "--to", &url, "--once"]);
    for _ in 0..2 {
        support::store::commit_more(&store, 5);
        mb(&["backup", "--store", s, "--to", &url, "--once"]);
    }
    assert_eq!(manifests(&bucket), 3);

    let plan = binary::json(&mb(&[
        "retention",
        "--from",
        &url,
        "--dry-run",
        "--keep-for-ms",
        "0",
        "--keep-daily",
        "1",
        "--json",
    ]));
    let points = plan["restore_points"].as_array().unwrap();
    let by_seq = |seq: u64| {
        points
            .iter()
            .find(|p| p["commit_seq"] == seq)
            .unwrap_or_else(|| panic!("no restore point {seq}: {plan}"))
    };
    assert_eq!(by_seq(20)["keep"], true, "{plan}");
    for seq in [10, 15] {
        assert_eq!(by_seq(seq)["keep"], false, "{plan}");
        assert_eq!(by_seq(seq)["why"], "dropped: no rule keeps it", "{plan}");
    }
    assert_eq!(plan["deleted"], 2);
    assert_eq!(manifests(&bucket), 3, "a dry run deletes nothing");
    // The defaults (keep_for 7 days) keep all three, each saying why.
    let plan = binary::json(&mb(&["retention", "--from", &url, "--dry-run", "--json"]));
    assert_eq!(plan["deleted"], 0, "{plan}");
    // Without --dry-run, the defaults: a pass that keeps everything, under the lease, which
    // it releases.
    let done = binary::json(&mb(&["retention", "--from", &url, "--json"]));
    assert_eq!(done["deleted"], 0, "{done}");
    assert_eq!(manifests(&bucket), 3);
    assert!(!bucket.join("lease").exists(), "the pass left its lease");

    // A backup pass with the tiers: the two older points of the day go; the kept one restores.
    support::store::commit_more(&store, 5);
    mb(&[
        "backup",
        "--store",
        s,
        "--to",
        &url,
        "--once",
        "--keep-for-ms",
        "0",
        "--keep-daily",
        "1",
    ]);
    assert_eq!(
        manifests(&bucket),
        1,
        "only the newest restore point of the day is kept"
    );
    let restored = tmp.path().join("restored");
    let got = binary::restore_digest("http://unused.invalid", &url, &restored);
    assert_eq!(got, binary::store_digest(&store));
    assert_eq!(got["commit_seq"], 25);
}

/// The dry run and a pass decide by the one function (`worker::retention::keep`): with the
/// same settings, what `retention` without `--dry-run` leaves is exactly what the dry run said
/// it keeps. And while another holder's bucket lease is live the pass is refused, naming it.
#[test]
fn a_pass_leaves_exactly_what_the_dry_run_keeps_and_waits_its_turn_for_the_lease() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, bucket) = (tmp.path().join("store"), tmp.path().join("bucket"));
    support::store::write(&store, 10, 0, 0);
    let url = support::file_url(&bucket);
    let url = url.as_str();
    let s = store.to_str().unwrap();
    mb(&["backup", "--store", s, "--to", url, "--once"]);
    for _ in 0..3 {
        support::store::commit_more(&store, 5);
        mb(&["backup", "--store", s, "--to", url, "--once"]);
    }
    assert_eq!(manifests(&bucket), 4);
    let keep = ["--keep-for-ms", "0", "--keep-daily", "1", "--json"];
    let mut args = vec!["retention", "--from", url, "--dry-run"];
    args.extend(keep);
    let plan = binary::json(&mb(&args));
    let said: std::collections::BTreeSet<String> = plan["restore_points"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["keep"] == true)
        .map(|p| p["manifest_key"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(plan["deleted"], 3, "{plan}");

    // Another holder, live (its lease object just written): refused, naming it; nothing goes.
    let record = serde_json::json!({
        "holder": "holder-7f3a", "host": "db-host-2", "store": "/data/store", "ttl_ms": 30000,
        "renewals": 4, "acquired_at": "2026-12-03T11:00:00Z",
    });
    std::fs::write(bucket.join("lease"), record.to_string()).unwrap();
    let mut args = vec!["retention", "--from", url];
    args.extend(keep);
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(&args);
    let mut child = binary::Running::spawn("retention (lease held)", cmd);
    assert!(!child.wait_exit(WITHIN).success(), "{}", child.output());
    let out = child.output();
    assert!(
        out.contains("refused") && out.contains("holder-7f3a") && out.contains("db-host-2"),
        "{out}"
    );
    assert_eq!(manifests(&bucket), 4, "a refused pass deleted");

    std::fs::remove_file(bucket.join("lease")).unwrap();
    let done = binary::json(&mb(&args));
    assert_eq!(
        done["deleted"].as_u64().map(|d| d >= 3),
        Some(true),
        "{done}"
    );
    let left: std::collections::BTreeSet<String> = std::fs::read_dir(bucket.join("manifests"))
        .unwrap()
        .map(|e| format!("manifests/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    assert_eq!(left, said, "the pass and the dry run disagree");
    assert!(!bucket.join("lease").exists(), "the pass left its lease");
    let restored = tmp.path().join("restored");
    let got = binary::restore_digest("http://unused.invalid", url, &restored);
    assert_eq!(got, binary::store_digest(&store));
}
