//! Decompression bombs in a bucket (issue 25, part 1), through the real binary: a 1 MiB zstd
//! frame of RLE blocks (32 GiB of zeros) named as a segment past the newest restore point,
//! its key claiming 2^40 plain bytes, and a manifest entry re-sealed to name a bomb and claim
//! 2^35 plain bytes. `restore` and `verify` fail cleanly naming the object and leave no
//! target; `serve` answers `Adopt` from the first prefix and `Drill` of a store holding the
//! second with errors naming the object, stays up, keeps backing up its other store, and its
//! peak resident memory (VmHWM) stays under [`PEAK_RSS_MAX`].
//!
//! Every child runs with its address space capped ([`AS_CAP`]), so that a regression aborts
//! the child (and fails the test) rather than taking the machine's memory: today's main dies
//! on `memory allocation of … bytes failed` in each case.

mod support;

use std::path::Path;

use mushroom_backup::bucket::GET_MAX;
use mushroom_backup::service::proto;
use support::binary::{self, command, run_ok};
use support::hostile::{
    bomb_blocks, cap_address_space, latest_manifest, names, peak_rss, replace_object, segment_past,
    zstd_bomb,
};
use support::served::{self, client, fast_serve, wait_health};

const NO_S3: &str = "http://unused.invalid";
/// The address space a child may map (a debug `serve` maps well under 1 GiB).
const AS_CAP: u64 = 4 << 30;
/// The peak resident memory `serve` may reach through the hostile calls.
const PEAK_RSS_MAX: u64 = 512 << 20;

/// A 1 MiB bomb named as a segment past the newest restore point of the `file://` bucket
/// `bucket`, claiming 2^40 plain bytes: its key.
fn plant_segment_bomb(bucket: &Path) -> String {
    let (_, m) = latest_manifest(bucket);
    let key = segment_past(&m, 1 << 40);
    std::fs::write(bucket.join(&key), zstd_bomb(bomb_blocks(1 << 20))).unwrap();
    key
}

/// The newest manifest's snapshot entry re-sealed to name a 256 KiB bomb (8 GiB of zeros)
/// and to claim 2^35 plain bytes: the object's key.
fn plant_manifest_bomb(bucket: &Path) -> String {
    let (path, mut m) = latest_manifest(bucket);
    let entry = &mut m["snapshot"];
    assert!(entry.is_object(), "the restore point has a snapshot: {m}");
    let key = entry["key"].as_str().unwrap().to_string();
    replace_object(bucket, entry, &zstd_bomb(bomb_blocks(256 << 10)), 1 << 35);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    key
}

/// `backup --once` of `store` into the `file://` bucket `bucket`.
fn backup_once(store: &Path, bucket: &Path) {
    let mut cmd = command(NO_S3);
    cmd.args(["backup", "--store"])
        .arg(store)
        .args(["--to", &support::file_url(bucket), "--once"]);
    run_ok("backup --once", cmd, served::DEADLINE);
}

/// Runs `args` on the binary with its address space capped: success, and stderr.
fn run_capped(args: &[&str]) -> (bool, String) {
    let (ok, _, stderr) = run_capped_output(args);
    (ok, stderr)
}

/// [`run_capped`], with stdout too: success, stdout, stderr.
fn run_capped_output(args: &[&str]) -> (bool, String, String) {
    let mut cmd = command(NO_S3);
    cmd.args(args);
    cap_address_space(&mut cmd, AS_CAP);
    let out = cmd.output().expect("run the binary");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn restore_refuses_a_segment_key_claiming_more_than_a_writer_ships() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, work) = (t.path().join("s"), t.path().join("b"), t.path().join("w"));
    std::fs::create_dir(&work).unwrap();
    binary::write_store(&store, 400);
    backup_once(&store, &bucket);
    let key = plant_segment_bomb(&bucket);

    let target = work.join("restored");
    let url = support::file_url(&bucket);
    let (ok, stderr) = run_capped(&["restore", "--from", &url, "--to", target.to_str().unwrap()]);
    assert!(!ok, "the restore succeeded: {stderr}");
    assert!(
        stderr.contains(&key) && stderr.contains("1099511627776"),
        "the error names the object and its claim: {stderr}"
    );
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    assert_eq!(names(&work), Vec::<String>::new(), "left beside the target");
    // The same prefix restores at its restore point, where the bomb is not asked for.
    let (ok, stderr) = run_capped(&[
        "restore",
        "--from",
        &url,
        "--to",
        target.to_str().unwrap(),
        "--restore-point-only",
    ]);
    assert!(ok, "{stderr}");
}

