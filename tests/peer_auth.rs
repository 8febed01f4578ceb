//! Peers prove who they are, and the audit names the caller (issue 25 parts 6 and 7;
//! `src/service/peer_auth.rs`, `forward.rs`): real `serve` processes with an admin token on
//! one PostgreSQL registry, real gRPC between them.
//!
//! - Whoever can write the registry can point a store's owner at any address: a fake owner
//!   (a bare HTTP/2 server on loopback that records what it is sent) gets the fleet's peer
//!   token, never the operators' admin token, and an instance without a peer token sends it
//!   nothing at all.
//! - A call made at instance a for a store b owns is audited at b with the client's own
//!   address; `Trigger`, `CanHost` and `Host` are audited; a plain client's forged
//!   original-caller or forwarded-by header is not believed, and the peer token is no admin
//!   token.
//!
//! Needs `MUSHROOM_TEST_POSTGRES_URL` (`scripts/test.sh` starts a server); without it a SKIP
//! line, except under `CI=true`, where it fails.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mushroom_backup::registry::Registry;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use sqlx::{Connection, PgConnection};
use support::binary::write_store;
use support::instances::Instance;
use support::served::{Client, DEADLINE, PEER_TOKEN};
use tonic::Code;

const ADMIN: &str = "peer-auth-test-admin-token";

/// `--admin-token-file` holding [`ADMIN`], written into `dir`.
fn admin_args(dir: &Path) -> Vec<String> {
    let path = dir.join("admin-token");
    std::fs::write(&path, ADMIN).unwrap();
    vec!["--admin-token-file".into(), path.display().to_string()]
}

/// `msg` with `authorization: Bearer <ADMIN>`.
fn admin<T>(msg: T) -> tonic::Request<T> {
    support::with_token(msg, ADMIN)
}

fn trigger_req(id: &str) -> proto::TriggerRequest {
    proto::TriggerRequest {
        store_id: id.to_string(),
        kind: proto::TriggerKind::Ship as i32,
    }
}

/// A fake owner: a bare HTTP/2 server on loopback answering every call `UNIMPLEMENTED`, and
/// the headers of every call it got.
async fn fake_owner() -> (SocketAddr, Arc<Mutex<Vec<http::HeaderMap>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let recorded = recorded.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    recorded.lock().unwrap().push(req.headers().clone());
                    let answer = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .header("grpc-status", "12")
                        .header("grpc-message", "a fake owner")
                        .body(())
                        .unwrap();
                    let _ = respond.send_response(answer, true);
                }
            });
        }
    });
    (addr, seen)
}

/// Points instance `id`'s advertised address at `addr`, as anyone who can write the registry
/// can.
async fn advertise(url: &str, id: &str, addr: SocketAddr) {
    let mut db = PgConnection::connect(url).await.expect("connect");
    let changed = sqlx::query("UPDATE instances SET advertise_address = $1 WHERE instance_id = $2")
        .bind(addr.to_string())
        .bind(id)
        .execute(&mut db)
        .await
        .expect("update the instance's address")
        .rows_affected();
    assert_eq!(changed, 1, "no instance row for {id}");
    db.close().await.ok();
}

/// A shared store root with one store, and a bucket directory.
struct Layout {
    _tmp: tempfile::TempDir,
    base: std::path::PathBuf,
    root: std::path::PathBuf,
}

fn layout(stores: &[&str]) -> Layout {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let root = base.join("stores");
    for s in stores {
        write_store(&root.join(s), 5);
    }
    std::fs::create_dir_all(base.join("bucket")).unwrap();
    Layout {
        _tmp: tmp,
        base,
        root,
    }
}

