//! The encryption module on its own: the sealed stream (round trips, every kind of tampering),
//! key files and age keys (bad input gives a clear error, never a panic), wrappers and their
//! binding to a generation, and wrappers in a real bucket.

mod support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use mushroom_backup::bucket::{Bucket, PutCondition};
use mushroom_backup::crypto::key_objects::{self, KeyObjectError, Written};
use mushroom_backup::crypto::stream::{self, CHUNK, HEADER, TAG};
use mushroom_backup::crypto::wrapper::WrapError;
use mushroom_backup::crypto::{
    AgeIdentity, AgeRecipient, Binding, DataKey, EncryptionSettings, KeyError, KeyFileKey,
    OpenWriter, SealWriter, StreamError, UnwrapKek, sealed_len,
};
use sha2::{Digest, Sha256};
use support::keks::{age_kek, key_file_kek};
use uuid::Uuid;

const OBJ: &str = "gen/0000000003/wal/00000000000000000000-00000000000000000100.seg";

/// Plain bytes `0..n` of a deterministic, incompressible-looking sequence.
fn plain(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Seals `data` written in pieces of `piece` bytes.
fn seal(key: &DataKey, obj: &str, data: &[u8], piece: usize) -> Vec<u8> {
    let mut w = SealWriter::new(Vec::new(), key, obj).unwrap();
    for p in data.chunks(piece.max(1)) {
        w.write_all(p).unwrap();
    }
    w.finish().unwrap()
}

/// Opens `sealed` pushed in pieces of `piece` bytes.
fn open(key: &DataKey, obj: &str, sealed: &[u8], piece: usize) -> std::io::Result<Vec<u8>> {
    let mut w = OpenWriter::new(Vec::new(), key, obj);
    for p in sealed.chunks(piece.max(1)) {
        w.write_all(p)?;
    }
    w.finish()
}

fn stream_error(r: std::io::Result<Vec<u8>>) -> StreamError {
    let e = r.expect_err("the stream must be refused");
    StreamError::of(&e)
        .unwrap_or_else(|| panic!("not a stream error: {e}"))
        .clone()
}

#[test]
fn round_trips_at_every_edge_of_a_chunk() {
    let key = DataKey::generate();
    for n in [
        0,
        1,
        2,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK,
        3 * CHUNK + 5,
    ] {
        let data = plain(n, n as u64);
        for piece in [1 << 20, 7777, CHUNK, CHUNK + TAG] {
            let sealed = seal(&key, OBJ, &data, piece);
            assert_eq!(sealed.len() as u64, sealed_len(n as u64).unwrap(), "n={n}");
            assert_eq!(stream::plain_len(sealed.len() as u64), Some(n as u64));
            for open_piece in [1 << 20, 13, CHUNK + TAG, CHUNK + TAG + 1] {
                assert_eq!(open(&key, OBJ, &sealed, open_piece).unwrap(), data, "n={n}");
            }
        }
    }
    // One-byte writes both ways, over a chunk boundary.
    let data = plain(CHUNK + 3, 9);
    let sealed = seal(&key, OBJ, &data, 1);
    assert_eq!(open(&key, OBJ, &sealed, 1).unwrap(), data);
}

#[test]
fn sealed_lengths_are_exact_and_invertible() {
    assert_eq!(sealed_len(0), Some((HEADER + TAG) as u64));
    assert_eq!(
        sealed_len(CHUNK as u64),
        Some((HEADER + CHUNK + TAG) as u64)
    );
    assert_eq!(
        sealed_len(CHUNK as u64 + 1),
        Some((HEADER + CHUNK + 1 + 2 * TAG) as u64)
    );
    assert_eq!(sealed_len(u64::MAX), None);
    for n in (0..5 * CHUNK as u64).step_by(4099).chain([u64::MAX / 2]) {
        let s = sealed_len(n).unwrap();
        assert_eq!(stream::plain_len(s), Some(n));
    }
    // Lengths no plain length seals to.
    for s in [0, 1, HEADER as u64, (HEADER + TAG - 1) as u64] {
        assert_eq!(stream::plain_len(s), None, "{s}");
    }
}

/// A writer that hashes what it is given and counts the largest write, so a streamed round trip
/// of many megabytes checks its output without keeping it.
struct Hashing {
    hash: Sha256,
    len: u64,
    largest_write: usize,
}

impl Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hash.update(buf);
        self.len += buf.len() as u64;
        self.largest_write = self.largest_write.max(buf.len());
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_large_object_streams_through_seal_and_open_one_chunk_at_a_time() {
    let key = DataKey::generate();
    let total = 8 * 1024 * 1024 + 12345;
    let sink = Hashing {
        hash: Sha256::new(),
        len: 0,
        largest_write: 0,
    };
    // plaintext -> seal -> open -> hash: nothing holds more than a chunk.
    let mut w = SealWriter::new(OpenWriter::new(sink, &key, OBJ), &key, OBJ).unwrap();
    let mut expected = Sha256::new();
    let mut written = 0usize;
    let mut seed = 0;
    while written < total {
        let n = (total - written).min(1_000_003);
        let piece = plain(n, seed);
        seed += 1;
        expected.update(&piece);
        w.write_all(&piece).unwrap();
        written += n;
    }
    let sink = w.finish().unwrap().finish().unwrap();
    assert_eq!(sink.len, total as u64);
    assert!(sink.largest_write <= CHUNK, "{}", sink.largest_write);
    assert_eq!(sink.hash.finalize(), expected.finalize());
}

#[test]
fn any_flipped_byte_is_refused() {
    let key = DataKey::generate();
    let data = plain(2 * CHUNK + 100, 1);
    let sealed = seal(&key, OBJ, &data, 5000);
    // Every byte of the header, and bytes across every chunk and tag.
    let positions = (0..HEADER)
        .chain((HEADER..sealed.len()).step_by(997))
        .chain([
            sealed.len() - 1,
            HEADER + CHUNK + TAG - 1,
            HEADER + CHUNK + TAG,
        ]);
    for at in positions {
        let mut bad = sealed.clone();
        bad[at] ^= 0x40;
        let e = stream_error(open(&key, OBJ, &bad, 4096));
        assert!(
            matches!(
                e,
                StreamError::Tampered { .. }
                    | StreamError::NotSealed { .. }
                    | StreamError::UnknownVersion { .. }
                    | StreamError::OtherDataKey { .. }
            ),
            "byte {at}: {e}"
        );
    }
}

#[test]
fn truncated_extended_reordered_and_duplicated_streams_are_refused() {
    let key = DataKey::generate();
    let data = plain(3 * CHUNK + 10, 2);
    let sealed = seal(&key, OBJ, &data, CHUNK);
    let full = CHUNK + TAG;
    let chunk = |i: usize| &sealed[HEADER + i * full..(HEADER + (i + 1) * full).min(sealed.len())];
    // Cut anywhere: at every chunk boundary, inside chunks, inside the header, to nothing.
    for cut in [
        0,
        3,
        HEADER - 1,
        HEADER,
        HEADER + 1,
        HEADER + TAG - 1,
        HEADER + full,
        HEADER + 2 * full,
        HEADER + 3 * full,
        HEADER + full + 100,
        sealed.len() - 1,
    ] {
        let e = stream_error(open(&key, OBJ, &sealed[..cut], 999));
        assert!(
            matches!(
                e,
                StreamError::Truncated { .. } | StreamError::Tampered { .. }
            ),
            "cut at {cut}: {e}"
        );
    }
    let header = &sealed[..HEADER];
    let rebuild = |order: &[usize]| {
        let mut v = header.to_vec();
        for &i in order {
            v.extend_from_slice(chunk(i));
        }
        v
    };
    assert_eq!(open(&key, OBJ, &rebuild(&[0, 1, 2, 3]), 999).unwrap(), data);
    for order in [
        &[1, 0, 2, 3][..],
        &[0, 2, 1, 3],
        &[0, 1, 3],
        &[0, 0, 1, 2, 3],
        &[0, 1, 2, 2, 3],
        &[0, 1, 2, 3, 3],
        &[1, 2, 3],
    ] {
        let e = stream_error(open(&key, OBJ, &rebuild(order), 999));
        assert!(matches!(e, StreamError::Tampered { .. }), "{order:?}: {e}");
    }
    // Bytes appended after the last chunk.
    let mut longer = sealed.clone();
    longer.extend_from_slice(&[0u8; 40]);
    assert!(matches!(
        stream_error(open(&key, OBJ, &longer, 999)),
        StreamError::Tampered { .. }
    ));
}

#[test]
fn another_key_or_another_object_key_is_refused() {
    let key = DataKey::generate();
    let other = DataKey::generate();
    let data = plain(CHUNK + 1, 3);
    let sealed = seal(&key, OBJ, &data, 1000);
    let e = stream_error(open(&other, OBJ, &sealed, 1000));
    assert!(matches!(e, StreamError::OtherDataKey { .. }), "{e}");
    assert!(e.to_string().contains(&other.id()), "{e}");
    // The header's key id forged to the other key's: the AEAD itself refuses.
    let mut forged = sealed.clone();
    forged[8..16].copy_from_slice(&other.id_bytes());
    let e = stream_error(open(&other, OBJ, &forged, 1000));
    assert!(matches!(e, StreamError::Tampered { chunk: 0, .. }), "{e}");
    // The same bytes under another object key (a copy, or a swap within the generation).
    let e = stream_error(open(&key, "gen/0000000003/snapshot.bin", &sealed, 1000));
    assert!(matches!(e, StreamError::Tampered { chunk: 0, .. }), "{e}");
    // Plaintext is not a sealed object.
    let e = stream_error(open(
        &key,
        OBJ,
        b"MDBWAL01 and then some plain bytes of a WAL",
        7,
    ));
    assert!(matches!(e, StreamError::NotSealed { .. }), "{e}");
    // Two seals of the same bytes differ (random nonce prefix per object).
    assert_ne!(seal(&key, OBJ, &data, 1000), sealed);
}

#[test]
fn a_failed_stream_takes_no_more_writes() {
    let key = DataKey::generate();
    let mut sealed = seal(&key, OBJ, &plain(3 * CHUNK, 4), CHUNK);
    sealed[HEADER + 5] ^= 1;
    let mut w = OpenWriter::new(Vec::new(), &key, OBJ);
    let err = w.write_all(&sealed).unwrap_err();
    assert!(matches!(
        StreamError::of(&err),
        Some(StreamError::Tampered { .. })
    ));
    let again = w.write(b"x").unwrap_err();
    assert!(matches!(
        StreamError::of(&again),
        Some(StreamError::Poisoned { .. })
    ));
    assert!(w.finish().is_err());
}

// ---------------------------------------------------------------------------------------------
// Key files and age keys.

fn key_file_error(content: &[u8]) -> String {
    match KeyFileKey::parse(content, "K") {
        Ok(_) => panic!(
            "{:?} parsed as a key file",
            String::from_utf8_lossy(content)
        ),
        Err(e) => e.to_string(),
    }
}

#[test]
fn key_files_parse_strictly() {
    let k = KeyFileKey::generate();
    let content = k.file_content();
    let back = KeyFileKey::parse(content.as_bytes(), "K").unwrap();
    assert_eq!(back.id(), k.id());
    // Without the final newline too.
    let line = content.trim_end().to_string();
    assert_eq!(
        KeyFileKey::parse(line.as_bytes(), "K").unwrap().id(),
        k.id()
    );
    let digits = &line["mushroom-backup-key-v1:".len()..];
    for (bad, says) in [
        (String::new(), "blank"),
        ("\n".to_string(), "blank"),
        ("   \n".to_string(), "blank"),
        ("mushroom-backup-key-v1:".to_string(), "0 characters"),
        (
            format!("mushroom-backup-key-v1:{}", &digits[..62]),
            "62 characters",
        ),
        (
            format!("mushroom-backup-key-v1:{digits}00"),
            "66 characters",
        ),
        (
            format!("mushroom-backup-key-v1:{}", digits.to_uppercase()),
            "lowercase hex",
        ),
        (
            format!("mushroom-backup-key-v1:{}zz", &digits[..62]),
            "lowercase hex",
        ),
        (
            format!("mushroom-backup-key-v2:{digits}"),
            "does not start with",
        ),
        (format!("{line} "), "65 characters"),
        (format!("{line}\r\n"), "65 characters"),
        (format!("{line}\n\n"), "more than one line"),
        (format!("{line}\n{line}\n"), "more than one line"),
        (format!(" {line}"), "does not start with"),
    ] {
        let e = key_file_error(bad.as_bytes());
        assert!(e.contains(says), "{bad:?}: {e}");
        assert!(e.starts_with("K: not a key file"), "{e}");
    }
    assert!(key_file_error(&[0xff, 0xfe, 0x00]).contains("not UTF-8"));
    // The key's bytes never show in Debug.
    assert!(!format!("{k:?}").contains(digits));
    assert!(format!("{k:?}").contains(k.id().as_str()));
}

#[test]
fn key_file_parsing_never_panics_on_any_bytes() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..200), |bytes| {
            let _ = KeyFileKey::parse(&bytes, "K");
            let _ = AgeIdentity::parse_file(&bytes, "I");
            if let Ok(s) = std::str::from_utf8(&bytes) {
                let _ = AgeRecipient::parse(s);
            }
            Ok(())
        })
        .unwrap();
    // Mutations of a valid key file: every one either parses to a key or says why not.
    let good = KeyFileKey::generate().file_content().as_bytes().to_vec();
    for at in 0..good.len() {
        for b in [b'0', b'g', b'A', b'\n', b' ', 0u8, 0xff] {
            let mut m = good.clone();
            m[at] = b;
            let _ = KeyFileKey::parse(&m, "K");
            m.truncate(at);
            let _ = KeyFileKey::parse(&m, "K");
        }
    }
}

