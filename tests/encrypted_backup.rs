//! Encrypted backups end to end, through the binary, over `file://` and S3 (moto):
//! - a bucket scan after an encrypted backup finds no 32-byte window of the store's files in
//!   any object (and the same scan finds them after a plaintext backup, so it can fail);
//! - restore with the key gives the store's digest; without a key or with the wrong key, an
//!   error naming the key ids needed, and no target; `verify` without the key passes and says
//!   encrypted with the key id, with the key it authenticates, with a wrong key it fails;
//! - a backup resumed after a restart continues its generation with the key it opens;
//!   retention keeps the wrappers of what it keeps; rekey then restore with the new key, the
//!   old key refused;
//! - public-key mode: backup with `--encryption-recipient`, restore with
//!   `--encryption-identity-file`;
//! - fail closed: a missing, unparsable or unreadable key file, a bad recipient stop
//!   `backup` and `serve` before anything is uploaded (exit non-zero);
//! - mixing plaintext and encrypted generations in one prefix is refused, unless
//!   `--allow-mixed-encryption`.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::binary::{backup_once, command, json, run_ok, store_digest};
use support::dest::{Dest, NO_S3, destinations, files};

const WINDOW: usize = 32;

fn write(store: &Path, commits: u64, seed: u64) {
    let mut cmd = command(NO_S3);
    cmd.args(["store", "write"])
        .arg(store)
        .args(["--commits", &commits.to_string(), "--value-size", "1024"])
        .args(["--snapshot-every", "1500", "--rotate-bytes", "16777216"])
        .args(["--seed", &seed.to_string()]);
    run_ok("store write", cmd, Duration::from_secs(300));
}

/// Runs the binary; returns (success, stdout, stderr).
fn run(mut cmd: Command) -> (bool, String, String) {
    let out = cmd.output().expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn backup(endpoint: &str, store: &Path, to: &str, extra: &[&str]) -> (bool, String, String) {
    run(backup_once(endpoint, store, to, extra))
}

fn backup_ok(endpoint: &str, store: &Path, to: &str, extra: &[&str]) -> serde_json::Value {
    let (ok, out, err) = backup(endpoint, store, to, extra);
    assert!(ok, "backup {extra:?} failed: {err}");
    json(&out)
}

fn restore(endpoint: &str, from: &str, into: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut cmd = command(endpoint);
    cmd.args(["restore", "--from", from, "--json", "--to"])
        .arg(into)
        .args(extra);
    run(cmd)
}

fn restore_digest(endpoint: &str, from: &str, into: &Path, extra: &[&str]) -> serde_json::Value {
    let (ok, _, err) = restore(endpoint, from, into, extra);
    assert!(ok, "restore {extra:?} failed: {err}");
    store_digest(into)
}

fn verify(endpoint: &str, from: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    let mut cmd = command(endpoint);
    cmd.args(["verify", "--from", from, "--json"]).args(extra);
    let (ok, out, err) = run(cmd);
    let report = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
    (ok, report)
}

/// A fresh key file (0600) and its key id.
fn key_file(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let (ok, out, err) = run({
        let mut c = command(NO_S3);
        c.args(["key", "new"]);
        c
    });
    assert!(ok, "{err}");
    std::fs::write(&path, out).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, out, err) = run({
        let mut c = command(NO_S3);
        c.args(["key", "id", "--encryption-key-file"]).arg(&path);
        c
    });
    assert!(ok, "{err}");
    let id = out.split_whitespace().next().unwrap().to_string();
    (path, id)
}

/// The store's content files' bytes (not `backup.lineage`/`backup.parent`, which the backup
/// itself writes and names in manifests).
fn store_files(store: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    files(store, store, &mut out);
    out.into_iter()
        .filter(|(k, _)| !k.starts_with("backup."))
        .map(|(_, b)| b)
        .collect()
}

