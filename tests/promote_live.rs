//! Security review 4, finding 8, as a soak (`#[ignore]`: about 25 s a round; run with
//! `CI=true bash scripts/test.sh --test promote_live --run-ignored only`).
//!
//! A promotion away from a `serve` that has held its sync store for several lease TTLs and
//! keeps running and acknowledging. Such a `serve` wrote its store lease object only when it
//! acquired it (it lives by its instance lease), so the object is older than a TTL; before the
//! fix the taker read the holder's deadline from that age, found it past, and waited for
//! nothing (`fenced_in=0ns proof=Deadline`) while the holder could still acknowledge. Now the
//! deadline is read from the instance lease, and counts as the proof only once it has truly
//! passed (`lease::acquire::take_over`); a holder still renewing is fenced by its
//! acknowledgement window.
//!
//! Every round, on moto, with a lease TTL of [`TTL_MS`]: a primary `serve` (its S3 through the
//! fault proxy, no random faults) backs a store up in `durability = sync` while the reference
//! node commits into it (`--acked-log`) for [`HELD`] (four TTLs); a second `serve` hosts a
//! standby of the prefix (`ctl standby`); then `ctl promote` on the second while the primary
//! and its node run on. Afterwards: no commit above the promoted one was acknowledged, ever;
//! and the promotion's log line names its proof:
//! - unpartitioned: the holder is live, so the proof is the window (`AckWindow`), never
//!   `Deadline`;
//! - partitioned (`promotion_away_from_a_partitioned_serve…`): the proxy holds every request
//!   of the primary for [`HOLD`] first: its instance renewals stop landing. Odd rounds promote
//!   at once (the holder's deadline is still ahead: `AckWindow`), even rounds after
//!   [`STALE_AFTER`] of partition (its deadline has truly passed by the bucket's clock:
//!   `Deadline` with `fenced_in` zero is allowed, and nothing else is `Deadline`).
//!
//! `SOAK_ROUNDS` sets the rounds (default 10), `SOAK_KEY=1` encrypts the store; the figures are
//! `FIGURE promote-live` lines (rounds, proofs, acknowledged, above the promoted commit).

mod support;

use std::time::Duration;

use support::binary;
use support::fault_proxy::{FaultPlan, FaultProxy};
use support::primary::{self, TwoServes};
use support::served::{self, DEADLINE};

/// The lease TTL of both `serve`s.
const TTL_MS: u64 = 2000;
/// How long the primary holds its store, acknowledging, before the promotion: four TTLs.
const HELD: Duration = Duration::from_millis(4 * TTL_MS);
/// How long the partition holds each of the primary's requests.
const HOLD: Duration = Duration::from_secs(8);
/// Partitioned rounds that wait for the holder's deadline: longer than the TTL plus the
/// bucket clock's resolution (1 s) and a renewal step.
const STALE_AFTER: Duration = Duration::from_millis(TTL_MS + 1000 + 1000);
/// Commits a second the node is asked for.
const RATE: &str = "100";

/// The proof and `fenced_in` of the promotion's "took the bucket lease over" log line.
fn proof_of(log: &str) -> (String, String) {
    let line = log
        .lines()
        .find(|l| l.contains("took the bucket lease over"))
        .unwrap_or_else(|| panic!("no takeover logged:\n{log}"));
    let field = |name: &str| {
        let (_, rest) = line
            .split_once(&format!("{name}="))
            .unwrap_or_else(|| panic!("no {name} in {line}"));
        rest.split_whitespace().next().unwrap_or("").to_string()
    };
    (field("proof"), field("fenced_in"))
}

/// What the rounds saw.
#[derive(Default)]
struct Tally {
    rounds: u32,
    window: u32,
    deadline: u32,
    acked: usize,
    above: usize,
}