fn load_error(settings: EncryptionSettings) -> String {
    match settings.load() {
        Ok(_) => panic!("{settings:?} loaded"),
        Err(e) => e.to_string(),
    }
}

fn key_file_settings(path: &std::path::Path) -> EncryptionSettings {
    EncryptionSettings {
        key_file: Some(path.to_path_buf()),
        ..Default::default()
    }
}

#[test]
fn bad_key_files_are_refused_naming_the_flag_file_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("empty"), b"").unwrap();
    std::fs::write(p("blank"), b"\n\n").unwrap();
    std::fs::write(p("short"), b"mushroom-backup-key-v1:abcd\n").unwrap();
    std::fs::write(p("huge"), vec![b'a'; 1 << 20]).unwrap();
    std::fs::create_dir(p("dir")).unwrap();
    let fifo = std::ffi::CString::new(p("fifo").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(p("loop-b"), p("loop-a")).unwrap();
    std::os::unix::fs::symlink(p("loop-a"), p("loop-b")).unwrap();
    std::os::unix::fs::symlink(p("nowhere"), p("dangling")).unwrap();
    for (name, says) in [
        ("missing", "no such file"),
        ("dangling", "no such file"),
        ("empty", "empty"),
        ("blank", "blank"),
        ("short", "4 characters"),
        ("huge", "a key file holds at most 4096"),
        ("dir", "is a directory"),
        ("fifo", "is a FIFO"),
        ("loop-a", "symlink loop"),
    ] {
        let e = load_error(key_file_settings(&p(name)));
        assert!(e.starts_with("--encryption-key-file: "), "{name}: {e}");
        assert!(e.contains(p(name).to_str().unwrap()), "{name}: {e}");
        assert!(e.contains(says), "{name}: {e}");
    }
    // /dev/zero: a device, not read at all.
    let e = load_error(key_file_settings(std::path::Path::new("/dev/zero")));
    assert!(e.contains("is a device"), "{e}");
}