/// Every object but the segments (whose lengths their keys fix) of the newest manifest restated
/// as 5 TiB stored (each within what one object may hold): a restore would have planned one ranged GET per 16 MiB of 20 TiB and more before
/// its first request. The total is refused before anything is sized by it, naming an object.
#[test]
fn restore_refuses_a_manifest_whose_objects_add_up_past_what_a_restore_plans() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, work) = (t.path().join("s"), t.path().join("b"), t.path().join("w"));
    std::fs::create_dir(&work).unwrap();
    support::store::write(&store, 300, 100, 4096);
    backup_once(&store, &bucket);
    let (path, mut m) = latest_manifest(&bucket);
    let mut stated = 0;
    let mut restate = |e: &mut serde_json::Value| {
        if e.is_object() {
            e["len"] = (5u64 << 40).into();
            stated += 1;
        }
    };
    restate(&mut m["snapshot"]);
    for list in ["archives", "side_files"] {
        if let Some(entries) = m.get_mut(list).and_then(|v| v.as_array_mut()) {
            entries.iter_mut().for_each(&mut restate);
        }
    }
    assert!(
        stated >= 4,
        "the restore point names at least four objects: {m}"
    );
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();

    let target = work.join("restored");
    let url = support::file_url(&bucket);
    let (ok, stderr) = run_capped(&["restore", "--from", &url, "--to", target.to_str().unwrap()]);
    assert!(!ok, "the restore succeeded: {stderr}");
    assert!(
        stderr.contains("more than one restore plans") && stderr.contains("gen/"),
        "the error names the total and an object: {stderr}"
    );
    assert_eq!(names(&work), Vec::<String>::new(), "left beside the target");
}

#[test]
fn restore_and_verify_refuse_a_manifest_entry_claiming_more_than_its_bytes_decode_to() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, work) = (t.path().join("s"), t.path().join("b"), t.path().join("w"));
    std::fs::create_dir(&work).unwrap();
    support::store::write(&store, 300, 100, 4096);
    backup_once(&store, &bucket);
    let key = plant_manifest_bomb(&bucket);
    let url = support::file_url(&bucket);

    let target = work.join("restored");
    let (ok, stderr) = run_capped(&["restore", "--from", &url, "--to", target.to_str().unwrap()]);
    assert!(!ok, "the restore succeeded: {stderr}");
    assert!(
        stderr.contains(&key) && stderr.contains("34359738368"),
        "the error names the object and its claim: {stderr}"
    );
    assert_eq!(names(&work), Vec::<String>::new(), "left beside the target");

    let mut cmd = command(NO_S3);
    cmd.args(["verify", "--from", &url]);
    cap_address_space(&mut cmd, AS_CAP);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "verify passed: {stdout}");
    assert!(
        stdout.contains("FAIL") && stdout.contains(&key) && stdout.contains("34359738368"),
        "verify names the object: {stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_answers_adopt_and_drill_of_bombs_with_errors_and_keeps_backing_up() {
    let d = served::dirs();
    // The hostile prefix Adopt is asked to restore from.
    let (h_store, hostile) = (d.base.join("h-store"), d.base.join("hostile"));
    binary::write_store(&h_store, 300);
    backup_once(&h_store, &hostile);
    let segment_bomb = plant_segment_bomb(&hostile);

    let (other, drilled) = (d.root.join("other"), d.root.join("drilled"));
    support::store::write(&other, 200, 0, 4096);
    support::store::write(&drilled, 300, 100, 4096);
    let mut cmd = fast_serve(&d, &[]);
    cap_address_space(&mut cmd, AS_CAP);
    let (server, addr) = served::start("serve", cmd);
    let c = client(addr).await;
    let mut ids = Vec::new();
    let mut tokens = Vec::new();
    for (dir, bucket) in [(&other, "b-other"), (&drilled, "b-drilled")] {
        let r = c
            .clone()
            .register(support::register_req(
                dir,
                &support::file_url(&d.base.join(bucket)),
            ))
            .await
            .expect("Register")
            .into_inner();
        ids.push(r.store_id);
        tokens.push(r.node_token);
    }
    for (id, n) in [(&ids[0], 200), (&ids[1], 300)] {
        wait_health(&c, id, &format!("{n} commits in a restore point"), |h| {
            h.healthy && h.restore_point_commit_seq == n
        })
        .await;
    }
    let manifest_bomb = plant_manifest_bomb(&d.base.join("b-drilled"));

    // Adopt from the prefix with the segment bomb: an error naming it.
    let adopted = d.root.join("adopted");
    let err = c
        .clone()
        .adopt(proto::AdoptRequest {
            store_dir: adopted.to_str().unwrap().into(),
            destination: support::file_url(&hostile),
            ..Default::default()
        })
        .await
        .expect_err("Adopt from a prefix holding a bomb");
    assert!(
        err.message().contains(&segment_bomb) && err.message().contains("1099511627776"),
        "{err:?}"
    );
    assert!(!adopted.exists(), "Adopt left its target");

    // Drill of the store whose restore point names a bomb: failed, naming it.
    let drill = c
        .clone()
        .drill(proto::DrillRequest {
            store_id: ids[1].clone(),
            at_commit_seq: 0,
        })
        .await;
    let why = match drill {
        Ok(r) => {
            let r = r.into_inner();
            assert!(!r.ok, "the drill of a bomb succeeded: {r:?}");
            r.error
        }
        Err(status) => status.message().to_string(),
    };
    assert!(
        why.contains(&manifest_bomb) && why.contains("34359738368"),
        "the drill names the object: {why}"
    );

    // The service is up and its other store keeps backing up.
    served::node_writes(addr, &other, &ids[0], &tokens[0], 50);
    wait_health(&c, &ids[0], "250 commits in a restore point", |h| {
        h.healthy && h.restore_point_commit_seq == 250
    })
    .await;
    let peak = peak_rss(server.pid());
    assert!(
        peak < PEAK_RSS_MAX,
        "serve's peak resident memory {peak} bytes, over {PEAK_RSS_MAX}"
    );
    let mut server = server;
    served::terminate(&mut server);
}