/// Where some 32-byte window of the store's files occurs in an object: every 16-byte aligned
/// chunk of the store is indexed (any 32-byte common run contains one whole), every 16-byte
/// window of the objects looked up, and a hit extended both ways to its longest common run.
fn find_window(store: &[Vec<u8>], objects: &[(String, Vec<u8>)]) -> Option<String> {
    let mut index: HashMap<&[u8], Vec<(usize, usize)>> = HashMap::new();
    for (f, bytes) in store.iter().enumerate() {
        for at in (0..bytes.len().saturating_sub(15)).step_by(16) {
            index.entry(&bytes[at..at + 16]).or_default().push((f, at));
        }
    }
    for (key, obj) in objects {
        for o in 0..obj.len().saturating_sub(15) {
            let Some(hits) = index.get(&obj[o..o + 16]) else {
                continue;
            };
            for &(f, s) in hits.iter().take(64) {
                let file = &store[f];
                let mut back = 0;
                while back < o && back < s && obj[o - back - 1] == file[s - back - 1] {
                    back += 1;
                }
                let mut fwd = 16;
                while o + fwd < obj.len() && s + fwd < file.len() && obj[o + fwd] == file[s + fwd] {
                    fwd += 1;
                }
                if back + fwd >= WINDOW {
                    return Some(format!("{key} at byte {} ({} bytes)", o - back, back + fwd));
                }
            }
        }
    }
    None
}

#[test]
fn an_encrypted_backup_holds_no_window_of_the_store_and_restores_only_with_its_key() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 2000, 7);
    let want = store_digest(&store);
    let (key, id) = key_file(t.path(), "k.key");
    let (wrong, wrong_id) = key_file(t.path(), "wrong.key");
    let kf = key.display().to_string();
    let wf = wrong.display().to_string();
    for (i, dest) in destinations(t.path(), "enc").into_iter().enumerate() {
        let (url, ep) = (dest.url(), dest.endpoint().to_string());
        backup_ok(&ep, &store, &url, &["--encryption-key-file", &kf]);
        let objects = dest.objects();
        assert!(
            objects
                .iter()
                .any(|(k, _)| k.contains("/keys/") && k.ends_with(".key")),
            "{url}: no wrapper among {:?}",
            objects.iter().map(|o| &o.0).collect::<Vec<_>>()
        );
        let files = store_files(&store);
        assert_eq!(
            find_window(&files, &objects),
            None,
            "{url}: plaintext found"
        );
        println!(
            "{url}: {} objects, {} bytes, no {WINDOW}-byte window of {} store bytes",
            objects.len(),
            objects.iter().map(|o| o.1.len()).sum::<usize>(),
            files.iter().map(Vec::len).sum::<usize>()
        );

        // With the key: the store. Without, or with the wrong key: an error naming the key
        // id needed, and no target.
        let into = t.path().join(format!("restored-{i}"));
        assert_eq!(
            restore_digest(&ep, &url, &into, &["--encryption-key-file", &kf]),
            want
        );
        for (extra, says) in [
            (vec![], format!("wrapped for key ids {id}")),
            (vec!["--encryption-key-file", wf.as_str()], wrong_id.clone()),
        ] {
            let none = t.path().join(format!("none-{i}"));
            let (ok, _, err) = restore(&ep, &url, &none, &extra);
            assert!(!ok, "restore {extra:?} succeeded");
            assert!(err.contains(&says) && err.contains(&id), "{extra:?}: {err}");
            assert!(!none.exists(), "restore {extra:?} left a target");
            let leftovers: Vec<_> = std::fs::read_dir(t.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains(".restore-"))
                .collect();
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }

        // Verify: without a key it checks the stored bytes and says encrypted, with which key.
        let (ok, report) = verify(&ep, &url, &[]);
        assert!(ok, "{report:#}");
        for m in report["manifests"].as_array().unwrap() {
            assert_eq!(m["encrypted"]["key_ids"], serde_json::json!([id]), "{m}");
            assert_eq!(m["encrypted"]["authenticated"], false, "{m}");
        }
        let (ok, report) = verify(&ep, &url, &["--encryption-key-file", &kf]);
        assert!(ok, "{report:#}");
        for m in report["manifests"].as_array().unwrap() {
            assert_eq!(m["encrypted"]["authenticated"], true, "{m}");
        }
        let (ok, report) = verify(&ep, &url, &["--encryption-key-file", &wf]);
        assert!(!ok, "a wrong key verified: {report:#}");
        let mut cmd = command(&ep);
        cmd.args(["verify", "--from", &url]);
        let (_, text, _) = run(cmd);
        assert!(
            text.contains(&format!("encrypted (key ids {id})")),
            "{text}"
        );
    }

    // The scan can fail: a plaintext backup of the same store shows its windows.
    let plain = Dest::File(t.path().join("plain-bucket"));
    backup_ok(NO_S3, &store, &plain.url(), &["--compression", "none"]);
    assert!(find_window(&store_files(&store), &plain.objects()).is_some());
}

