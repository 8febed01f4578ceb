//! Tests of `health.rs`: how a runner's status and what was measured evaluate.
use super::*;

fn policy() -> HealthPolicy {
    HealthPolicy {
        wal_interval: Duration::from_secs(1),
        min_unhealthy_lag: Duration::from_secs(30),
        unhealthy_after_failures: 5,
    }
}

fn holding() -> RunnerStatus {
    RunnerStatus {
        lease: Some(LeaseState::Holding),
        ..RunnerStatus::default()
    }
}

#[test]
fn a_step_shows_its_phase_and_a_phase_alone_is_no_change_of_state() {
    let activity = StepActivity::default();
    assert_eq!(activity.get(), None);
    let mut s = RunnerStatus {
        activity: Activity::Stepping,
        ..holding()
    };
    let before = evaluate(&s, Progress::default(), &policy(), "me");
    assert_eq!(before.activity, "stepping");
    activity.set(StepPhase::Uploading {
        generation: 3,
        what: "archive 12 of 40".into(),
        done: 11,
        of: 42,
    });
    s.step = activity.get();
    let h = evaluate(&s, Progress::default(), &policy(), "me");
    assert_eq!(
        h.activity,
        "uploading archive 12 of 40 (generation 3, 11 of 42 objects up)"
    );
    assert!(h.same_state(&before));
    s.activity = Activity::Flushing;
    let h = evaluate(&s, Progress::default(), &policy(), "me");
    assert!(
        h.activity.starts_with("flushing: uploading archive 12"),
        "{h:?}"
    );
    // Not stepping: the phase is not shown.
    s.activity = Activity::Idle;
    assert_eq!(
        evaluate(&s, Progress::default(), &policy(), "me").activity,
        "idle"
    );
    activity.clear();
    assert_eq!(activity.get(), None);
}

#[test]
fn healthy_when_holding_and_caught_up() {
    let h = evaluate(&holding(), Progress::default(), &policy(), "me");
    assert!(h.healthy, "{h:?}");
    assert!(h.lease_held);
    assert_eq!(h.reason, "");
}

#[test]
fn every_cause_has_its_reason() {
    let p = policy();
    let mut s = holding();
    s.worker = WorkerState::Panicked("boom".into());
    assert!(
        evaluate(&s, Progress::default(), &p, "me")
            .reason
            .contains("panicked: boom")
    );
    s.worker = WorkerState::Exited("shut down".into());
    assert!(
        evaluate(&s, Progress::default(), &p, "me")
            .reason
            .contains("exited: shut down")
    );

    let mut s = holding();
    s.refused = Some("fewer commits than the newest restore point".into());
    assert!(
        evaluate(&s, Progress::default(), &p, "me")
            .reason
            .contains("fewer commits")
    );

    let s = RunnerStatus {
        lease: Some(LeaseState::HeldElsewhere {
            holder: "abc".into(),
            host: "db7".into(),
            store: "s1".into(),
        }),
        ..RunnerStatus::default()
    };
    let h = evaluate(&s, Progress::default(), &p, "me");
    assert!(!h.healthy && h.reason.contains("abc on db7"), "{h:?}");
    assert_eq!(h.lease_holder, "abc@db7");

    let mut s = holding();
    s.consecutive_failures = 4;
    s.last_error = Some("503 SlowDown".into());
    assert!(evaluate(&s, Progress::default(), &p, "me").healthy);
    s.consecutive_failures = 5;
    assert!(
        evaluate(&s, Progress::default(), &p, "me")
            .reason
            .contains("503 SlowDown")
    );

    let lagging = Progress {
        durable_commit_seq: 90,
        shipped_commit_seq: 40,
        restore_point_commit_seq: 40,
        bucket_durable_commit_seq: 40,
        unshipped_for: Duration::from_secs(31),
        immutable: None,
        branched_from: None,
    };
    let h = evaluate(&holding(), lagging.clone(), &p, "me");
    assert!(
        !h.healthy && h.reason.contains("41..=90 unshipped"),
        "{h:?}"
    );
    let ok = Progress {
        unshipped_for: Duration::from_secs(29),
        ..lagging.clone()
    };
    assert!(evaluate(&holding(), ok, &p, "me").healthy);

    let mut s = holding();
    s.source_problem = Some("a report from 10.0.0.7 was dropped".into());
    let h = evaluate(&s, Progress::default(), &p, "me");
    assert!(
        !h.healthy
            && h.reason
                .contains("position reports refused: a report from 10.0.0.7"),
        "{h:?}"
    );

    let mut i = ImmutableHealth::default();
    let held = |i| Progress {
        immutable: Some(i),
        ..Progress::default()
    };
    assert!(evaluate(&holding(), held(i), &p, "me").healthy);
    i.objects_short = 3;
    let h = evaluate(&holding(), held(i), &p, "me");
    assert!(
        !h.healthy && h.reason.starts_with("3 objects named by"),
        "{h:?}"
    );
}

