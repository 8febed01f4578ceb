//! [`StreamedSource`] against a real store written by the reference engine: which reports
//! count, which are stale, which the files contradict, and what happens as streams come and go.

mod support;

use mushroom_backup::store::engine::{Engine, workload_ops};
use mushroom_backup::store::format::WalPosition;
use mushroom_backup::wal_source::{AttachError, DEFAULT_MAX_STREAMS, StreamedSource, WalSource};
use support::store::open_engine as open;
use uuid::Uuid;

fn commit(engine: &mut Engine, n: u64) -> WalPosition {
    let mut pos = engine.position();
    for _ in 0..n {
        let seq = engine.commit_seq() + 1;
        engine.commit(&workload_ops(5, seq, 32)).unwrap();
        pos = engine.sync().unwrap();
    }
    pos
}

async fn position(source: &StreamedSource) -> WalPosition {
    source.durable_wal_position().await.expect("a position")
}

#[tokio::test]
async fn only_what_the_files_confirm_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut engine = open(tmp.path());
    let source = StreamedSource::new(tmp.path());
    let node = source.attach("node").unwrap();
    let p5 = commit(&mut engine, 5);
    let p9 = commit(&mut engine, 4);
    node.report(p5);
    assert_eq!(position(&source).await, p5);
    assert!(source.problem().is_none());

    // Every way a report can claim what wal.bin does not hold.
    let liar = source.attach("liar").unwrap();
    let lies = [
        WalPosition {
            commit_seq: u64::MAX,
            ..p9
        },
        WalPosition {
            durable_len: p9.durable_len + 1,
            ..p9
        },
        WalPosition {
            durable_len: p9.durable_len - 1,
            ..p9
        },
        WalPosition {
            durable_len: u64::MAX,
            commit_seq: u64::MAX,
            ..p9
        },
        WalPosition {
            wal_number: p9.wal_number + 1,
            ..p9
        },
        WalPosition {
            wal_id: Uuid::from_u128(42),
            commit_seq: 1_000,
            ..p9
        },
    ];
    for (i, lie) in lies.iter().enumerate() {
        liar.report(*lie);
        assert_eq!(position(&source).await, p5, "lie {i} counted: {lie:?}");
        assert_eq!(
            source.contradicted_reports(),
            i as u64 + 1,
            "lie {i}: {lie:?}"
        );
        let problem = source.problem().expect("a lie shows");
        assert!(
            problem.contains("from liar") && problem.contains("contradict"),
            "{problem}"
        );
    }
    // The honest node goes on beside it.
    node.report(p9);
    assert_eq!(position(&source).await, p9);
    // The liar telling the truth once clears its flag; leaving would too.
    let p12 = commit(&mut engine, 3);
    liar.report(p12);
    assert_eq!(position(&source).await, p12);
    assert!(source.problem().is_none());
    liar.report(lies[0]);
    assert_eq!(position(&source).await, p12);
    assert!(source.problem().is_some());
    drop(liar);
    assert!(source.problem().is_none());
    assert_eq!(
        position(&source).await,
        p12,
        "the mark stays while a stream is attached"
    );
}

#[tokio::test]
async fn late_and_stale_reports_never_rewind_and_new_files_are_news() {
    let tmp = tempfile::tempdir().unwrap();
    let mut engine = open(tmp.path());
    let source = StreamedSource::new(tmp.path());
    let old = source.attach("old").unwrap();
    let new = source.attach("new").unwrap();
    let p3 = commit(&mut engine, 3);
    let p7 = commit(&mut engine, 4);
    new.report(p7);
    old.report(p3);
    assert_eq!(position(&source).await, p7);
    drop(new);
    assert_eq!(
        position(&source).await,
        p7,
        "a late report on the old stream rewound it"
    );

    // A snapshot with no commits since: the same count in new files is taken.
    let snap = engine.snapshot().unwrap();
    assert_eq!(snap.commit_seq, p7.commit_seq);
    old.report(snap);
    assert_eq!(position(&source).await, snap);
    // A report naming the files the store has moved past is stale: not a lie, and no news.
    let again = source.attach("again").unwrap();
    again.report(p7);
    assert_eq!(position(&source).await, snap);
    assert_eq!(source.contradicted_reports(), 0);
    assert!(source.problem().is_none());

    // The old files with more commits than the new WAL starts after: a lie.
    again.report(WalPosition {
        commit_seq: snap.commit_seq + 1,
        ..p7
    });
    assert_eq!(position(&source).await, snap);
    assert_eq!(source.contradicted_reports(), 1);
    drop(again);

    // Rotation: frames go on in a new wal.bin.
    commit(&mut engine, 2);
    let rotated = engine.rotate().unwrap();
    let p12 = commit(&mut engine, 3);
    assert_ne!(p12.wal_id, snap.wal_id);
    old.report(p12);
    assert_eq!(position(&source).await, p12);
    let _ = rotated;
}