#[test]
fn a_key_file_others_may_read_loads_with_a_warning_and_a_symlink_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let k = KeyFileKey::generate();
    let path = dir.path().join("key");
    std::fs::write(&path, k.file_content().as_bytes()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let loaded = key_file_settings(&path).load().unwrap().unwrap();
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.wrap_ids(), vec![k.id().clone()]);
    assert_eq!(loaded.unwrap_ids(), vec![k.id().clone()]);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let loaded = key_file_settings(&link).load().unwrap().unwrap();
    assert_eq!(loaded.unwrap_ids(), vec![k.id().clone()]);
    assert_eq!(loaded.warnings.len(), 1);
    assert!(
        loaded.warnings[0].contains("chmod 600"),
        "{:?}",
        loaded.warnings
    );
    // Nothing configured is no encryption, not an error.
    assert!(EncryptionSettings::default().load().unwrap().is_none());
}

#[test]
fn age_recipients_and_identity_files_parse_strictly() {
    let id = AgeIdentity::generate();
    let content = id.file_content();
    assert!(content.starts_with("# created: "));
    let parsed = AgeIdentity::parse_file(content.as_bytes(), "I").unwrap();
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].id(), id.id());
    let r = AgeRecipient::parse(id.recipient().as_str()).unwrap();
    assert_eq!(r.id(), id.id(), "an identity has its recipient's id");
    for bad in [
        "",
        " age1",
        "age1xyz",
        "AGE-SECRET-KEY-1",
        "ssh-ed25519 AAAA",
        "age1 ",
    ] {
        let e = AgeRecipient::parse(bad).unwrap_err();
        assert!(matches!(e, KeyError::Recipient { .. }), "{bad:?}: {e}");
    }
    let secret_line = content.lines().last().unwrap().to_string();
    let two = format!(
        "# two\n\n{secret_line}\n{}",
        AgeIdentity::generate().file_content().as_str()
    );
    assert_eq!(
        AgeIdentity::parse_file(two.as_bytes(), "I").unwrap().len(),
        2
    );
    for (bad, says) in [
        ("# only a comment\n".to_string(), "no age identity"),
        ("\n\n".to_string(), "no age identity"),
        (format!("{secret_line}x\n"), "line 1"),
        (format!("# c\nage1{}\n", &secret_line[16..]), "line 2"),
        (secret_line.to_lowercase(), "line 1"),
    ] {
        let e = AgeIdentity::parse_file(bad.as_bytes(), "I")
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
    // A bad recipient flag names the flag.
    let e = load_error(EncryptionSettings {
        recipients: vec!["age1nope".into()],
        ..Default::default()
    });
    assert!(e.starts_with("--encryption-recipient: \"age1nope\""), "{e}");
    // The secret never shows in Debug.
    assert!(!format!("{id:?}").contains("AGE-SECRET-KEY"));
}