async fn soak(partitioned: bool) {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rounds = support::soak::rounds(10);
    let name = if partitioned {
        "promote-live-partitioned"
    } else {
        "promote-live"
    };
    let bucket = support::s3::create_bucket(&endpoint, name).await;
    let proxy = FaultProxy::start(&endpoint, FaultPlan::none());
    let serve = |d: &served::Dirs, s3: &str, instance: &str| {
        let mut cmd = primary::serve(d, s3, instance);
        cmd.args(["--lease-ttl-ms", &TTL_MS.to_string()]);
        cmd
    };
    let mut tally = Tally::default();
    for round in 1..=rounds {
        let url = format!("s3://{bucket}/r{round}");
        let round_dirs = TwoServes::new();
        let serve_a = serve(&round_dirs.a, proxy.url(), &format!("primary-{round}"));
        let mut primary = round_dirs.primary(round, serve_a, &url, RATE, 1).await;
        let TwoServes {
            b,
            standby_dir,
            log,
            ..
        } = round_dirs;
        let (mut sb, addr_b) = served::start(
            &format!("standby serve (round {round})"),
            serve(&b, &endpoint, &format!("standby-{round}")),
        );
        let cb = served::client(addr_b).await;
        let id = served::ctl_standby(addr_b, &standby_dir, &url);
        // The primary holds its store, acknowledging, for several TTLs: its store lease
        // object is that old by now.
        primary.pump_for(HELD);
        served::wait_health(&cb, &id, "the standby applying", |h| {
            h.role == "standby" && h.standby_commit_seq > 0
        })
        .await;
        let acked_before = served::acked_log(&log).len();
        assert!(acked_before > 0, "round {round}: nothing acknowledged");

        let stale = partitioned && round % 2 == 0;
        if partitioned {
            proxy.set_hold(Some(HOLD));
            let wait = if stale {
                STALE_AFTER
            } else {
                Duration::from_millis(200)
            };
            primary.pump_for(wait);
        }
        let (ok, out) = served::ctl(addr_b, &["--json", "promote", &id]);
        assert!(ok, "ctl promote (round {round}): {}", out.output());
        let applied = binary::json(&out.stdout())["commit_seq"].as_u64().unwrap();
        served::wait_logged(&mut sb, &["took the bucket lease over"]);
        let (proof, fenced_in) = proof_of(&served::stderr(&sb));
        // The old primary runs on: until it notices (and, partitioned, until every held
        // request of its has landed).
        let after = if partitioned {
            HOLD + Duration::from_secs(1)
        } else {
            Duration::from_secs(3)
        };
        primary.pump_for(after);
        proxy.set_hold(None);
        primary.kill();
        sb.signal(libc::SIGTERM);
        sb.wait_exit(DEADLINE);

        let seqs = served::acked_log(&log);
        let above: Vec<u64> = seqs.iter().copied().filter(|s| *s > applied).collect();
        eprintln!(
            "round {round}{}: {} acknowledged (highest {:?}), promoted at {applied}; proof \
             {proof} fenced_in {fenced_in}; acknowledged above the promoted commit: {above:?}",
            if stale {
                " (partitioned past the deadline)"
            } else if partitioned {
                " (partitioned)"
            } else {
                ""
            },
            seqs.len(),
            seqs.last()
        );
        assert!(
            above.is_empty(),
            "round {round}: commits {above:?} were acknowledged above the promoted commit \
             {applied} (proof {proof}, fenced_in {fenced_in})"
        );
        match proof.as_str() {
            "AckWindow" => tally.window += 1,
            "Deadline" => {
                assert!(
                    stale && fenced_in == "0ns",
                    "round {round}: the proof was Deadline (fenced_in {fenced_in}) with a live \
                     holder whose deadline had not passed"
                );
                tally.deadline += 1;
            }
            other => panic!("round {round}: an unknown proof {other}"),
        }
        tally.rounds += 1;
        tally.acked += seqs.len();
        tally.above += above.len();
    }
    support::soak::assert_encrypted(&endpoint, &format!("s3://{bucket}/r1"));
    eprintln!(
        "FIGURE {name}: {} rounds, lease TTL {TTL_MS} ms, held {HELD:?} before each promotion, \
         {}; proofs: {} AckWindow, {} Deadline (each past the holder's deadline); {} commits \
         acknowledged, {} above the promoted commit",
        tally.rounds,
        support::soak::mode(),
        tally.window,
        tally.deadline,
        tally.acked,
        tally.above
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: about 20 s a round"]
async fn promotion_away_from_a_long_running_serve_waits_out_its_window() {
    soak(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: about 30 s a round"]
async fn promotion_away_from_a_partitioned_serve_waits_out_its_window_or_deadline() {
    soak(true).await;
}
