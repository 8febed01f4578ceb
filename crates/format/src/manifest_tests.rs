//! Tests of `manifest.rs`: the format round trips and its checks.
use super::*;

fn entry(key: &str, len: u64) -> ObjectEntry {
    ObjectEntry::raw(key.into(), len, 1, Uuid::from_u128(9), 1)
}

fn sample() -> Manifest {
    Manifest {
        format: FORMAT,
        lineage: Uuid::from_u128(9),
        generation: 1,
        commit_seq: 15,
        created_at: now_rfc3339(),
        wal_floor: 0,
        wal_id: Uuid::from_u128(3),
        wal_number: 2,
        snapshot: None,
        archives: vec![ArchiveEntry {
            object: entry(&archive_key(1, 1), 100),
            number: 1,
            frames: 10,
        }],
        segments: vec![
            SegmentEntry {
                object: entry(&segment_key(1, 0, 60), 60),
                start: 0,
                end: 60,
                frames: 2,
            },
            SegmentEntry {
                object: entry(&segment_key(1, 60, 90), 30),
                start: 60,
                end: 90,
                frames: 3,
            },
        ],
        side_files: vec![],
        parent: None,
        branch: None,
        branched_from: None,
    }
}

#[test]
fn round_trips_and_checks_commit_seq() {
    let m = sample();
    let key = m.key();
    assert_eq!(Manifest::decode(&key, &m.encode()).unwrap(), m);
    let mut bad = m.clone();
    bad.commit_seq = 16;
    let e = Manifest::decode(&manifest_key(16), &bad.encode()).unwrap_err();
    assert!(e.to_string().contains("add up to 15"), "{e}");
    assert!(matches!(
        Manifest::decode(&key, b"{\"format\": 1"),
        Err(ManifestError::Parse { .. })
    ));
}

#[test]
fn raw_entries_encode_as_before_and_old_entries_decode_as_raw() {
    let e = entry("gen/0000000001/snapshot.bin", 5);
    let json = serde_json::to_string(&e).unwrap();
    assert_eq!(
        json,
        r#"{"key":"gen/0000000001/snapshot.bin","len":5,"crc":1,"lineage":"00000000-0000-0000-0000-000000000009","generation":1}"#
    );
    let back: ObjectEntry = serde_json::from_str(&json).unwrap();
    assert_eq!(back.codec, Codec::None);
    assert!(!back.is_encoded());
    assert_eq!((back.plain_len(), back.plain_crc()), (5, 1));
}

#[test]
fn segments_are_contiguous_in_plain_bytes_and_encoded_entries_state_them() {
    let mut m = sample();
    m.segments[1].object.codec = Codec::Zstd;
    m.segments[1].object.len = 12;
    m.segments[1].object.plain_len = Some(30);
    m.segments[1].object.plain_crc = Some(7);
    assert_eq!(Manifest::decode(&m.key(), &m.encode()).unwrap(), m);
    assert!(m.encode().windows(6).any(|w| w == b"\"zstd\""));
    m.segments[1].object.plain_crc = None;
    assert_refused(&m, "without its plain length");
    m.segments[1].object.plain_crc = Some(7);
    m.segments[1].object.plain_len = Some(31);
    assert_refused(&m, "not contiguous");
}

#[test]
fn rejects_gaps() {
    let mut m = sample();
    m.segments[1].start = 61;
    assert_refused(&m, "not contiguous");
}

/// The manifest's own check refuses it, with `why` in the error.
fn assert_refused(m: &Manifest, why: &str) {
    let e = m.check(&m.key()).unwrap_err().to_string();
    assert!(e.contains(why), "{e}");
}

#[test]
fn keys_parse_back() {
    assert_eq!(parse_manifest_key(&manifest_key(42)), Some(42));
    assert_eq!(parse_generation(&segment_key(7, 0, 5)), Some(7));
    assert_eq!(
        parse_segment_key(7, &segment_key(7, 10, 50)),
        Some((10, 50))
    );
    assert_eq!(parse_segment_key(7, &segment_key(8, 10, 50)), None);
    assert_eq!(parse_manifest_key("manifests/x.json"), None);
}

#[test]
fn pointer_keys_parse_back_and_newer_sorts_first() {
    let (a, b) = (pointer_key(1), pointer_key(2));
    assert!(b < a, "{b} sorts before {a}");
    assert_eq!(parse_pointer_key(&a), Some(1));
    assert_eq!(parse_pointer_key(&b), Some(2));
    assert_eq!(parse_pointer_key(&pointer_key(u64::MAX)), Some(u64::MAX));
    assert_eq!(parse_pointer_key(&pointer_key(0)), None);
    assert_eq!(parse_pointer_key(&format!("{a}x")), None);
    assert_eq!(parse_pointer_key("latest/x"), None);
}

#[test]
fn branched_from_is_carried_by_later_manifests_of_a_branch_only() {
    let origin = BranchOrigin {
        prefix: "s3://bucket/parent".into(),
        lineage: Uuid::from_u128(9),
        manifest: manifest_key(40),
        commit_seq: 40,
    };
    let mut m = sample();
    m.branched_from = Some(origin.clone());
    let key = m.key();
    assert_eq!(Manifest::decode(&key, &m.encode()).unwrap(), m);
    assert_eq!(m.origin(), Some(&origin));
    // Written only when set: a manifest of a prefix that is no branch encodes as before.
    assert!(!sample().encode().windows(13).any(|w| w == b"branched_from"));

    let mut bad = m.clone();
    bad.branched_from.as_mut().unwrap().prefix = "s3://bucket/../other".into();
    let e = Manifest::decode(&key, &bad.encode())
        .unwrap_err()
        .to_string();
    assert!(e.contains("branched_from"), "{e}");

    // A branch manifest says where it came from in `branch`, never in both.
    let mut branch = sample();
    branch.generation = 0;
    branch.branch = Some(BranchOrigin {
        commit_seq: branch.commit_seq,
        ..origin.clone()
    });
    for o in branch.objects_mut() {
        o.prefix = Some(origin.prefix.clone());
    }
    Manifest::decode(&key, &branch.encode()).expect("a branch manifest");
    branch.branched_from = Some(origin.clone());
    let e = Manifest::decode(&key, &branch.encode())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no branched_from"), "{e}");
}
