//! The at-rest pipeline on its own (`src/at_rest/`): encode then decode gives the plain bytes
//! back; incompressible data is stored raw; a big object spools to an unnamed file; the plain
//! bytes are bound to the CRC they were checked with; corrupt, truncated or longer stored
//! bytes fail naming the object; the flags' values are checked.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use mushroom_backup::at_rest::decode::{Decoder, decode_bytes, recognise};
use mushroom_backup::at_rest::encode::{EncodeOptions, Plain, encode, encode_into};
use mushroom_backup::at_rest::spool::Spool;
use mushroom_backup::at_rest::{AtRestError, Codec, Compression};
use mushroom_backup::bucket::Body;
use mushroom_backup::store::engine::{Op, ValueKind, workload_ops_of};

fn text(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    let mut seq = 1;
    while v.len() < n {
        for op in workload_ops_of(ValueKind::Text, 1, seq, 1024) {
            if let Op::Put { value, .. } = op {
                v.extend_from_slice(&value);
            }
        }
        seq += 1;
    }
    v.truncate(n);
    v
}

fn random(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    let mut seq = 1;
    while v.len() < n {
        for op in workload_ops_of(ValueKind::Random, 1, seq, 1024) {
            if let Op::Put { value, .. } = op {
                v.extend_from_slice(&value);
            }
        }
        seq += 1;
    }
    v.truncate(n);
    v
}

async fn body_bytes(b: &Body) -> Vec<u8> {
    b.to_bytes().await.unwrap().to_vec()
}

#[tokio::test]
async fn text_compresses_round_trips_and_random_is_stored_raw() {
    let opts = EncodeOptions::default();
    let plain = text(300_000);
    let e = encode("k/text", Plain::Bytes(Bytes::from(plain.clone())), &opts).unwrap();
    assert_eq!(e.codec, Codec::Zstd);
    assert!(
        e.stored.len * 3 <= plain.len() as u64,
        "text stored in {} of {} bytes",
        e.stored.len,
        plain.len()
    );
    let stored = body_bytes(&e.body).await;
    assert_eq!(stored.len() as u64, e.stored.len);
    assert_eq!(crc32fast::hash(&stored), e.stored.crc);
    let entry = e.entry("k/text".into(), uuid::Uuid::nil(), 1);
    assert_eq!(entry.plain_len(), plain.len() as u64);
    assert_eq!(decode_bytes(&entry, None, &stored).unwrap(), plain);

    let noise = random(300_000);
    let r = encode("k/random", Plain::Bytes(Bytes::from(noise.clone())), &opts).unwrap();
    assert_eq!(r.codec, Codec::None);
    assert_eq!(r.stored.len, noise.len() as u64);
    assert_eq!(body_bytes(&r.body).await, noise);
    let raw = r.entry("k/random".into(), uuid::Uuid::nil(), 1);
    assert!(!raw.is_encoded() && raw.plain_len.is_none());

    // Compression off: stored raw whatever the data.
    let off = EncodeOptions {
        compression: Compression::None,
        seal: None,
    };
    let n = encode("k/off", Plain::Bytes(Bytes::from(plain.clone())), &off).unwrap();
    assert_eq!((n.codec, n.stored.len), (Codec::None, plain.len() as u64));
}

#[tokio::test]
async fn a_file_is_encoded_from_its_descriptor_into_an_unnamed_spool_and_bound_to_its_crc() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("archive.wal");
    let plain = text(3 << 20);
    std::fs::write(&path, &plain).unwrap();
    let file = Arc::new(std::fs::File::open(&path).unwrap());
    let crc = crc32fast::hash(&plain);
    let source = || Plain::File {
        file: file.clone(),
        offset: 0,
        len: plain.len() as u64,
        crc,
    };
    let e = encode_into(
        "k/a",
        source(),
        &EncodeOptions::default(),
        Spool::with_limit(64 << 10),
    )
    .unwrap();
    // Past the memory limit: a file body that states the stored CRC (so every re-read by a
    // retry or a multipart part is checked against it).
    match &e.body {
        Body::File { crc32, len, .. } => {
            assert_eq!(*crc32, Some(e.stored.crc));
            assert_eq!(*len, e.stored.len);
        }
        Body::Bytes(_) => panic!("a 3 MiB text file's encoding stayed in memory"),
    }
    let stored = body_bytes(&e.body).await;
    let entry = e.entry("k/a".into(), uuid::Uuid::nil(), 1);
    assert_eq!(decode_bytes(&entry, None, &stored).unwrap(), plain);

    // The file changed after its check: refused, nothing to upload.
    let wrong = Plain::File {
        file: file.clone(),
        offset: 0,
        len: plain.len() as u64,
        crc: crc ^ 1,
    };
    let err = encode("k/a", wrong, &EncodeOptions::default()).unwrap_err();
    assert!(matches!(err, AtRestError::Changed { .. }), "{err}");
    assert!(err.to_string().contains("changed after its check"), "{err}");
}