// ---------------------------------------------------------------------------------------------
// Wrappers.

fn binding(generation: u64) -> Binding {
    Binding {
        lineage: Uuid::from_u128(0x1111),
        generation,
    }
}

#[test]
fn wrappers_open_with_their_key_only_and_only_for_their_generation() {
    for (wrap, unwrap) in [key_file_kek(), age_kek()] {
        let dk = DataKey::generate();
        let w = wrap.wrap(&dk, binding(3)).unwrap();
        let decoded = mushroom_backup::crypto::WrappedKey::decode("k", &w.encode()).unwrap();
        assert_eq!(decoded, w);
        assert_eq!(decoded.unwrap("k", &unwrap, binding(3)).unwrap(), dk);
        // Another generation or lineage.
        for b in [
            binding(4),
            Binding {
                lineage: Uuid::from_u128(0x2222),
                generation: 3,
            },
        ] {
            let e = decoded.unwrap("k", &unwrap, b).unwrap_err();
            assert!(
                matches!(
                    e,
                    WrapError::NotAuthentic { .. } | WrapError::OtherBinding { .. }
                ),
                "{e}"
            );
        }
        // Another key of the same kind, presented under this id: does not authenticate.
        let (_, other) = match unwrap {
            UnwrapKek::KeyFile(_) => key_file_kek(),
            UnwrapKek::Identity(_) => age_kek(),
        };
        let mut relabelled = decoded.clone();
        relabelled.kek_id = other.id().clone();
        let e = relabelled.unwrap("k", &other, binding(3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "wrapper k does not authenticate: wrong key or damaged"
        );
        // Another id: named.
        let e = decoded.unwrap("k", &other, binding(3)).unwrap_err();
        assert!(matches!(e, WrapError::OtherKek { .. }), "{e}");
        // A damaged wrapped key.
        let mut damaged = decoded.clone();
        let mut bytes = hex::decode(&damaged.wrapped).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        damaged.wrapped = hex::encode(bytes);
        let e = damaged.unwrap("k", &unwrap, binding(3)).unwrap_err();
        assert!(matches!(e, WrapError::NotAuthentic { .. }), "{e}");
    }
    for bad in [&b""[..], b"{}", b"{\"format\":2}", b"[1,2]", &[b'x'; 20000]] {
        assert!(mushroom_backup::crypto::WrappedKey::decode("k", bad).is_err());
    }
}

#[tokio::test]
async fn a_generation_s_wrappers_in_a_bucket_give_clear_errors() {
    let (_dir, bucket) = support::fs_bucket();
    let b: &dyn Bucket = bucket.as_ref();
    let (kf_wrap, kf_unwrap) = key_file_kek();
    let (age_wrap, age_unwrap) = age_kek();
    let (_, stranger) = key_file_kek();
    let lineage = binding(0).lineage;
    let dk = DataKey::generate();
    key_objects::wrap_generation_key(b, binding(5), &dk, &[kf_wrap.clone(), age_wrap.clone()])
        .await
        .unwrap();
    // Written again (a retry): already there, also for age's randomized wrapper.
    key_objects::wrap_generation_key(b, binding(5), &dk, &[kf_wrap.clone(), age_wrap.clone()])
        .await
        .unwrap();
    let again = age_wrap.wrap(&dk, binding(5)).unwrap();
    assert_eq!(
        key_objects::write_wrapper(b, &again, &dk, None)
            .await
            .unwrap(),
        Written::AlreadyThere
    );
    // Another data key under the same wrapper key: refused.
    let other_dk = DataKey::generate();
    let e =
        key_objects::wrap_generation_key(b, binding(5), &other_dk, std::slice::from_ref(&kf_wrap))
            .await
            .unwrap_err();
    assert!(matches!(e, KeyObjectError::Conflict { .. }), "{e}");

    for kek in [&kf_unwrap, &age_unwrap] {
        let opened = key_objects::open_generation_key(b, lineage, 5, std::slice::from_ref(kek))
            .await
            .unwrap();
        assert_eq!(opened.data_key, dk);
        assert_eq!(&opened.kek_id, kek.id());
    }
    let mut ids = [kf_unwrap.id().to_string(), age_unwrap.id().to_string()];
    ids.sort();
    let e = key_objects::open_generation_key(b, lineage, 5, &[])
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "no key given for encrypted generation 5 (wrapped for key ids {}, {})",
            ids[0], ids[1]
        )
    );
    let e = key_objects::open_generation_key(b, lineage, 5, std::slice::from_ref(&stranger))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "the key given (id {}) is not one generation 5 is wrapped for ({}, {})",
            stranger.id(),
            ids[0],
            ids[1]
        )
    );
    // The wrong lineage (a restore point of another lineage naming this generation).
    let e = key_objects::open_generation_key(
        b,
        Uuid::from_u128(7),
        5,
        std::slice::from_ref(&kf_unwrap),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("does not authenticate"), "{e}");
    // A wrapper copied into another generation does not open there.
    let from = key_objects::wrapper_key(5, kf_unwrap.id());
    let to = key_objects::wrapper_key(6, kf_unwrap.id());
    let data = b.get(&from).await.unwrap().data;
    b.put(&to, data.into(), PutCondition::IfNoneMatch)
        .await
        .unwrap();
    let e = key_objects::open_generation_key(b, lineage, 6, std::slice::from_ref(&kf_unwrap))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("wrapper {to} does not authenticate: wrong key or damaged")
    );
    let e = key_objects::open_generation_key(b, lineage, 9, std::slice::from_ref(&kf_unwrap))
        .await
        .unwrap_err();
    assert!(
        matches!(e, KeyObjectError::NotEncrypted { generation: 9 }),
        "{e}"
    );
    // The keys are where the module docs say, and nothing else parses as one.
    assert_eq!(
        key_objects::parse_wrapper_key(&from),
        Some((5, kf_unwrap.id().clone()))
    );
    assert!(from.starts_with("gen/0000000005/keys/") && from.ends_with(".key"));
    for not in [
        "gen/0000000005/keys/xyz.key",
        "gen/0000000005/snapshot.bin",
        "gen/5/keys/a.key",
    ] {
        assert!(!key_objects::is_wrapper_key(not), "{not}");
    }
    let listed = key_objects::generations_with_wrappers(b).await.unwrap();
    assert_eq!(listed.keys().copied().collect::<Vec<_>>(), vec![5, 6]);
}