/// The bomb is what it says: zstd decodes it to zeros, 128 KiB a block.
#[test]
fn the_bomb_decodes_to_zeros() {
    use std::io::Read;
    let bomb = zstd_bomb(40);
    let mut plain = Vec::new();
    zstd::stream::read::Decoder::new(&bomb[..])
        .unwrap()
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain.len(), 40 * (128 << 10));
    assert!(plain.iter().all(|b| *b == 0));
}

/// An honest object whose stored bytes decode to far more than the decoder holds in memory
/// (`restore::decode::PENDING_MAX`, one feed of 256 KiB of zstd of zeros): the plain bytes
/// past the bound go to the file and are read back from it by the format's reader, and the
/// restored `wal.bin` is byte for byte the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_decodes_past_the_memory_bound_restores_exactly() {
    use mushroom_backup::restore::{self, RestoreOptions};
    use mushroom_backup::store::format::{WalHeader, encode_frame};
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, target) = (t.path().join("s"), t.path().join("b"), t.path().join("t"));
    std::fs::create_dir(&store).unwrap();
    let mut wal = WalHeader {
        wal_id: uuid::Uuid::new_v4(),
        number: 1,
        floor: 0,
    }
    .encode()
    .to_vec();
    for seq in 1..=12 {
        encode_frame(seq, &vec![0u8; 1 << 20], &mut wal);
    }
    std::fs::write(store.join("wal.bin"), &wal).unwrap();
    let b = support::store::fs_bucket(&bucket);
    support::store::worker(&store, b.clone(), support::store::config())
        .run_once()
        .await
        .expect("back up");
    let (_, m) = latest_manifest(&bucket);
    let segment = &m["segments"][0];
    assert_eq!(segment["codec"], "zstd", "{m}");
    assert!(segment["len"].as_u64().unwrap() < 64 << 10, "{m}");

    let report = restore::restore(b.as_ref(), &target, &RestoreOptions::default())
        .await
        .expect("restore");
    assert_eq!(report.commit_seq, 12);
    assert!(
        std::fs::read(target.join("wal.bin")).unwrap() == wal,
        "wal.bin differs"
    );
    let verified = mushroom_backup::verify::verify(b.as_ref(), &Default::default())
        .await
        .unwrap();
    assert!(verified.ok, "{verified}");
}