#[tokio::test]
async fn no_stream_no_reports_and_a_closed_source_refuses_streams() {
    let tmp = tempfile::tempdir().unwrap();
    let mut engine = open(tmp.path());
    let p4 = commit(&mut engine, 4);
    let source = StreamedSource::new(tmp.path());
    // No stream: the local source (the engine holds store.lock: wal.position).
    assert_eq!(position(&source).await, p4);
    let s = source.attach("node").unwrap();
    // Attached, nothing reported yet: still the local source.
    assert_eq!(position(&source).await, p4);
    let p6 = commit(&mut engine, 2);
    s.report(p6);
    assert_eq!(position(&source).await, p6);
    drop(s);
    assert_eq!(position(&source).await, p6);
    // Detached: the local source again, not the last report.
    let p8 = commit(&mut engine, 2);
    assert_eq!(position(&source).await, p8);

    let s = source.attach("node").unwrap();
    source.close();
    tokio::time::timeout(std::time::Duration::from_secs(60), s.closed())
        .await
        .expect("an attached stream hears of the close");
    assert!(source.attach("late").is_err());
}

/// Security review 4, Low 4: a lying stream's reports cost the store's other streams nothing.
/// A report below the confirmed position's length with more commits than it (the review's
/// lie, sent afresh on each of many streams) used to be scanned from `wal.bin`'s header each
/// time, under the lock every report of the store waits for. Now the confirmed frame boundary
/// settles it without reading a frame, and a lie past the mark is read from the mark on, never
/// from the header. Counted in bytes read, not timed.
#[tokio::test]
async fn a_lie_costs_no_scan_from_the_header_and_repeated_lies_no_scan_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let mut engine = open(tmp.path());
    let source = StreamedSource::new(tmp.path());
    let node = source.attach("node").unwrap();
    let p200 = commit(&mut engine, 200);
    node.report(p200);
    assert_eq!(position(&source).await, p200);
    let confirmed = source.scanned_bytes();
    assert!(confirmed > 0, "the first confirmation reads the frames");

    // Many streams, each sending many lies: shorter than the mark, with more commits.
    let liars: Vec<_> = (0..8)
        .map(|i| source.attach(format!("liar {i}")).unwrap())
        .collect();
    let mut lies = 0;
    for round in 0..25u64 {
        for (i, liar) in liars.iter().enumerate() {
            let i = i as u64;
            liar.report(WalPosition {
                durable_len: p200.durable_len - 1 - round * 8 - i,
                commit_seq: p200.commit_seq + 1 + round,
                ..p200
            });
            lies += 1;
        }
        assert_eq!(position(&source).await, p200, "round {round}");
    }
    assert_eq!(source.contradicted_reports(), lies);
    assert_eq!(
        source.scanned_bytes(),
        confirmed,
        "{lies} lies below the mark read frames of wal.bin"
    );
    let problem = source.problem().expect("the lies show");
    assert!(problem.contains("confirmed before"), "{problem}");

    // The honest node goes on: only the bytes after the mark are read.
    let p210 = commit(&mut engine, 10);
    node.report(p210);
    assert_eq!(position(&source).await, p210);
    assert_eq!(
        source.scanned_bytes(),
        confirmed + (p210.durable_len - p200.durable_len),
        "the honest report was not read on from the mark"
    );

    // A lie past the mark (commits written but not reported yet, claimed with more) is read
    // from the mark on, not from the header.
    let p215 = commit(&mut engine, 5);
    let before = source.scanned_bytes();
    liars[0].report(WalPosition {
        commit_seq: p215.commit_seq + 3,
        ..p215
    });
    assert_eq!(position(&source).await, p210);
    assert_eq!(
        source.scanned_bytes() - before,
        p215.durable_len - p210.durable_len,
        "a lie past the mark was read from elsewhere than the mark"
    );
}

#[tokio::test]
async fn a_store_takes_at_most_its_cap_of_streams_and_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let _engine = open(tmp.path());
    let source = StreamedSource::with_max_streams(tmp.path(), 3);
    let mut attached: Vec<_> = (0..3)
        .map(|i| source.attach(format!("node {i}")).unwrap())
        .collect();
    let refused = source.attach("one too many").err().expect("refused");
    assert_eq!(refused, AttachError::Full { cap: 3 });
    let msg = refused.to_string();
    assert!(
        msg.contains("3 position streams") && msg.contains("max_streams_per_store"),
        "{msg}"
    );
    // One ends: another attaches.
    attached.pop();
    attached.push(source.attach("next").expect("a stream after one ended"));
    assert!(source.attach("again too many").is_err());

    let default = StreamedSource::new(tmp.path());
    let all: Vec<_> = (0..DEFAULT_MAX_STREAMS)
        .map(|i| default.attach(format!("node {i}")).unwrap())
        .collect();
    assert_eq!(
        default.attach("over").err(),
        Some(AttachError::Full {
            cap: DEFAULT_MAX_STREAMS
        })
    );
    drop(all);
}
