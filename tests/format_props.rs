//! Property tests of the store's decoders on hostile input (DESIGN.md section 9: a clear
//! error, never a panic, never data loss): arbitrary and mutated bytes never panic, valid
//! encodings round-trip, a flipped byte is never accepted, a WAL cut at any byte keeps
//! exactly the frames wholly before the cut, and a WAL checked piece by piece as it is read
//! gets exactly the answer of a scan of all of it.

#[path = "support/generators.rs"]
mod generators;

use generators::{Trickle, edge_u64, map, op, payloads, uuid, wal_file};
use mushroom_backup::store::engine::codec::{decode_batch, decode_map, encode_batch, encode_map};
use mushroom_backup::store::format::{
    SnapshotHeader, WAL_HEADER_LEN, WalHeader, WalPosition, check_wal, decode_snapshot,
    encode_frame, encode_snapshot, scan_frames, scan_wal,
};
use proptest::prelude::*;
use uuid::Uuid;

/// Feeds `b` to every decoder; each must return, and the scans' results must be coherent.
fn decode_everything(b: &[u8], first_seq: u64) {
    let _ = WalHeader::decode(b);
    let _ = SnapshotHeader::decode(b);
    let _ = decode_snapshot(b);
    let _ = WalPosition::decode(b);
    let _ = decode_batch(b);
    let _ = decode_map(b);
    let scan = scan_frames(b, first_seq);
    assert!(scan.valid_len <= b.len());
    assert_eq!(scan.stop.is_none(), scan.valid_len == b.len());
    let mut at = 0;
    for f in &scan.frames {
        assert_eq!(f.start, at);
        at = f.end;
    }
    assert_eq!(at, scan.valid_len);
    if let Ok(wal) = scan_wal(b) {
        assert!(wal.valid_len as usize <= b.len());
        assert_eq!(wal.last_seq, wal.header.floor + wal.frames.len() as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..200), seq in any::<u64>()) {
        decode_everything(&b, seq);
    }

    #[test]
    fn arbitrary_bytes_behind_valid_magics_never_panic(
        magic in prop::sample::select(vec![&b"MDBWAL01"[..], b"MDBSNP01", b"MDBPOS01", b"\x01"]),
        rest in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut b = magic.to_vec();
        b.extend_from_slice(&rest);
        decode_everything(&b, 1);
    }

    #[test]
    fn valid_crcs_over_extreme_fields_never_panic(
        id in uuid(),
        number in edge_u64(),
        floor in edge_u64(),
        first_seq in edge_u64(),
        seqs in prop::collection::vec(edge_u64(), 0..4),
        payload_len in edge_u64(),
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // Headers whose CRCs are right but whose numbers are hostile.
        let mut wal = WalHeader { wal_id: id, number, floor }.encode().to_vec();
        for (i, seq) in seqs.iter().enumerate() {
            encode_frame(*seq, &tail[..i.min(tail.len())], &mut wal);
        }
        decode_everything(&wal, first_seq);
        decode_everything(&wal[WAL_HEADER_LEN..], first_seq);
        let header = SnapshotHeader { snapshot_id: id, commit_seq: floor, kept_wal_id: None, payload_len };
        let mut snap = header.encode().to_vec();
        snap.extend_from_slice(&tail);
        decode_everything(&snap, first_seq);
    }

    #[test]
    fn mutated_valid_encodings_never_panic(
        id in uuid(),
        floor in 0u64..1000,
        payloads in payloads(),
        ops in prop::collection::vec(op(), 0..6),
        map in map(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        pick in 0usize..4,
    ) {
        let mut b = match pick {
            0 => wal_file(id, 3, floor, &payloads).0,
            1 => encode_snapshot(id, floor, Some(id), &encode_map(&map)),
            2 => encode_batch(&ops),
            _ => encode_map(&map),
        };
        for (at, byte, kind) in edits {
            if b.is_empty() {
                b.push(byte);
                continue;
            }
            let i = at.index(b.len());
            match kind {
                0 => b[i] ^= byte | 1,
                1 => b.truncate(i),
                _ => b.insert(i, byte),
            }
        }
        decode_everything(&b, floor + 1);
    }

    #[test]
    fn valid_encodings_round_trip(
        id in uuid(),
        other in uuid(),
        number in any::<u64>(),
        floor in 0u64..u64::MAX / 2,
        payloads in payloads(),
        ops in prop::collection::vec(op(), 0..8),
        map in map(),
        durable_len in any::<u64>(),
        keep in any::<bool>(),
    ) {
        let h = WalHeader { wal_id: id, number, floor };
        prop_assert_eq!(WalHeader::decode(&h.encode()), Ok(h));

        let (file, ends) = wal_file(id, number, floor, &payloads);
        let scan = scan_wal(&file).unwrap();
        prop_assert_eq!(scan.header, h);
        prop_assert_eq!(scan.stop, None);
        prop_assert_eq!(scan.valid_len, file.len() as u64);
        prop_assert_eq!(scan.last_seq, floor + payloads.len() as u64);
        for (i, f) in scan.frames.iter().enumerate() {
            prop_assert_eq!(f.seq, floor + 1 + i as u64);
            prop_assert_eq!(f.end, ends[i]);
            prop_assert_eq!(f.payload(&file), &payloads[i][..]);
        }

        let payload = encode_map(&map);
        let kept = keep.then_some(other);
        let snap = encode_snapshot(id, floor, kept, &payload);
        let (sh, p) = decode_snapshot(&snap).unwrap();
        prop_assert_eq!(sh.snapshot_id, id);
        prop_assert_eq!(sh.commit_seq, floor);
        prop_assert_eq!(sh.kept_wal_id, kept.filter(|k| !k.is_nil()));
        prop_assert_eq!(p, &payload[..]);
        prop_assert_eq!(decode_map(p).unwrap(), map);

        let pos = WalPosition {
            snapshot_id: kept.filter(|k| !k.is_nil()),
            wal_id: id,
            wal_number: number,
            durable_len,
            commit_seq: floor,
        };
        prop_assert_eq!(WalPosition::decode(&pos.encode()), Ok(pos));
        prop_assert_eq!(decode_batch(&encode_batch(&ops)).unwrap(), ops);
    }

    #[test]
    fn a_flipped_byte_is_never_accepted(
        id in uuid(),
        floor in 0u64..1000,
        payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 1..8),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let (mut file, ends) = wal_file(id, 5, floor, &payloads);
        let i = at.index(file.len());
        let original = file.clone();
        file[i] ^= mask;
        match scan_wal(&file) {
            // The header's 4 trailing bytes are zero padding that no CRC covers.
            Ok(scan) if i < WAL_HEADER_LEN => {
                prop_assert!(i >= WAL_HEADER_LEN - 4, "flip at {i} accepted in the header");
                prop_assert_eq!(scan.frames.len(), payloads.len());
            }
            Err(_) => prop_assert!(i < WAL_HEADER_LEN - 4, "frame flip at {i} broke the header"),
            Ok(scan) => {
                // The flipped frame `k` and everything after it are cut; frames before stay.
                let k = ends.iter().position(|&end| i < end).unwrap();
                let start = if k == 0 { WAL_HEADER_LEN } else { ends[k - 1] };
                prop_assert_eq!(scan.frames.len(), k, "flip at {} in frame {}", i, k);
                prop_assert_eq!(scan.valid_len as usize, start);
                prop_assert!(scan.stop.is_some());
                for f in &scan.frames {
                    prop_assert_eq!(f.payload(&file), f.payload(&original));
                }
            }
        }

        let snap = encode_snapshot(id, floor, None, &payloads.concat());
        let mut bad = snap.clone();
        let j = at.index(bad.len());
        bad[j] ^= mask;
        prop_assert!(decode_snapshot(&bad).is_err(), "snapshot flip at {} accepted", j);

        let pos = WalPosition {
            snapshot_id: Some(id),
            wal_id: id,
            wal_number: 5,
            durable_len: file.len() as u64,
            commit_seq: floor,
        };
        let mut bad = pos.encode();
        let j = at.index(bad.len());
        bad[j] ^= mask;
        prop_assert!(WalPosition::decode(&bad).is_err(), "position flip at {} accepted", j);
    }

    #[test]
    fn a_cut_keeps_exactly_the_frames_before_it(
        floor in 0u64..1000,
        payloads in payloads(),
        at in any::<prop::sample::Index>(),
    ) {
        let (file, ends) = wal_file(Uuid::from_u128(9), 2, floor, &payloads);
        let cut = at.index(file.len() + 1);
        let scan = scan_wal(&file[..cut]);
        if cut < WAL_HEADER_LEN {
            prop_assert!(scan.is_err());
            return Ok(());
        }
        let scan = scan.unwrap();
        let kept = ends.iter().take_while(|&&end| end <= cut).count();
        prop_assert_eq!(scan.frames.len(), kept);
        let valid = if kept == 0 { WAL_HEADER_LEN } else { ends[kept - 1] };
        prop_assert_eq!(scan.valid_len as usize, valid);
        prop_assert_eq!(scan.last_seq, floor + kept as u64);
        prop_assert_eq!(scan.stop.is_some(), cut != valid);
        // Scanning only the frame bytes agrees.
        let frames = scan_frames(&file[WAL_HEADER_LEN..cut], floor + 1);
        prop_assert_eq!(frames.frames.len(), kept);
        prop_assert_eq!(frames.valid_len + WAL_HEADER_LEN, valid);
    }

    #[test]
    fn a_wal_checked_in_pieces_reads_as_a_scan_of_the_whole(
        floor in prop_oneof![0u64..1000, (8u64..12).prop_map(|d| u64::MAX - d)],
        payloads in payloads(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        mask in any::<u8>(),
        junk in prop::collection::vec(any::<u8>(), 0..40),
        how in 0u8..4,
        chunk in 1usize..80,
    ) {
        let (mut file, _) = wal_file(Uuid::from_u128(3), 7, floor, &payloads);
        match how {
            // As written; cut anywhere; a flipped byte; junk after the frames.
            0 => {}
            1 => file.truncate(cut.index(file.len() + 1)),
            2 => {
                let j = flip.index(file.len());
                file[j] ^= mask.max(1);
            }
            _ => file.extend_from_slice(&junk),
        }
        let mut buf = Vec::new();
        for read_size in [chunk, 3, usize::MAX] {
            let checked = check_wal(Trickle(&file, read_size), chunk, &mut buf);
            match scan_wal(&file) {
                Err(e) => prop_assert_eq!(
                    checked.map_err(|e| e.to_string()).unwrap_err(),
                    e.to_string()
                ),
                Ok(scan) => {
                    let c = checked.unwrap();
                    prop_assert_eq!(c.header, scan.header);
                    prop_assert_eq!(c.frames, scan.frames.len() as u64);
                    prop_assert_eq!(c.valid_len, scan.valid_len);
                    prop_assert_eq!(c.last_seq, scan.last_seq);
                    prop_assert_eq!(c.stop, scan.stop);
                    prop_assert_eq!(c.len, file.len() as u64);
                    prop_assert_eq!(c.crc, crc32fast::hash(&file));
                }
            }
        }
    }
}
