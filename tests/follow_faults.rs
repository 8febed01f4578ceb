//! Follow mode through a faulty S3: a follower ships through [`FaultProxy`] (503 SlowDown,
//! connections dropped after the request took effect, delays) while a writer commits, and is
//! SIGKILLed five times at seeded moments and started again. After every kill `verify`,
//! straight against moto, passes: every manifest verifies and LATEST names one of them. A last
//! run, after the writer stops, gets SIGTERM: then a restore holds every commit.
//!
//! The proxy prints its seed; `MUSHROOM_FAULT_SEED=<seed>` replays the faults and the kill
//! schedule (which request meets which fault still depends on the order requests arrive in).

mod support;

use std::time::{Duration, Instant};

use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::primitives::ByteStream;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::binary::{self, FollowSettings, Running};
use support::fault_proxy::{FaultPlan, FaultProxy};

const TTL: Duration = Duration::from_millis(2000);
const KILLS: u32 = 5;
/// Commits per second of the writer.
const RATE: u32 = 200;
const PREFIX: &str = "faults";

#[test]
fn a_follower_killed_five_times_behind_a_faulty_s3_loses_no_commit() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let began = Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(support::s3::create_bucket(&endpoint, "follow-faults"));
    let url = format!("s3://{bucket}/{PREFIX}");
    let proxy = FaultProxy::start(&endpoint, FaultPlan::default());
    // The kill schedule comes from the same seed as the faults.
    let mut schedule = ChaCha8Rng::seed_from_u64(proxy.seed() ^ 0x6b69_6c6c);
    let (tmp, store, mut writer) = binary::store_being_written(RATE);
    let settings = FollowSettings {
        lease_ttl: TTL,
        wal_interval: Duration::from_millis(100),
        restore_point_interval: Duration::from_millis(500),
    };

    let mut restore_points = 0;
    for round in 1..=KILLS {
        let mut follower = Running::spawn(
            &format!("follower run {round}"),
            binary::follower(proxy.url(), &store, &url, &settings),
        );
        // A successor of a killed run waits a TTL (and at most a third more) for its lease.
        let (_, held_at) = follower.wait_for_health(
            "acquire the lease",
            TTL * 3 + Duration::from_secs(10),
            |h| h.lease_held,
        );
        let hold = Duration::from_millis(schedule.random_range(1000..=3000));
        follower.watch_until(held_at + hold, |_| {});
        follower.kill();
        let verified = binary::verify_ok(&endpoint, &url, &format!("after kill {round}"));
        assert!(
            verified.manifests.len() >= restore_points,
            "restore points disappeared: {} after kill {round}, {restore_points} before",
            verified.manifests.len()
        );
        restore_points = verified.manifests.len();
        eprintln!(
            "kill {round} after holding the lease {hold:?}: {restore_points} restore points, LATEST {:?}; \
             proxy so far {:?}",
            verified.latest,
            proxy.counts()
        );
    }
    assert!(
        restore_points > 0,
        "{KILLS} runs wrote no restore point at all"
    );

    writer.signal(libc::SIGTERM);
    let status = writer.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "the writer failed: {status}");
    let source = binary::store_digest(&store);
    let commits = source["commit_seq"].as_u64().expect("a commit_seq");

    // The last run: SIGTERM flushes everything durable into a last restore point.
    let mut last = Running::spawn(
        "last follower run",
        binary::follower(proxy.url(), &store, &url, &settings),
    );
    last.wait_for_health(
        "acquire the lease",
        TTL * 3 + Duration::from_secs(10),
        |h| h.lease_held,
    );
    last.signal(libc::SIGTERM);
    let stopping = Instant::now();
    let status = last.wait_exit(Duration::from_secs(40));
    if !status.success() {
        last.fail(&format!("exited with {status} after SIGTERM"));
    }
    let summary = binary::json(&last.stdout());
    eprintln!(
        "the last run exited {:?} after SIGTERM: {summary}",
        stopping.elapsed()
    );
    assert_eq!(summary["shipped_commit_seq"], commits, "{summary}");
    assert_eq!(summary["restore_point_commit_seq"], commits, "{summary}");

    let verified = binary::verify_ok(&endpoint, &url, "at the end");
    assert!(
        verified.latest.is_some(),
        "no LATEST at the end: {verified:?}"
    );
    let restored = binary::restore_digest(&endpoint, &url, &tmp.path().join("restored"));
    assert_eq!(
        restored, source,
        "commits were lost: the restore differs from the store"
    );

    let counts = proxy.counts();
    eprintln!(
        "{commits} commits restored after {KILLS} kills; {} restore points; proxy (seed {}): {counts:?}; \
         {:?} in all",
        verified.manifests.len(),
        proxy.seed(),
        began.elapsed()
    );
    counts.assert_every_kind_injected();
    counts.assert_no_upstream_error();
}

