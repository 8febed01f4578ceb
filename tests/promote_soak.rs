//! The RTO soak of issue 28 (`#[ignore]`: about 15 s a round; run
//! with `CI=true bash scripts/test.sh --test promote_soak --run-ignored only`).
//!
//! Every round, on moto: a `serve` backs a store up in `durability = sync` while the reference
//! node commits into it (`--acked-log`: every acknowledged commit, fsynced before the
//! acknowledgement) and a standby follows the prefix (`restore --follow`). Then the host dies
//! (SIGKILL of serve and node), the standby is stopped and `promote` runs, without
//! `--wait-for-lease`: the sync store's lease record promises the acknowledgement window
//! (`lease::ACK_WINDOW`), so the promotion takes the lease of the dead `serve` at once and waits
//! 1.15 s, whatever the TTL (before the window, it waited for the `serve`'s instance lease to
//! go stale: 28 s at the default TTL). RTO is the time from the kill to the promoted
//! store open and accepting commits: `promote` printed `promoted`, and a commit written into
//! the promoted store then shipped (its log says so). Missing: acknowledged commits the
//! promoted store does not hold. `SOAK_ROUNDS` sets the rounds (default 10), `SOAK_KEY=1`
//! encrypts the store (`support::soak`: one key file for every serve, standby and promote),
//! `SOAK_LEASE_TTL_MS` the lease TTL of serve and promote (default: the default, 30 s); the
//! figures are printed as a `FIGURE promote-rto` line (p50, max, missing).

mod support;

use std::time::Duration;

use support::binary::{self, Running};
use support::primary::{self, SyncPrimary, TwoServes};
use support::served::{self, DEADLINE};

/// Commits per second the node is asked for.
const RATE: &str = "40";

/// What the rounds of a soak measured, and its `FIGURE` line.
#[derive(Default)]
struct Tally {
    rtos: Vec<Duration>,
    promoted_at: Vec<Duration>,
    acked: usize,
    missing: usize,
}

impl Tally {
    /// One round: the acked log's commits, the commit promoted at, the time from the kill to
    /// the promotion's answer (`took`) and to a commit of the promoted store shipped (`rto`).
    fn round(
        &mut self,
        label: &str,
        log: &std::path::Path,
        applied: u64,
        took: Duration,
        rto: Duration,
    ) {
        let seqs = served::acked_log(log);
        let missing = seqs.iter().filter(|s| **s > applied).count();
        eprintln!(
            "{label}: {} acknowledged (highest {:?}); promoted at commit {applied} after \
             {took:?}; accepting commits after {rto:?}; missing {missing}",
            seqs.len(),
            seqs.last()
        );
        self.acked += seqs.len();
        self.missing += missing;
        self.rtos.push(rto);
        self.promoted_at.push(took);
    }