#[test]
fn a_pause_is_healthy_within_its_deadline_and_unhealthy_past_it() {
    let p = policy();
    let lagging = Progress {
        durable_commit_seq: 90,
        shipped_commit_seq: 40,
        restore_point_commit_seq: 40,
        bucket_durable_commit_seq: 40,
        unshipped_for: Duration::from_secs(3600),
        immutable: None,
        branched_from: None,
    };
    let mut s = holding();
    s.pause = Some(Pause {
        reason: "maintenance".into(),
        paused_at_unix_ms: 1_000,
        until_unix_ms: 2_000,
    });
    assert!(!s.pause.as_ref().unwrap().overdue_at(1_999));
    assert!(s.pause.as_ref().unwrap().overdue_at(2_000));
    let h = evaluate(&s, lagging.clone(), &p, "me");
    assert!(h.healthy, "a pause's lag is no reason: {h:?}");
    assert_eq!(h.paused, s.pause);
    assert!(h.notes.iter().any(|n| n.contains("maintenance")), "{h:?}");
    s.pause_overdue = true;
    let h = evaluate(&s, lagging.clone(), &p, "me");
    assert!(!h.healthy, "{h:?}");
    assert!(h.reason.starts_with("paused past its deadline"), "{h:?}");
    assert!(h.reason.contains("until Resume"), "{h:?}");
    assert_eq!(h.reasons.len(), 1, "and not the lag: {h:?}");
    s.pause = None;
    s.pause_overdue = false;
    assert!(
        !evaluate(&s, lagging.clone(), &p, "me").healthy,
        "unpaused, the lag counts"
    );
}

#[test]
fn a_failed_drill_is_unhealthy_until_one_succeeds() {
    let p = policy();
    let mut s = holding();
    let failed = DrillResult {
        ok: false,
        commit_seq: 10,
        manifest_key: "manifests/x.json".into(),
        duration_ms: 5,
        bytes: 100,
        error: "gen/1/archive/3: CRC mismatch".into(),
        finished_at_unix_ms: 1_000,
        last_ok_at_unix_ms: 0,
        predicted_ms: 4,
    };
    s.drill = Some(failed.clone());
    let h = evaluate(&s, Progress::default(), &p, "me");
    assert!(!h.healthy && h.reason.contains("gen/1/archive/3"), "{h:?}");
    assert_eq!(h.last_drill, Some(failed.clone()));
    s.drill = Some(DrillResult {
        ok: true,
        error: String::new(),
        last_ok_at_unix_ms: 2_000,
        ..failed
    });
    s.drill_note = Some("drill skipped".into());
    let h = evaluate(&s, Progress::default(), &p, "me");
    assert!(h.healthy, "{h:?}");
    assert!(h.notes.contains(&"drill skipped".to_string()), "{h:?}");
}

#[test]
fn conditional_writes_off_is_a_note() {
    let mut s = holding();
    s.conditional_writes = false;
    let h = evaluate(&s, Progress::default(), &policy(), "me");
    assert!(h.healthy);
    assert!(h.notes[0].contains("conditional writes are off"));
}