async fn register(c: &mut Client, l: &Layout, store: &str) -> String {
    let bucket = support::file_url(&l.base.join("bucket").join(store));
    c.register(admin(support::register_req(&l.root.join(store), &bucket)))
        .await
        .expect("Register")
        .into_inner()
        .store_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_forwarded_call_never_carries_the_admin_token() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "peer_auth_fake_owner").await;
    let l = layout(&["s1"]);
    let args = admin_args(&l.base);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Instance::start("a", &db.url, &l.root, &args);
    let lone = Instance::start_with("lone", &db.url, &l.root, &args, false);
    let mut b = Instance::start("b", &db.url, &l.root, &args);
    let id = register(&mut b.client().await, &l, "s1").await;
    b.stop();
    let (fake, seen) = fake_owner().await;
    advertise(&db.url, "b", fake).await;

    // Through a: the fake answers, and got the peer token and who asked, not the admin token.
    let answer = a
        .client()
        .await
        .trigger(admin(trigger_req(&id)))
        .await
        .expect_err("the fake owner answers UNIMPLEMENTED");
    assert_eq!(answer.code(), Code::Unimplemented, "{answer:?}");
    let got = seen.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    for (name, value) in got[0].iter() {
        let value = String::from_utf8_lossy(value.as_bytes());
        assert!(
            !value.contains(ADMIN),
            "the fake owner got the admin token in {name}: {got:?}"
        );
    }
    assert!(got[0].get("authorization").is_none(), "{got:?}");
    assert_eq!(got[0]["x-mushroom-peer-token"], PEER_TOKEN, "{got:?}");
    assert_eq!(got[0]["x-mushroom-forwarded-by"], "a", "{got:?}");
    assert!(got[0].contains_key("x-mushroom-original-caller"), "{got:?}");

    // An instance with an admin token and no peer token forwards nothing, and says why.
    let refused = lone
        .client()
        .await
        .trigger(admin(trigger_req(&id)))
        .await
        .expect_err("a Trigger through an instance without a peer token");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("--peer-token-file"),
        "{refused:?}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the fake owner was called again"
    );
    // A Deregister it cannot forward is answered where it was asked, as for an owner that
    // cannot be reached: refused while the owner was heard from lately, naming it (a silent
    // owner's store would be deregistered here), not refused for the missing peer token.
    let here = lone
        .client()
        .await
        .deregister(admin(proto::DeregisterRequest {
            store_id: id.clone(),
            ..Default::default()
        }))
        .await
        .expect_err("a Deregister of a store whose owner was heard from lately");
    assert!(
        here.message()
            .contains("belongs to instance b, which is alive"),
        "{here:?}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "the fake owner was called");

    drop((a, lone, b));
    db.drop_database().await;
}