    /// Prints `FIGURE name: rounds, what; RTO ...` and fails on a missing commit.
    fn figure(mut self, name: &str, what: &str) {
        let pct = |v: &mut Vec<Duration>, q: f64| {
            v.sort();
            v[((v.len() - 1) as f64 * q).round() as usize]
        };
        eprintln!(
            "FIGURE {name}: {} rounds, {what}; RTO (kill to a commit of the promoted store \
             shipped) p50 {:?}, max {:?}; kill to the promotion's answer p50 {:?}, max {:?}; {} \
             commits acknowledged, {} missing",
            self.rtos.len(),
            pct(&mut self.rtos, 0.5),
            pct(&mut self.rtos, 1.0),
            pct(&mut self.promoted_at, 0.5),
            pct(&mut self.promoted_at, 1.0),
            self.acked,
            self.missing,
        );
        assert_eq!(
            self.missing, 0,
            "acknowledged commits missing from the promoted store"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: about 15 s a round"]
async fn promotion_after_the_primary_host_dies_rto_and_no_acknowledged_commit_missing() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rounds = support::soak::rounds(10);
    // The lease TTL of serve and promote (ms); unset: the default (30 s).
    let ttl_ms = std::env::var("SOAK_LEASE_TTL_MS").ok();
    let bucket = support::s3::create_bucket(&endpoint, "promote-soak").await;
    let mut tally = Tally::default();
    for round in 1..=rounds {
        let url = format!("s3://{bucket}/r{round}");
        let d = served::dirs();
        let dir = d.root.join("primary");
        std::fs::create_dir_all(&dir).unwrap();
        let (standby_dir, log) = (d.base.join("standby"), d.base.join("acked.log"));
        // An instance id of its own each round: the last round's (SIGKILLed) instance lease
        // in the same lease root would hold a new serve of the same id back for a TTL.
        let mut cmd = primary::serve(&d, &endpoint, &format!("primary-{round}"));
        if let Some(ttl) = &ttl_ms {
            cmd.args(["--lease-ttl-ms", ttl]);
        }
        let mut primary = SyncPrimary::start(
            (&format!("serve (round {round})"), cmd),
            &format!("node (round {round})"),
            &dir,
            &url,
            &log,
            RATE,
        )
        .await;
        primary.wait_acked(&log, 10, &format!("no acknowledgement in round {round}"));
        // A restore point exists within its interval: the standby starts from it.
        primary.pump_for(Duration::from_millis(1000));
        let follow = support::soak::keyed(binary::standby(&endpoint, &url, &standby_dir, 100, 200));
        let mut s = Running::spawn(&format!("standby (round {round})"), follow);
        primary.pump_for(Duration::from_millis(2000));

        // The host dies.
        let killed = primary.kill();
        s.signal(libc::SIGTERM);
        assert!(s.wait_exit(DEADLINE).success(), "the standby failed");
        let mut promote = primary::promote(&endpoint, &url, &standby_dir);
        if let Some(ttl) = &ttl_ms {
            promote.env("MUSHROOMDB_BACKUP_LEASE_TTL_MS", ttl);
        }
        let mut p = Running::spawn(
            &format!("promote (round {round})"),
            support::soak::keyed(promote),
        );
        let promoted = primary::promoted(&mut p);
        let took = killed.elapsed();
        let applied = promoted["applied"]["commit_seq"].as_u64().unwrap();
        // Accepting commits: one written into the promoted store ships.
        binary::write_store(&standby_dir, 1);
        binary::wait_shipped_past(&mut p, applied, DEADLINE);
        let rto = killed.elapsed();
        p.signal(libc::SIGTERM);
        assert!(
            p.wait_exit(DEADLINE).success(),
            "the promoted backup failed"
        );

        tally.round(&format!("round {round}"), &log, applied, took, rto);
    }
    let ttl = ttl_ms
        .as_deref()
        .map_or("default (30 s)".to_string(), |t| format!("{t} ms"));
    support::soak::assert_encrypted(&endpoint, &format!("s3://{bucket}/r1"));
    tally.figure(
        "promote-rto",
        &format!("lease TTL {ttl}, {}", support::soak::mode()),
    );
}

/// The same soak with the promotion in the service, the way an operator fails over a fleet:
/// the primary `serve`'s S3 goes through the fault proxy (5 % `503 SlowDown`, 3 % dropped after
/// taking effect, 2 % delayed), a second `serve` hosts the standby (`ctl standby`), and after
/// the SIGKILL of the primary's host `ctl promote` (the `Promote` RPC, no `--wait-for-lease`)
/// makes it the primary. RTO: from the kill until a commit written into the promoted store
/// has shipped (the promoted store's health says so). `SOAK_ROUNDS` as above; the figures are
/// printed as a `FIGURE promote-rto-service` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: about 20 s a round"]
async fn promotion_in_the_service_through_a_fault_proxy_rto_and_no_acknowledged_commit_missing() {
    use support::fault_proxy::{FaultPlan, FaultProxy};
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rounds = support::soak::rounds(10);
    let bucket = support::s3::create_bucket(&endpoint, "promote-soak-svc").await;
    let proxy = FaultProxy::start(&endpoint, FaultPlan::default());
    let mut tally = Tally::default();
    let serve = primary::serve;
    for round in 1..=rounds {
        let url = format!("s3://{bucket}/r{round}");
        let round_dirs = TwoServes::new();
        let serve_a = serve(&round_dirs.a, proxy.url(), &format!("primary-{round}"));
        let mut primary = round_dirs.primary(round, serve_a, &url, RATE, 10).await;
        let TwoServes {
            b,
            standby_dir,
            log,
            ..
        } = round_dirs;
        served::wait_health(&primary.c, &primary.r.store_id, "a restore point", |h| {
            h.restore_point_commit_seq > 0
        })
        .await;
        let (mut sb, addr_b) = served::start(
            &format!("standby serve (round {round})"),
            serve(&b, &endpoint, &format!("standby-{round}")),
        );
        let cb = served::client(addr_b).await;
        let id = served::ctl_standby(addr_b, &standby_dir, &url);
        served::wait_health(&cb, &id, "the standby applying", |h| {
            h.role == "standby" && h.standby_commit_seq > 0
        })
        .await;
        primary.pump_for(Duration::from_millis(2000));

        // The primary's host dies; the operator promotes the standby.
        let killed = primary.kill();
        let (ok, out) = served::ctl(addr_b, &["--json", "promote", &id]);
        let took = killed.elapsed();
        assert!(ok, "ctl promote (round {round}): {}", out.output());
        let promoted = binary::json(&out.stdout());
        let applied = promoted["commit_seq"].as_u64().unwrap();
        // Accepting commits: one written into the promoted store ships.
        binary::write_store(&standby_dir, 1);
        served::wait_health_as(&cb, &id, true, "the first commit shipped", |h| {
            h.role == "primary" && h.shipped_commit_seq > applied
        })
        .await;
        let rto = killed.elapsed();
        sb.signal(libc::SIGTERM);
        sb.wait_exit(DEADLINE);

        tally.round(&format!("service round {round}"), &log, applied, took, rto);
    }
    support::soak::assert_encrypted(&endpoint, &format!("s3://{bucket}/r1"));
    let f = proxy.counts();
    tally.figure(
        "promote-rto-service",
        &format!(
            "lease TTL default (30 s), {}, the primary's S3 through the fault proxy ({} \
             requests: {} SlowDown, {} dropped, {} delayed)",
            support::soak::mode(),
            f.requests,
            f.slow_down,
            f.dropped,
            f.delayed
        ),
    );
}