#[test]
fn a_resumed_encrypted_backup_keeps_its_key_retention_keeps_wrappers_and_rekey_moves_it() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let url = format!("file://{}", bucket.display());
    let (key, _) = key_file(t.path(), "k.key");
    let kf = key.display().to_string();
    let keep = [
        "--encryption-key-file",
        &kf,
        "--keep-generations",
        "1",
        "--keep-for-ms",
        "0",
        "--orphan-grace-ms",
        "0",
    ];
    write(&store, 1000, 1);
    backup_ok(NO_S3, &store, &url, &keep);
    // The same generation (no snapshot yet), resumed by a new process: its segments go up
    // sealed with the key it opened (a restore opens one key for the generation).
    write(&store, 300, 2);
    backup_ok(NO_S3, &store, &url, &keep);
    assert_eq!(
        generations(&bucket).len(),
        1,
        "a resume started a new generation"
    );
    // Snapshots at 1500 and 3000 start new generations; retention drops the old ones.
    write(&store, 2000, 3);
    backup_ok(NO_S3, &store, &url, &keep);
    backup_ok(NO_S3, &store, &url, &keep);
    let want = store_digest(&store);
    for g in generations(&bucket) {
        let dir = bucket.join("gen").join(&g);
        let mut names = Vec::new();
        files(&dir, &dir, &mut names);
        let wrappers = names.iter().filter(|(k, _)| k.starts_with("keys/")).count();
        let data = names
            .iter()
            .filter(|(k, _)| !k.starts_with("keys/") && k != "GENERATION")
            .count();
        println!("gen {g}: {wrappers} wrappers, {data} data objects");
        assert!(data == 0 || wrappers == 1, "gen {g}: {names:?}");
        assert!(
            wrappers == 0 || data > 0,
            "gen {g}: a wrapper outlived its data"
        );
    }
    let (ok, report) = verify(NO_S3, &url, &["--encryption-key-file", &kf]);
    assert!(ok, "{report:#}");
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r1"),
            &["--encryption-key-file", &kf]
        ),
        want
    );

    // Rekey: the new key restores, the old one is refused.
    let (new, new_id) = key_file(t.path(), "new.key");
    let nf = new.display().to_string();
    let mut cmd = command(NO_S3);
    cmd.args(["rekey", "--from", &url, "--encryption-key-file", &kf])
        .args(["--new-encryption-key-file", &nf]);
    let (ok, _, err) = run(cmd);
    assert!(ok, "rekey: {err}");
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r2"),
            &["--encryption-key-file", &nf]
        ),
        want
    );
    let old = t.path().join("r3");
    let (ok, _, err) = restore(NO_S3, &url, &old, &["--encryption-key-file", &kf]);
    assert!(!ok && err.contains(&new_id), "{err}");
    assert!(!old.exists());
    // The worker goes on under the new key.
    write(&store, 200, 4);
    backup_ok(NO_S3, &store, &url, &["--encryption-key-file", &nf]);
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r4"),
            &["--encryption-key-file", &nf]
        ),
        store_digest(&store)
    );
}