/// A client of `addr` over one connection, and that connection's own address.
async fn client_with_address(addr: SocketAddr) -> (Client, SocketAddr) {
    let local = Arc::new(Mutex::new(None));
    let seen = local.clone();
    let connector = tower::service_fn(move |_: http::Uri| {
        let seen = seen.clone();
        async move {
            let s = tokio::net::TcpStream::connect(addr).await?;
            *seen.lock().unwrap() = Some(s.local_addr()?);
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://instance.invalid")
        .connect_with_connector(connector)
        .await
        .expect("connect");
    let local = local.lock().unwrap().expect("connected");
    (BackupControlClient::new(channel), local)
}

/// The newest audit entry of `action` written by `instance`, waited for.
async fn audited(
    reg: &Registry,
    instance: &str,
    action: &str,
) -> mushroom_backup::registry::AuditEntry {
    support::wait_for(
        DEADLINE,
        &format!("an audit entry {action} at {instance}"),
        || async {
            let log = reg.audit_log(1000).await.map_err(|e| e.to_string())?;
            log.iter()
                .find(|e| e.instance_id == instance && e.action == action)
                .cloned()
                .ok_or_else(|| format!("{log:#?}"))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_audits_the_original_caller_and_every_state_change() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "peer_auth_audit").await;
    let l = layout(&["s1"]);
    let args = admin_args(&l.base);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Instance::start("a", &db.url, &l.root, &args);
    let b = Instance::start("b", &db.url, &l.root, &args);
    let mut cb = b.client().await;
    let id = register(&mut cb, &l, "s1").await;
    let reg = Registry::open(&db.url).await.expect("open the registry");

    // A Pause and a Trigger made at a for b's store are audited at b, naming the client.
    let (mut ca, me) = client_with_address(a.addr).await;
    ca.pause(admin(proto::PauseRequest {
        store_id: id.clone(),
        reason: "audit test".into(),
        until_unix_ms: 0,
    }))
    .await
    .expect("Pause through a");
    let paused = audited(&reg, "b", "pause").await;
    let named = paused.peer.clone().unwrap_or_default();
    assert!(
        named.contains(&me.to_string()) && named.contains("via instance a"),
        "the client is {me}: {paused:?}"
    );
    ca.resume(admin(proto::ResumeRequest {
        store_id: id.clone(),
    }))
    .await
    .expect("Resume through a");
    ca.trigger(admin(trigger_req(&id)))
        .await
        .expect("Trigger through a");
    let triggered = audited(&reg, "b", "trigger").await;
    assert_eq!(triggered.store_id.as_deref(), Some(id.as_str()));
    assert!(
        triggered
            .peer
            .as_deref()
            .unwrap_or("")
            .contains(&me.to_string()),
        "{triggered:?}"
    );

    // CanHost and Host, the calls a move makes of its target, are audited too.
    cb.can_host(admin(proto::CanHostRequest {
        store_id: id.clone(),
    }))
    .await
    .expect("CanHost at b");
    audited(&reg, "b", "can_host").await;
    let _ = cb
        .host(admin(proto::HostRequest {
            store_id: id.clone(),
        }))
        .await;
    audited(&reg, "b", "host").await;

    // A plain client naming another caller is not believed; claiming to be a peer without
    // the peer token is refused, and the peer token is no admin token.
    let (mut plain, plain_addr) = client_with_address(b.addr).await;
    let mut forged = admin(proto::PauseRequest {
        store_id: id.clone(),
        reason: "forged caller".into(),
        until_unix_ms: 0,
    });
    forged.metadata_mut().insert(
        "x-mushroom-original-caller",
        "198.51.100.7:4242".parse().unwrap(),
    );
    plain.pause(forged).await.expect("Pause at b");
    // Written before the call answered: the newest pause entry is this one.
    let entry = audited(&reg, "b", "pause").await;
    assert!(entry.detail.contains("forged caller"), "{entry:?}");
    assert_eq!(entry.peer, Some(plain_addr.to_string()), "{entry:?}");
    let mut claims = admin(trigger_req(&id));
    claims
        .metadata_mut()
        .insert("x-mushroom-forwarded-by", "a".parse().unwrap());
    let refused = plain.trigger(claims).await.expect_err("a forged forward");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let mut wrong = tonic::Request::new(trigger_req(&id));
    wrong.metadata_mut().insert(
        "x-mushroom-peer-token",
        "not-the-peer-token".parse().unwrap(),
    );
    wrong
        .metadata_mut()
        .insert("x-mushroom-forwarded-by", "a".parse().unwrap());
    let refused = plain.trigger(wrong).await.expect_err("a wrong peer token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let mut bearer = tonic::Request::new(trigger_req(&id));
    bearer.metadata_mut().insert(
        "authorization",
        format!("Bearer {PEER_TOKEN}").parse().unwrap(),
    );
    let refused = plain
        .trigger(bearer)
        .await
        .expect_err("the peer token as a bearer token");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    reg.close().await;
    drop((a, b));
    db.drop_database().await;
}

/// A peer token file that cannot be used stops `serve` at start, naming the flag and the
/// file: a FIFO (without hanging), a token too short, the admin token itself.
#[test]
fn a_bad_peer_token_file_stops_serve_naming_it() {
    let d = support::served::dirs();
    let fifo = d.base.join("peer-fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let short = d.base.join("peer-short");
    std::fs::write(&short, "short\n").unwrap();
    let same = d.base.join("peer-same");
    std::fs::write(&same, ADMIN).unwrap();
    let admin = admin_args(&d.base);
    for (file, extra, why) in [
        (&fifo, &[][..], "a FIFO"),
        (&short, &[][..], "at least 16"),
        (&same, &admin[..], "holds the admin token"),
    ] {
        let mut cmd = support::served::command(&d);
        cmd.arg("--peer-token-file").arg(file).args(extra);
        let err = support::served::refused(&format!("serve with {}", file.display()), cmd);
        assert!(
            err.contains("--peer-token-file") && err.contains(why),
            "{}: {err}",
            file.display()
        );
    }
}
