use super::*;

#[test]
fn wal_header_round_trips_and_rejects_corruption() {
    let h = WalHeader {
        wal_id: Uuid::from_u128(7),
        number: 3,
        floor: 99,
    };
    let mut b = h.encode();
    assert_eq!(WalHeader::decode(&b).unwrap(), h);
    b[30] ^= 1;
    assert_eq!(
        WalHeader::decode(&b),
        Err(FormatError::HeaderCrc { what: "WAL header" })
    );
    assert!(matches!(
        WalHeader::decode(&b[..10]),
        Err(FormatError::Truncated { .. })
    ));
}

#[test]
fn scan_stops_at_torn_tail() {
    let mut buf = Vec::new();
    for seq in 11..=13 {
        encode_frame(seq, format!("commit {seq}").as_bytes(), &mut buf);
    }
    let full = buf.len();
    encode_frame(14, b"torn", &mut buf);
    buf.truncate(buf.len() - 2);
    let scan = scan_frames(&buf, 11);
    assert_eq!(scan.frames.len(), 3);
    assert_eq!(scan.valid_len, full);
    assert_eq!(scan.last_seq, 13);
    assert_eq!(scan.stop, Some(TailStop::Short));
    let scan = scan_frames(&buf[..full], 12);
    assert_eq!(
        scan.stop,
        Some(TailStop::WrongSeq {
            expected: 12,
            found: 11
        })
    );
    assert_eq!(scan.last_seq, 11);
}

#[test]
fn snapshot_round_trips_and_checks_payload() {
    let mut file = encode_snapshot(Uuid::from_u128(1), 40, Some(Uuid::from_u128(2)), b"map");
    let (h, p) = decode_snapshot(&file).unwrap();
    assert_eq!(h.commit_seq, 40);
    assert_eq!(h.kept_wal_id, Some(Uuid::from_u128(2)));
    assert_eq!(p, b"map");
    let n = file.len();
    file[n - 6] ^= 0xff;
    assert_eq!(
        decode_snapshot(&file),
        Err(FormatError::PayloadCrc { what: "snapshot" })
    );
}

/// The streaming check answers exactly what the whole-file decode does, wherever the
/// chunks end.
#[test]
fn check_snapshot_agrees_with_decode_snapshot() {
    let good = encode_snapshot(Uuid::from_u128(1), 40, None, &[7u8; 1000]);
    let mut flipped = good.clone();
    flipped[500] ^= 1;
    let mut longer = good.clone();
    longer.push(0);
    let mut huge = good.clone();
    huge[48..56].copy_from_slice(&u64::MAX.to_le_bytes());
    let crc = crc32fast::hash(&huge[..56]);
    huge[56..60].copy_from_slice(&crc.to_le_bytes());
    let cases = [
        good.clone(),
        flipped,
        longer,
        good[..good.len() - 1].to_vec(),
        good[..30].to_vec(),
        huge,
        Vec::new(),
    ];
    for case in &cases {
        let whole = decode_snapshot(case).map(|(h, _)| h);
        for chunk in [1, 3, 64, 1 << 20] {
            let streamed = match check_snapshot(&case[..], chunk) {
                Ok(h) => Ok(h),
                Err(CheckError::Format(e)) => Err(e),
                Err(CheckError::Io(e)) => panic!("{e}"),
            };
            assert_eq!(streamed, whole, "chunk {chunk}, {} bytes", case.len());
        }
    }
}

#[test]
fn extreme_seqs_and_lengths_are_errors_not_panics() {
    let h = WalHeader {
        wal_id: Uuid::from_u128(1),
        number: 1,
        floor: u64::MAX,
    };
    assert!(matches!(
        WalHeader::decode(&h.encode()),
        Err(FormatError::Invalid { .. })
    ));
    assert!(scan_wal(&h.encode()).is_err());
    // first_seq 0 with no frames, and a frame at u64::MAX followed by another.
    assert_eq!(scan_frames(&[], 0).last_seq, u64::MAX);
    let mut buf = Vec::new();
    encode_frame(u64::MAX, b"last", &mut buf);
    encode_frame(0, b"wrapped", &mut buf);
    let scan = scan_frames(&buf, u64::MAX);
    assert_eq!(scan.frames.len(), 1);
    assert_eq!(scan.last_seq, u64::MAX);
    assert!(matches!(scan.stop, Some(TailStop::WrongSeq { .. })));
    // A snapshot header claiming an enormous payload.
    let header = SnapshotHeader {
        snapshot_id: Uuid::from_u128(1),
        commit_seq: 1,
        kept_wal_id: None,
        payload_len: u64::MAX - 10,
    };
    assert_eq!(header.file_len(), u64::MAX);
    assert!(matches!(
        decode_snapshot(&header.encode()),
        Err(FormatError::Invalid { .. })
    ));
}

#[test]
fn position_round_trips() {
    let p = WalPosition {
        snapshot_id: None,
        wal_id: Uuid::from_u128(5),
        wal_number: 2,
        durable_len: 4096,
        commit_seq: 77,
    };
    assert_eq!(WalPosition::decode(&p.encode()).unwrap(), p);
}