#[test]
fn public_key_mode_writes_what_only_the_identity_restores() {
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let url = format!("file://{}", bucket.display());
    let identity = t.path().join("id.age");
    let (ok, out, err) = run({
        let mut c = command(NO_S3);
        c.args(["key", "new", "--age"]);
        c
    });
    assert!(ok, "{err}");
    std::fs::write(&identity, out).unwrap();
    let (ok, out, err) = run({
        let mut c = command(NO_S3);
        c.args(["key", "recipient", "--identity-file"])
            .arg(&identity);
        c
    });
    assert!(ok, "{err}");
    let recipient = out.trim().to_string();
    write(&store, 1000, 1);
    backup_ok(NO_S3, &store, &url, &["--encryption-recipient", &recipient]);
    // A restart cannot open the generation's key (it only has the recipient): it starts a
    // new generation rather than write plaintext or fail.
    write(&store, 300, 2);
    backup_ok(NO_S3, &store, &url, &["--encryption-recipient", &recipient]);
    let want = store_digest(&store);
    let id = identity.display().to_string();
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r"),
            &["--encryption-identity-file", &id]
        ),
        want
    );
    let none = t.path().join("none");
    let (ok, _, err) = restore(NO_S3, &url, &none, &[]);
    assert!(!ok && err.contains("no key given"), "{err}");
    assert!(!none.exists());
}

#[test]
fn bad_keys_stop_backup_and_serve_before_anything_is_uploaded() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    write(&store, 100, 1);
    let bucket = t.path().join("b");
    let url = format!("file://{}", bucket.display());
    let garbage = t.path().join("garbage.key");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let missing = t.path().join("missing.key").display().to_string();
    let dir = t.path().display().to_string();
    let g = garbage.display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--encryption-key-file", &missing], "no such file"),
        (vec!["--encryption-key-file", &g], "not a key file"),
        (vec!["--encryption-key-file", &dir], "is a directory"),
        (
            vec!["--encryption-recipient", "age1nope"],
            "not an age X25519 recipient",
        ),
    ];
    for (extra, says) in &cases {
        let (ok, _, err) = backup(NO_S3, &store, &url, extra);
        assert!(!ok, "backup {extra:?} succeeded");
        assert!(err.contains(says), "backup {extra:?}: {err}");
        assert!(!bucket.exists(), "backup {extra:?} created the destination");
    }
    let data = t.path().join("data");
    for (extra, says) in &cases {
        let cmd = support::serve::command(&data, t.path(), extra);
        let (ok, out, err) = run(cmd);
        assert!(!ok, "serve {extra:?} started: {out}");
        assert!(err.contains(says), "serve {extra:?}: {err}");
        assert!(!out.contains("listening"), "serve {extra:?}: {out}");
    }
}

#[test]
fn a_prefix_refuses_the_other_kind_unless_told() {
    let t = tempfile::tempdir().unwrap();
    let (key, _) = key_file(t.path(), "k.key");
    let kf = key.display().to_string();
    let count = |b: &Path| {
        let mut out = Vec::new();
        files(b, b, &mut out);
        out.len()
    };
    for (first, second) in [
        (vec![], vec!["--encryption-key-file", &kf]),
        (vec!["--encryption-key-file", &kf], vec![]),
    ] {
        let name = if first.is_empty() {
            "plain-first"
        } else {
            "enc-first"
        };
        let (store, bucket) = (t.path().join(format!("{name}-s")), t.path().join(name));
        let url = format!("file://{}", bucket.display());
        write(&store, 1000, 1);
        backup_ok(NO_S3, &store, &url, &first);
        // A snapshot: the next backup would start a new generation of the other kind.
        write(&store, 1000, 2);
        let before = count(&bucket);
        let (ok, _, err) = backup(NO_S3, &store, &url, &second);
        assert!(!ok, "{name}: a mixed backup succeeded");
        assert!(err.contains("--allow-mixed-encryption"), "{name}: {err}");
        assert_eq!(
            count(&bucket),
            before,
            "{name}: the refused backup uploaded"
        );
        let mut allowed = second.clone();
        allowed.push("--allow-mixed-encryption");
        backup_ok(NO_S3, &store, &url, &allowed);
        assert_eq!(
            restore_digest(
                NO_S3,
                &url,
                &t.path().join(format!("{name}-r")),
                &["--encryption-key-file", &kf]
            ),
            store_digest(&store)
        );
    }
}

