//! The service's edge against hostile and mistaken input, through the real binary over real
//! TCP: start-up refuses a blank admin token (naming where it came from), an admin token file
//! that is a FIFO, a directory or too large (at once, naming it), and an unprotected
//! non-loopback listener; limits on what one unauthenticated client may hold (first report
//! due, per-call deadlines, HTTP/2 stream limit, a cap on `WatchHealth`); mutual TLS with the
//! project's own clients (`ctl`, `node`); server reflection `v1alpha` beside `v1`.
//!
//! Every wait has a deadline and says what it waited for; every child is killed on drop.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::binary::{self, Running};
use support::served::{self as serve, DEADLINE, Dirs};
use tonic::Code;
use tonic::transport::Channel;

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

async fn client(addr: SocketAddr) -> BackupControlClient<Channel> {
    BackupControlClient::connect(url(addr))
        .await
        .expect("connect to serve")
}

/// `serve` with `args` added.
fn serve_with(d: &Dirs, args: &[&str]) -> Command {
    let mut cmd = serve::command(d);
    cmd.args(args);
    cmd
}

// --- item 2: a blank admin token, and what `insecure` waives -------------------------------

#[test]
fn a_blank_admin_token_from_any_source_refuses_to_start_naming_it() {
    let d = serve::dirs();
    let blank = d.base.join("blank-token");
    std::fs::write(&blank, " \n\t\n").unwrap();
    let blank_text = blank.display().to_string();

    // The config file's admin_token_file.
    let config = d.base.join("config.toml");
    std::fs::write(&config, format!("admin_token_file = {:?}\n", blank_text)).unwrap();
    let mut cmd = serve_with(&d, &[]);
    cmd.arg("--config").arg(&config);
    let err = serve::refused("serve (blank admin_token_file)", cmd);
    assert!(
        err.contains("admin_token_file") && err.contains(&blank_text) && err.contains("blank"),
        "{err}"
    );

    // The flag (and its variable).
    let mut cmd = serve_with(&d, &[]);
    cmd.env("MUSHROOMDB_BACKUP_ADMIN_TOKEN_FILE", &blank);
    let err = serve::refused("serve (blank --admin-token-file)", cmd);
    assert!(err.contains(&blank_text) && err.contains("blank"), "{err}");

    // The variable holding the token itself: set, but whitespace.
    let mut cmd = serve_with(&d, &[]);
    cmd.env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", "   ");
    let err = serve::refused("serve (blank MUSHROOMDB_BACKUP_ADMIN_TOKEN)", cmd);
    assert!(
        err.contains("MUSHROOMDB_BACKUP_ADMIN_TOKEN") && err.contains("blank"),
        "{err}"
    );

    // A blank file is refused even when the variable would win over it.
    let mut cmd = serve_with(&d, &[]);
    cmd.arg("--config")
        .arg(&config)
        .env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", "a-real-token");
    let err = serve::refused("serve (token set, blank file too)", cmd);
    assert!(err.contains(&blank_text), "{err}");
}

