//! One control plane over many instances (issue 15): three real `serve` processes on one
//! PostgreSQL registry, where a call for a store arriving at any instance reaches its owner
//! over real gRPC (forward.rs), a node reporting to any instance has its store shipped by the
//! owner, and `Register` lands on the instance it names.
//!
//! Needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server); without it a SKIP
//! line, except under `CI=true`, where it fails.

mod support;

use std::time::Duration;

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary::write_store;
use support::instances::Fleet;
use support::served::{self, node_writes};
use tonic::Code;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(90);

async fn owner_of(c: &mut BackupControlClient<Channel>, id: &str) -> Option<String> {
    c.list_stores(proto::ListStoresRequest {})
        .await
        .ok()?
        .into_inner()
        .stores
        .into_iter()
        .find(|s| s.store_id == id)
        .map(|s| s.instance_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_instance_answers_for_every_store_and_register_lands_where_it_is_asked() {
    let Some(fleet) = Fleet::create("control_plane_test").await else {
        return;
    };
    let (shared_root, bucket) = (&fleet.shared_root, &fleet.bucket);
    let store = shared_root.join("s1");
    write_store(&store, 40);

    let a = fleet.start("a", &[]);
    let b = fleet.start("b", &[]);
    let c = fleet.start("c", &[]);
    let mut cc = c.client().await;
    let mut ca = a.client().await;

    // Register through c, naming a: the store runs on a.
    let mut req = support::register_req(&store, &support::file_url(bucket));
    req.instance_id = "a".into();
    let registered = cc
        .register(req)
        .await
        .unwrap_or_else(|e| c.child.fail(&format!("Register through c for a: {e}")))
        .into_inner();
    let id = registered.store_id.clone();
    assert!(!registered.node_token.is_empty());
    assert_eq!(owner_of(&mut cc, &id).await.as_deref(), Some("a"));
    let on_a = ca
        .health(proto::HealthRequest {
            store_id: id.clone(),
            fresh: false,
        })
        .await
        .unwrap_or_else(|e| a.child.fail(&format!("Health on a: {e}")))
        .into_inner();
    assert_eq!(on_a.stores[0].instance_id, "a", "{on_a:?}");

    // Trigger through c acts on a's store: a restore point, listed through c.
    cc.trigger(proto::TriggerRequest {
        store_id: id.clone(),
        kind: proto::TriggerKind::RestorePoint as i32,
    })
    .await
    .unwrap_or_else(|e| c.child.fail(&format!("Trigger through c: {e}")));
    let points = support::wait_for(DEADLINE, "a restore point listed through c", || {
        let mut cc = cc.clone();
        let id = id.clone();
        async move {
            let page = cc
                .list_restore_points(proto::ListRestorePointsRequest {
                    store_id: id,
                    page_size: 10,
                    page_token: String::new(),
                })
                .await
                .map_err(|e| format!("ListRestorePoints through c: {e}"))?
                .into_inner();
            if page
                .restore_points
                .first()
                .is_some_and(|p| p.commit_seq >= 40 && p.is_latest)
            {
                Ok(page.restore_points)
            } else {
                Err(format!("{page:?}"))
            }
        }
    })
    .await;
    // c relayed a's own answer, unchanged: the point listed through c is one a lists itself.
    let direct = ca
        .list_restore_points(proto::ListRestorePointsRequest {
            store_id: id.clone(),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .unwrap_or_else(|e| a.child.fail(&format!("ListRestorePoints on a: {e}")))
        .into_inner()
        .restore_points;
    assert!(points[0].is_latest, "{points:?}");
    assert!(
        direct.contains(&points[0]),
        "{points:?} through c, {direct:?} on a"
    );

    // Fresh health through b is a's own answer: a holds the lease, its restore point.
    let cb = b.client().await;
    let fresh = served::wait_health_as(&cb, &id, true, "a's lease, fresh through b", |s| {
        s.lease_held && s.restore_point_commit_seq >= 40
    })
    .await;
    assert!(!fresh.lease_holder.is_empty(), "{fresh:?}");

    // A node reporting to c: c relays its stream to a, which ships every commit.
    node_writes(c.addr, &store, &id, &registered.node_token, 60);
    served::wait_health_as(&cb, &id, true, "a to ship the node's 100 commits", |s| {
        s.shipped_commit_seq == 100 && s.instance_id == "a"
    })
    .await;
    // A wrong node token through c: a refuses it, and c answers a's refusal.
    let mut wrong = tonic::Request::new(tokio_stream::iter(vec![proto::PositionReport {
        store_id: id.clone(),
        ..Default::default()
    }]));
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer not-the-token".parse().unwrap());
    let refused = match cc.report_position(wrong).await {
        Err(s) => s,
        Ok(r) => {
            let mut commands = r.into_inner();
            match commands.message().await {
                Err(s) => s,
                Ok(m) => panic!("a wrong token through c was answered {m:?}"),
            }
        }
    };
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // Bad input through a non-owner gets the owner's answer, unchanged.
    let bad = cc
        .trigger(proto::TriggerRequest {
            store_id: id.clone(),
            kind: 99,
        })
        .await
        .expect_err("an unknown trigger kind");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    // An unknown store is NOT_FOUND where it is asked, with no hop.
    let unknown = cc
        .trigger(proto::TriggerRequest {
            store_id: "00000000-0000-4000-8000-000000000000".into(),
            kind: proto::TriggerKind::Ship as i32,
        })
        .await
        .expect_err("an unknown store");
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    // Register naming an instance that never started: INVALID_ARGUMENT naming it.
    let mut req = support::register_req(&shared_root.join("s2"), &support::file_url(bucket));
    req.instance_id = "nowhere".into();
    let nowhere = cc
        .register(req)
        .await
        .expect_err("Register for no instance");
    assert_eq!(nowhere.code(), Code::InvalidArgument, "{nowhere:?}");
    assert!(nowhere.message().contains("nowhere"), "{nowhere:?}");
    let mut req = support::register_req(&shared_root.join("s2"), &support::file_url(bucket));
    req.instance_id = "i".repeat(300);
    let long = cc
        .register(req)
        .await
        .expect_err("Register for a 300-byte instance id");
    assert_eq!(long.code(), Code::InvalidArgument, "{long:?}");
    assert!(long.message().contains("instance_id"), "{long:?}");

    // A call forwarded already (by a peer: it carries the fleet's peer token) is not
    // forwarded again (at most one hop).
    let mut hopped = tonic::Request::new(proto::TriggerRequest {
        store_id: id.clone(),
        kind: proto::TriggerKind::Ship as i32,
    });
    hopped
        .metadata_mut()
        .insert("x-mushroom-forwarded-by", "c".parse().unwrap());
    hopped
        .metadata_mut()
        .insert("x-mushroom-peer-token", served::PEER_TOKEN.parse().unwrap());
    let once = b
        .client()
        .await
        .trigger(hopped)
        .await
        .expect_err("a second hop");
    assert_eq!(once.code(), Code::FailedPrecondition, "{once:?}");
    assert!(once.message().contains("belongs to instance a"), "{once:?}");

    // Deregister through b reaches a: the store is gone from every instance.
    b.client()
        .await
        .deregister(proto::DeregisterRequest {
            store_id: id.clone(),
            flush: true,
        })
        .await
        .unwrap_or_else(|e| b.child.fail(&format!("Deregister through b: {e}")));
    assert_eq!(owner_of(&mut cc, &id).await, None);
    let gone = ca
        .health(proto::HealthRequest {
            store_id: id.clone(),
            fresh: false,
        })
        .await
        .expect_err("Health of a deregistered store");
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");

    drop((a, b, c));
    fleet.db.drop_database().await;
}

#[test]
fn a_bad_advertise_address_failover_group_or_silence_limit_is_refused_at_start() {
    for (flag, value, says) in [
        ("--advertise-address", "http://h:1", "--advertise-address"),
        ("--advertise-address", "h:0", "port"),
        ("--advertise-address", "h", "no :PORT"),
        ("--failover-group", "a b", "--failover-group"),
        ("--failover-group", "", "--failover-group"),
    ] {
        let dirs = served::dirs();
        let mut cmd = served::command(&dirs);
        cmd.args([flag, value]);
        let stderr = served::refused(&format!("serve {flag} {value:?}"), cmd);
        assert!(stderr.contains(says), "{flag} {value:?}: {stderr}");
    }
    // A failover group claims the stores of a member silent for --owner-silent-after-ms: a
    // limit under 3 heartbeats would have a live member's stores claimed after a late report.
    let dirs = served::dirs();
    let mut cmd = served::command(&dirs);
    cmd.args(["--failover-group", "g", "--owner-silent-after-ms", "800"])
        .args(["--health-report-interval-ms", "300"]);
    let stderr = served::refused("serve with a silence limit of 2.7 heartbeats", cmd);
    for says in [
        "--owner-silent-after-ms 800",
        "--health-report-interval-ms 300",
        "at least 900",
    ] {
        assert!(stderr.contains(says), "{stderr}");
    }
}