/// A `0700`/`0600` store backed up with encryption comes back the restoring user's alone
/// under umask 022 (issue 25, part 4): the target and `archive/` `0700`, every file `0600`,
/// and with `--at` (the cut `wal.bin`) too. It used to come back `0755`/`0644`, the plain
/// bytes of an encrypted backup readable by every user of the host.
#[test]
fn an_encrypted_store_restores_private_under_umask_022() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("s");
    // Small WAL files: the store has archives, so `archive/` is restored too.
    support::store::write(&store, 400, 0, 4096);
    for (path, is_dir, _) in support::modes_under(&store) {
        let mode = if is_dir { 0o700 } else { 0o600 };
        let p = store.join(&path);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let (kf, _) = key_file(t.path(), "backup.key");
    let kf = kf.to_str().unwrap().to_string();
    let url = format!("file://{}", t.path().join("b").display());
    backup_ok(NO_S3, &store, &url, &["--encryption-key-file", &kf]);
    for (name, extra) in [("restored", vec![]), ("at", vec!["--at", "200"])] {
        let into = t.path().join(name);
        let mut cmd = command(NO_S3);
        cmd.args(["restore", "--from", &url, "--json", "--to"])
            .arg(&into)
            .args(["--encryption-key-file", &kf])
            .args(&extra);
        support::binary::with_umask(&mut cmd, 0o022);
        let (ok, _, err) = run(cmd);
        assert!(ok, "restore {extra:?}: {err}");
        let modes = support::modes_under(&into);
        assert!(
            modes.iter().any(|(p, d, _)| *d && p == "archive") && modes.len() > 4,
            "{modes:?}"
        );
        for (path, is_dir, mode) in &modes {
            let want = if *is_dir { 0o700 } else { 0o600 };
            assert_eq!(*mode, want, "{name}: {path:?} is {mode:o}, not {want:o}");
        }
    }
}