#[tokio::test]
async fn corrupt_truncated_or_longer_stored_bytes_fail_naming_the_object() {
    let plain = text(200_000);
    let e = encode(
        "gen/0000000001/snapshot.bin",
        Plain::Bytes(Bytes::from(plain.clone())),
        &EncodeOptions::default(),
    )
    .unwrap();
    let entry = e.entry("gen/0000000001/snapshot.bin".into(), uuid::Uuid::nil(), 1);
    let stored = body_bytes(&e.body).await;

    let mut flipped = stored.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let cut = &stored[..stored.len() - 7];
    let mut longer = stored.clone();
    longer.extend_from_slice(&stored);
    for (what, bad) in [
        ("flipped", &flipped[..]),
        ("cut", cut),
        ("longer", &longer[..]),
    ] {
        let err = decode_bytes(&entry, None, bad).unwrap_err();
        assert!(matches!(err, AtRestError::Corrupt { .. }), "{what}: {err}");
        assert!(
            err.to_string().contains("gen/0000000001/snapshot.bin"),
            "{what}: {err}"
        );
    }

    // A decoder pushed in pieces writes the plain bytes in order, and no more than stated.
    let mut d = Decoder::new(&entry, None, Vec::new()).unwrap();
    for piece in stored.chunks(1000) {
        d.write_stored(piece).unwrap();
    }
    let (out, facts) = d.finish().unwrap();
    assert_eq!(out, plain);
    assert_eq!(facts.plain.len, plain.len() as u64);
    let mut small = entry.clone();
    small.plain_len = Some(1000);
    let mut d = Decoder::new(&small, None, Vec::new()).unwrap();
    let err = d.write_stored(&stored).unwrap_err().to_string();
    assert!(err.contains("more than the 1000 bytes"), "{err}");

    // An encrypted entry is refused before a byte is written (no key in this build).
    let mut sealed = entry.clone();
    sealed.encrypted = true;
    let mut sink = Vec::new();
    assert!(matches!(
        Decoder::new(&sealed, None, &mut sink),
        Err(AtRestError::Sealed { .. })
    ));
    sink.flush().unwrap();
    assert!(sink.is_empty());
}

#[test]
fn a_segment_no_manifest_describes_is_recognised_raw_or_zstd() {
    let plain = Bytes::from(text(50_000));
    let (raw, back) = recognise("k", &plain, plain.len() as u64, None).unwrap();
    assert_eq!((raw.codec, back.len()), (Codec::None, plain.len()));
    let z = Bytes::from(zstd::bulk::compress(&plain, 3).unwrap());
    let (e, back) = recognise("k", &z, plain.len() as u64, None).unwrap();
    assert_eq!(e.codec, Codec::Zstd);
    assert_eq!(back, plain);
    assert_eq!(e.plain_crc, Some(crc32fast::hash(&plain)));
    assert!(recognise("k", &z, plain.len() as u64 + 1, None).is_none());
    assert!(recognise("k", &plain.slice(1..), plain.len() as u64, None).is_none());
}

#[test]
fn text_values_compress_at_least_three_to_one_at_level_three() {
    let plain = text(4 << 20);
    let c = zstd::bulk::compress(&plain, 3).unwrap();
    let ratio = plain.len() as f64 / c.len() as f64;
    println!(
        "text values: {} -> {} bytes, {ratio:.2}:1",
        plain.len(),
        c.len()
    );
    assert!(ratio >= 3.0, "text values compress only {ratio:.2}:1");
}

#[test]
fn compression_settings_are_checked() {
    assert_eq!(
        Compression::parse("zstd", None).unwrap(),
        Compression::default()
    );
    assert_eq!(
        Compression::parse("zstd", Some(19)).unwrap(),
        Compression::Zstd { level: 19 }
    );
    assert_eq!(Compression::parse("none", None).unwrap(), Compression::None);
    for (kind, level) in [
        ("zstd", Some(0)),
        ("zstd", Some(20)),
        ("zstd", Some(-5)),
        ("zstd", Some(i64::MAX)),
    ] {
        let e = Compression::parse(kind, level).unwrap_err().to_string();
        assert!(
            e.contains("--compression-level") && e.contains("1 to 19"),
            "{e}"
        );
    }
    let e = Compression::parse("lz4", None).unwrap_err().to_string();
    assert!(e.contains("lz4") && e.contains("zstd or none"), "{e}");
}