/// The admin token file goes through the capped secret-file reader: a FIFO (which a plain
/// read would wait on forever), a directory, a file past the cap stop the start at once,
/// naming the setting and the file.
#[test]
fn a_fifo_directory_or_huge_admin_token_file_refuses_to_start_naming_it() {
    let d = serve::dirs();
    let fifo = d.base.join("token-fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let huge = d.base.join("token-huge");
    std::fs::write(&huge, vec![b'A'; 4097]).unwrap();
    let dir = d.base.join("token-dir");
    std::fs::create_dir(&dir).unwrap();
    for (path, says) in [
        (&fifo, "is a FIFO, not a regular file"),
        (&dir, "is a directory, not a regular file"),
        (&huge, "an admin token file holds at most 4096"),
    ] {
        let mut cmd = serve_with(&d, &[]);
        cmd.arg("--admin-token-file").arg(path);
        let err = serve::refused("serve (a bad --admin-token-file)", cmd);
        let named = format!("--admin-token-file: {}", path.display());
        let named_with_len = format!("--admin-token-file {}", path.display());
        assert!(
            (err.contains(&named) || err.contains(&named_with_len)) && err.contains(says),
            "{}: {err}",
            path.display()
        );
    }
    // The config file's setting, named as such.
    let config = d.base.join("fifo-config.toml");
    std::fs::write(
        &config,
        format!("admin_token_file = {:?}\n", fifo.display().to_string()),
    )
    .unwrap();
    let mut cmd = serve_with(&d, &[]);
    cmd.arg("--config").arg(&config);
    let err = serve::refused("serve (a FIFO as admin_token_file)", cmd);
    assert!(
        err.contains(&format!("admin_token_file: {}", fifo.display())) && err.contains("a FIFO"),
        "{err}"
    );
    // A good token in a file others may read: the service starts, and says so in its log.
    let readable = d.base.join("token-0644");
    std::fs::write(&readable, "a-token-for-tests\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = serve_with(&d, &[]);
    cmd.arg("--admin-token-file").arg(&readable);
    let (mut child, _addr) = serve::start("serve (a 0644 admin token file)", cmd);
    serve::wait_logged(&mut child, &["--admin-token-file", "chmod 600"]);
    serve::terminate(&mut child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_waives_tls_only_and_open_operator_calls_are_explicit_and_loud() {
    let d = serve::dirs();
    // Non-loopback, plaintext, no token: `insecure` is not enough.
    let err = serve::refused(
        "serve (0.0.0.0, insecure, no token)",
        serve_with(&d, &["--listen", "0.0.0.0:0", "--insecure"]),
    );
    assert!(
        err.contains("admin token") && err.contains("--no-operator-auth"),
        "{err}"
    );
    // Without `insecure` either, TLS is named first.
    let err = serve::refused(
        "serve (0.0.0.0, no TLS)",
        serve_with(&d, &["--listen", "0.0.0.0:0", "--no-operator-auth"]),
    );
    assert!(err.contains("TLS"), "{err}");
    // A token and "no operator auth" contradict each other.
    let mut cmd = serve_with(&d, &["--no-operator-auth"]);
    cmd.env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", "t0ken");
    let err = serve::refused("serve (token and no_operator_auth)", cmd);
    assert!(err.contains("no_operator_auth"), "{err}");

    // With the explicit setting it starts, says so at ERROR, and operator calls are open.
    let (mut open, addr) = serve::start(
        "serve (0.0.0.0, insecure, no operator auth)",
        serve_with(
            &d,
            &["--listen", "0.0.0.0:0", "--insecure", "--no-operator-auth"],
        ),
    );
    serve::wait_logged(&mut open, &["ERROR", "OPERATOR AUTH IS OFF"]);
    let local = SocketAddr::from(([127, 0, 0, 1], addr.port()));
    client(local)
        .await
        .list_stores(proto::ListStoresRequest {})
        .await
        .expect("ListStores without a token");
    drop(open);

    // Loopback without a token starts, with a warning (its own data dir: the killed process
    // above still holds its instance claim there until the claim goes stale).
    let fresh = serve::dirs();
    let (mut local_only, _) = serve::start("serve (loopback, no token)", serve_with(&fresh, &[]));
    serve::wait_logged(&mut local_only, &["WARN", "no admin token"]);
}

// --- item 6: what an unauthenticated client may hold ---------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_position_streams_without_a_first_report_end() {
    let d = serve::dirs();
    let (_serve, addr) = serve::start(
        "serve",
        serve_with(&d, &["--first-report-timeout-ms", "300"]),
    );
    let c = client(addr).await;
    // 100 silent streams on one connection (more than a connection's calls in flight): each
    // ends by itself, none is held for ever.
    let mut senders = Vec::new();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let (tx, rx) = tokio::sync::mpsc::channel::<proto::PositionReport>(1);
        senders.push(tx);
        let mut c = c.clone();
        calls.spawn(async move {
            c.report_position(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(|_| ())
        });
    }
    let ended = tokio::time::timeout(DEADLINE, calls.join_all())
        .await
        .expect("every silent ReportPosition stream ends");
    for r in ended {
        let status = r.expect_err("a stream without a report is refused");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(
            status.message().contains("first_report_timeout_ms"),
            "{status:?}"
        );
    }
    drop(senders);
}

/// A raw HTTP/2 connection to the server, for what a gRPC client would not send.
async fn h2_connect(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

fn grpc_request(addr: SocketAddr, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_has_a_stream_limit_and_a_silent_call_a_deadline() {
    let d = serve::dirs();
    let (_serve, addr) = serve::start(
        "serve",
        serve_with(
            &d,
            &["--max-concurrent-streams", "7", "--call-timeout-ms", "300"],
        ),
    );
    let mut send = h2_connect(addr)
        .await
        .ready()
        .await
        .expect("ready for a stream");
    // A unary call whose request never ends (headers, no message): the server answers it
    // DEADLINE_EXCEEDED instead of waiting for ever.
    let (response, _body_never_sent) = send
        .send_request(
            grpc_request(addr, "/mushroom.backup.v1.BackupControl/ListStores"),
            false,
        )
        .expect("send the headers");
    let response = tokio::time::timeout(DEADLINE, response)
        .await
        .expect("the server answers a call whose request never ends")
        .expect("a response");
    let headers = response.headers();
    assert_eq!(
        headers.get("grpc-status").and_then(|v| v.to_str().ok()),
        Some("4"),
        "DEADLINE_EXCEEDED expected: {headers:?}"
    );
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(message.contains("call_timeout_ms"), "{headers:?}");
    // The server's SETTINGS (read before that response) carry the stream limit.
    assert_eq!(send.current_max_send_streams(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_health_is_capped_and_a_closed_watch_frees_its_slot() {
    let d = serve::dirs();
    let (_serve, addr) = serve::start("serve", serve_with(&d, &["--max-health-watchers", "3"]));
    let mut c = client(addr).await;
    let mut watches = Vec::new();
    for _ in 0..3 {
        let mut s = c
            .watch_health(proto::HealthRequest::default())
            .await
            .expect("WatchHealth under the cap")
            .into_inner();
        s.message()
            .await
            .expect("a first answer")
            .expect("not ended");
        watches.push(s);
    }
    let refused = c
        .watch_health(proto::HealthRequest::default())
        .await
        .expect_err("a fourth watcher is over the cap");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains('3') && refused.message().contains("max_health_watchers"),
        "{refused:?}"
    );
    drop(watches.pop());
    let again = tokio::time::timeout(DEADLINE, async {
        loop {
            match c.watch_health(proto::HealthRequest::default()).await {
                Ok(s) => break s,
                Err(s) if s.code() == Code::ResourceExhausted => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(s) => panic!("WatchHealth: {s:?}"),
            }
        }
    })
    .await
    .expect("a closed watch frees its slot");
    drop(again);
}

// --- item 13: reflection v1alpha ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1alpha_lists_and_describes_the_services() {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let d = serve::dirs();
    let (_serve, addr) = serve::start("serve", serve_with(&d, &[]));
    let channel = tonic::transport::Endpoint::from_shared(url(addr))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut c = ServerReflectionClient::new(channel);
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "mushroom.backup.v1.BackupControl".into(),
        )),
    ];
    let mut answers = c
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("v1alpha ServerReflectionInfo")
        .into_inner();
    let listed = answers.message().await.expect("an answer").expect("one");
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("not a service list: {listed:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "mushroom.backup.v1.BackupControl",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(names.contains(&want), "v1alpha lists {names:?}, not {want}");
    }
    let described = answers.message().await.expect("an answer").expect("one");
    let Some(MessageResponse::FileDescriptorResponse(files)) = described.message_response else {
        panic!("not a file descriptor: {described:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
}

// --- item 10b: mutual TLS with the project's own clients ------------------------------------

struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
fn pki(dir: &Path) -> Pki {
    use support::pki::{Ca, Usage};
    let ca = Ca::new(dir, "ca.pem", "mushroom-backup test CA");
    let (server_cert, server_key) = ca.leaf(
        ("server.pem", "server.key"),
        &["127.0.0.1", "localhost"],
        "mushroom-backup test server",
        &[Usage::ServerAuth],
    );
    let (client_cert, client_key) = ca.leaf(
        ("client.pem", "client.key"),
        &[],
        "mushroom-backup test client",
        &[Usage::ClientAuth],
    );
    Pki {
        ca: ca.pem,
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

const ADMIN: &str = "edge-admin-token";

/// `ctl --server https://… --ca CA [--client-cert C --client-key K] ARGS` with the admin token.
fn ctl(server: &str, pki: &Pki, with_cert: bool, args: &[&str]) -> Command {
    let mut cmd = binary::command("http://unused.invalid");
    cmd.args(["ctl", "--server", server, "--timeout-ms", "60000", "--ca"])
        .arg(&pki.ca)
        .env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", ADMIN)
        .env_remove("MUSHROOMDB_BACKUP_CLIENT_CERT")
        .env_remove("MUSHROOMDB_BACKUP_CLIENT_KEY");
    if with_cert {
        cmd.arg("--client-cert")
            .arg(&pki.client_cert)
            .arg("--client-key")
            .arg(&pki.client_key);
    }
    cmd.args(args);
    cmd
}

fn fails(name: &str, cmd: Command) -> String {
    let mut child = Running::spawn(name, cmd);
    let status = child.wait_exit(DEADLINE);
    if status.success() {
        child.fail("succeeded without a client certificate");
    }
    serve::stderr(&child)
}

#[test]
fn mutual_tls_works_with_ctl_and_node_and_refuses_them_without_a_certificate() {
    let d = serve::dirs();
    let pki = pki(&d.base);
    let mut cmd = serve_with(&d, &[]);
    cmd.arg("--tls-cert")
        .arg(&pki.server_cert)
        .arg("--tls-key")
        .arg(&pki.server_key)
        .arg("--tls-client-ca")
        .arg(&pki.ca)
        .env("MUSHROOMDB_BACKUP_ADMIN_TOKEN", ADMIN);
    let (_serve, addr) = serve::start("serve (mTLS)", cmd);
    let server = format!("https://{addr}");

    let err = fails(
        "ctl without a client certificate",
        ctl(&server, &pki, false, &["list-stores"]),
    );
    assert!(err.contains("error:"), "{err}");
    let out = binary::run_ok(
        "ctl with a client certificate",
        ctl(&server, &pki, true, &["list-stores"]),
        DEADLINE,
    );
    assert!(out.contains("no stores"), "{out}");

    // The node: register a store, then report with and without the certificate.
    let store = d.root.join("node1");
    let dest = format!("file://{}", d.base.join("bucket").display());
    let reg = binary::json(&binary::run_ok(
        "ctl register",
        ctl(
            &server,
            &pki,
            true,
            &[
                "--json",
                "register",
                "--dir",
                store.to_str().unwrap(),
                "--destination",
                &dest,
            ],
        ),
        DEADLINE,
    ));
    let node = |with_cert: bool| {
        let mut cmd = binary::command("http://unused.invalid");
        cmd.arg("node")
            .arg("--store")
            .arg(&store)
            .args(["--server", &server, "--store-id"])
            .arg(reg["store_id"].as_str().unwrap())
            .args(["--commits", "5", "--flush-timeout-ms", "3000", "--ca"])
            .arg(&pki.ca)
            .env(
                "MUSHROOMDB_BACKUP_NODE_TOKEN",
                reg["node_token"].as_str().unwrap(),
            )
            .env_remove("MUSHROOMDB_BACKUP_CLIENT_CERT")
            .env_remove("MUSHROOMDB_BACKUP_CLIENT_KEY");
        if with_cert {
            cmd.env("MUSHROOMDB_BACKUP_CLIENT_CERT", &pki.client_cert)
                .env("MUSHROOMDB_BACKUP_CLIENT_KEY", &pki.client_key);
        }
        cmd
    };
    let err = fails("node without a client certificate", node(false));
    assert!(err.contains("error:"), "{err}");
    let out = binary::json(&binary::run_ok(
        "node with a client certificate",
        node(true),
        DEADLINE,
    ));
    assert_eq!(out["commit_seq"], 10, "{out}");
}