/// The generation directories of a `file://` bucket, in order.
fn generations(bucket: &Path) -> Vec<String> {
    let mut g: Vec<String> = std::fs::read_dir(bucket.join("gen"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    g.sort();
    g
}

/// A generation's data objects (not its claim, not its wrappers): key and bytes.
fn data_objects(bucket: &Path, generation: &str) -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    files(bucket, &bucket.join("gen").join(generation), &mut all);
    all.into_iter()
        .filter(|(k, _)| !k.contains("/keys/") && !k.ends_with("/GENERATION"))
        .collect()
}

/// What the README says of rekey and of rotating data keys, shown: `rekey` re-wraps and
/// leaves the data keys, so a copy of an old wrapper kept from before it, with the old key,
/// still opens what the old generations hold; a new generation (the store's next snapshot)
/// comes with a new data key, wrapped for the new key only, which the old wrapper and the
/// old key do not open.
#[test]
fn rekey_keeps_the_data_keys_and_a_new_generation_brings_a_new_one() {
    use mushroom_backup::crypto::{Binding, KeyFileKey, OpenWriter, UnwrapKek, WrappedKey};
    let t = tempfile::tempdir().unwrap();
    let (store, bucket) = (t.path().join("s"), t.path().join("b"));
    let url = format!("file://{}", bucket.display());
    let (old, old_id) = key_file(t.path(), "old.key");
    let (new, new_id) = key_file(t.path(), "new.key");
    let (of, nf) = (old.display().to_string(), new.display().to_string());
    // 1000 commits, no snapshot yet (every 1500): one generation, under the old key.
    write(&store, 1000, 1);
    backup_ok(NO_S3, &store, &url, &["--encryption-key-file", &of]);
    let first = generations(&bucket);
    assert_eq!(first.len(), 1, "{first:?}");
    let g1 = first[0].clone();
    let wrapper = format!("gen/{g1}/keys/{old_id}.key");
    let kept = std::fs::read(bucket.join(&wrapper)).expect("the old key's wrapper");
    let at_1000 = store_digest(&store);

    let mut cmd = command(NO_S3);
    cmd.args(["rekey", "--from", &url, "--encryption-key-file", &of])
        .args(["--new-encryption-key-file", &nf]);
    let (ok, _, err) = run(cmd);
    assert!(ok, "rekey: {err}");
    assert!(
        !bucket.join(&wrapper).exists(),
        "the old wrapper is still there"
    );
    // What rekey does not protect against: the old wrapper, kept from before (a copy of the
    // bucket, an old object version), with the old key, opens the generation as before.
    std::fs::write(bucket.join(&wrapper), &kept).unwrap();
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r1"),
            &["--encryption-key-file", &of]
        ),
        at_1000
    );
    std::fs::remove_file(bucket.join(&wrapper)).unwrap();

    // The store's next snapshot (at 1500) starts a new generation, under the new key.
    write(&store, 1000, 2);
    backup_ok(NO_S3, &store, &url, &["--encryption-key-file", &nf]);
    let later: Vec<String> = generations(&bucket)
        .into_iter()
        .filter(|g| *g != g1)
        .collect();
    assert!(!later.is_empty(), "no new generation");
    for g in &later {
        let keys: Vec<String> = std::fs::read_dir(bucket.join("gen").join(g).join("keys"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(keys, [format!("{new_id}.key")], "generation {g}");
    }
    // Even with the kept wrapper back, the old key restores nothing of the new generation.
    std::fs::write(bucket.join(&wrapper), &kept).unwrap();
    let (ok, _, err) = restore(
        NO_S3,
        &url,
        &t.path().join("r2"),
        &["--encryption-key-file", &of],
    );
    assert!(!ok && err.contains(&new_id), "{err}");
    assert_eq!(
        restore_digest(
            NO_S3,
            &url,
            &t.path().join("r3"),
            &["--encryption-key-file", &nf]
        ),
        store_digest(&store)
    );

    // The same, one object at a time: the data key the kept wrapper holds opens every object
    // of the first generation and no object of a later one.
    let claim = std::fs::read(bucket.join("gen").join(&g1).join("GENERATION")).unwrap();
    let claim_key = format!("gen/{g1}/GENERATION");
    let lineage = mushroom_backup::manifest::GenerationClaim::decode(&claim_key, &claim)
        .unwrap()
        .lineage;
    let old_kek = UnwrapKek::KeyFile(std::sync::Arc::new(KeyFileKey::load(&old).unwrap().0));
    let binding = Binding {
        lineage,
        generation: g1.parse().unwrap(),
    };
    let data_key = WrappedKey::decode(&wrapper, &kept)
        .unwrap()
        .unwrap(&wrapper, &old_kek, binding)
        .expect("the kept wrapper opens with the old key");
    let opens = |key: &str, sealed: &[u8]| {
        let mut w = OpenWriter::new(Vec::new(), &data_key, key);
        std::io::Write::write_all(&mut w, sealed).is_ok() && w.finish().is_ok()
    };
    let old_objects = data_objects(&bucket, &g1);
    assert!(!old_objects.is_empty());
    for (key, sealed) in &old_objects {
        assert!(
            opens(key, sealed),
            "{key} does not open with its generation's key"
        );
    }
    let new_objects: Vec<(String, Vec<u8>)> = later
        .iter()
        .flat_map(|g| data_objects(&bucket, g))
        .collect();
    assert!(!new_objects.is_empty());
    for (key, sealed) in &new_objects {
        assert!(!opens(key, sealed), "{key} opens with the old data key");
    }
}