/// LATEST, then the newest manifest, grown (sparse) one byte past [`GET_MAX`]: a whole-object
/// read refuses a longer object before reading it, naming it and the bound, so that a hostile
/// one of any length costs no memory (one of 4 GiB would abort these capped children without
/// the bound; a bucket directory's listing hashes each object it has no ETag of, which makes
/// such a length slow to list here). The prefix restores again once the object is put back.
#[test]
fn restore_and_ls_refuse_a_pointer_or_a_manifest_longer_than_a_whole_read_takes() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, work) = (t.path().join("s"), t.path().join("b"), t.path().join("w"));
    std::fs::create_dir(&work).unwrap();
    binary::write_store(&store, 50);
    backup_once(&store, &bucket);
    let url = support::file_url(&bucket);
    let target = work.join("restored");
    let (manifest, _) = latest_manifest(&bucket);
    let manifest_key = manifest.strip_prefix(&bucket).unwrap().to_str().unwrap();
    for (key, path) in [
        ("LATEST", bucket.join("LATEST")),
        (manifest_key, manifest.clone()),
    ] {
        let kept = std::fs::read(&path).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(GET_MAX + 1).unwrap();
        drop(file);
        let bound = format!("more than the {GET_MAX} this read takes");
        let names_it = |text: &str| text.contains(key) && text.contains(&bound);
        let restore = ["restore", "--from", &url, "--to", target.to_str().unwrap()];
        let (ok, _, stderr) = run_capped_output(&restore);
        assert!(
            !ok,
            "restore succeeded over a {key} past the bound: {stderr}"
        );
        assert!(
            names_it(&stderr),
            "restore names {key} and the bound: {stderr}"
        );
        assert!(!stderr.contains("memory allocation"), "{stderr}");
        assert_eq!(names(&work), Vec::<String>::new(), "left beside the target");
        // `ls` fails on LATEST and lists a manifest it cannot read as INVALID, saying why.
        let (ok, stdout, stderr) = run_capped_output(&["ls", "--from", &url]);
        assert_eq!(
            ok,
            key != "LATEST",
            "ls over a {key} past the bound: {stderr}"
        );
        let said = if ok { &stdout } else { &stderr };
        assert!(
            names_it(said),
            "ls names {key} and the bound: {stdout}{stderr}"
        );
        std::fs::write(&path, kept).unwrap();
    }
    let (ok, stderr) = run_capped(&["restore", "--from", &url, "--to", target.to_str().unwrap()]);
    assert!(
        ok,
        "the prefix restores once the objects are put back: {stderr}"
    );
}

/// Finding 6 of security review 4: a manifest entry may claim up to 32,768 times its stored
/// bytes (what zstd can make of them), and a restore wrote the claim to disk before the CRC
/// could fail. Now a plan whose entries claim more plain bytes than the target's file system
/// has free is refused before anything is downloaded, naming both figures; nothing is left.
#[test]
fn restore_refuses_a_plan_claiming_more_than_the_target_disk_holds() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket, work) = (t.path().join("s"), t.path().join("b"), t.path().join("w"));
    std::fs::create_dir(&work).unwrap();
    support::store::write(&store, 300, 100, 4096);
    backup_once(&store, &bucket);
    let v = rustix::fs::statvfs(&work).unwrap();
    let free = v.f_bavail * v.f_frsize;
    // Twice the free space, from a bomb just large enough to claim it.
    let claim = free.saturating_mul(2);
    let stored = usize::try_from(claim / 32_768).unwrap() + (64 << 10);
    let (path, mut m) = latest_manifest(&bucket);
    let entry = &mut m["snapshot"];
    replace_object(&bucket, entry, &zstd_bomb(bomb_blocks(stored)), claim);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();

    let target = work.join("restored");
    let url = support::file_url(&bucket);
    let (ok, stderr) = run_capped(&["restore", "--from", &url, "--to", target.to_str().unwrap()]);
    assert!(!ok, "the restore succeeded: {stderr}");
    let needed: u64 = stderr
        .split_once("writes up to ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the error names what the restore would write: {stderr}"));
    assert!(
        needed >= claim && stderr.contains("bytes free: refused before downloading"),
        "the error names the claim and the free space: {stderr}"
    );
    assert_eq!(names(&work), Vec::<String>::new(), "left beside the target");
}