/// The proxy itself: each kind of fault does what it says, seen from a client without retries
/// and from moto behind it.
#[test]
fn the_fault_proxy_injects_what_it_says() {
    let Some(endpoint) = support::s3::endpoint() else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = rt.block_on(support::s3::create_bucket(&endpoint, "fault-proxy"));
    let direct = support::s3::client(&endpoint);
    let only = |plan: FaultPlan| {
        let proxy = FaultProxy::start_seeded(&endpoint, plan, 7);
        let c = support::s3::client(proxy.url());
        let c = aws_sdk_s3::Client::from_conf(
            c.config()
                .to_builder()
                .retry_config(RetryConfig::disabled())
                .build(),
        );
        (proxy, c)
    };
    let put = |c: &aws_sdk_s3::Client, key: &str| {
        rt.block_on(
            c.put_object()
                .bucket(&bucket)
                .key(key)
                .body(ByteStream::from(key.as_bytes().to_vec()))
                .send(),
        )
        .map_err(Box::new)
    };
    let exists = |key: &str| {
        rt.block_on(direct.head_object().bucket(&bucket).key(key).send())
            .is_ok()
    };
    let none = FaultPlan {
        slow_down: 0,
        drop_after: 0,
        delay: 0,
        ..FaultPlan::default()
    };

    let (proxy, c) = only(none.clone());
    put(&c, "plain").expect("a plain put through the proxy");
    let got = rt
        .block_on(c.get_object().bucket(&bucket).key("plain").send())
        .expect("a get through the proxy");
    let data = rt
        .block_on(got.body.collect())
        .expect("the body")
        .into_bytes();
    assert_eq!(&data[..], b"plain");
    assert!(exists("plain"));
    let head = rt
        .block_on(c.head_object().bucket(&bucket).key("plain").send())
        .expect("a head through the proxy");
    assert_eq!(
        head.content_length(),
        Some(5),
        "HEAD keeps its Content-Length"
    );
    assert_eq!(proxy.counts().forwarded, 3, "{:?}", proxy.counts());

    let (proxy, c) = only(FaultPlan {
        slow_down: 100,
        ..none.clone()
    });
    let e = put(&c, "slowed").expect_err("every request is slowed down");
    let e = (*e).into_service_error();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("SlowDown"),
        "{e:?}"
    );
    assert!(!exists("slowed"), "a slowed-down request was forwarded");
    assert_eq!((proxy.counts().slow_down, proxy.counts().forwarded), (1, 0));

    let (proxy, c) = only(FaultPlan {
        drop_after: 100,
        ..none.clone()
    });
    let e = put(&c, "dropped").expect_err("the answer never comes");
    assert!(
        matches!(
            *e,
            aws_sdk_s3::error::SdkError::DispatchFailure(_)
                | aws_sdk_s3::error::SdkError::ResponseError(_)
        ),
        "{e:?}"
    );
    assert!(exists("dropped"), "a dropped request did not take effect");
    assert_eq!((proxy.counts().dropped, proxy.counts().forwarded), (1, 1));

    let (proxy, c) = only(FaultPlan {
        delay: 100,
        delay_for: Duration::from_millis(300)..=Duration::from_millis(300),
        ..none
    });
    let t = Instant::now();
    put(&c, "delayed").expect("a delayed put");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(exists("delayed"));
    assert_eq!((proxy.counts().delayed, proxy.counts().forwarded), (1, 1));
}
