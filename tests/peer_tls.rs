//! `serve`'s TLS files are read and checked at start (`service::tls_files`), the peers' CA
//! for forwarded calls included: the real binary refuses to start, naming the flag and the
//! file, when one is missing, a FIFO (without hanging), a directory, too large, not PEM, or
//! not what its flag asks for; and it starts with good files reached through a symbolic link
//! (as Kubernetes mounts a Secret).
//!
//! Between instances over TLS each certificate is bound to the instance id the registry
//! names (issue 25 part 6, `service::peer_auth`): a forwarder refuses an owner whose
//! certificate names another instance, and an owner refuses a forwarder whose certificate
//! does not name the instance it claims to be (real `serve` processes on the project's
//! PostgreSQL; without `MUSHROOM_TEST_POSTGRES_URL` a SKIP line, except under `CI=true`).

mod support;

use std::path::{Path, PathBuf};

use mushroom_backup::service::proto::{self, backup_control_client::BackupControlClient};
use support::instances::Instance;
use support::pki::{Ca, Usage};
use support::served as serve;
use tonic::Code;

struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// The peer tests' CA, its certificate `dir/ca.pem`.
fn peer_ca(dir: &Path) -> Ca {
    Ca::new(dir, "ca.pem", "mushroom-backup peer test CA")
}

/// An instance's certificate for `names`, server and client: `<stem>.pem`, and its key
/// `<stem>.key`.
fn instance_cert(ca: &Ca, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    ca.leaf(
        (&format!("{stem}.pem"), &format!("{stem}.key")),
        names,
        "mushroom-backup instance",
        &[Usage::ServerAuth, Usage::ClientAuth],
    )
}

/// A CA and a certificate for 127.0.0.1 and localhost signed by it, as PEM files in `dir`.
fn pki(dir: &Path) -> Pki {
    let ca = peer_ca(dir);
    let (cert, key) = instance_cert(&ca, "tls", &["127.0.0.1", "localhost"]);
    Pki {
        ca: ca.pem,
        cert,
        key,
    }
}

/// `serve` with TLS from `cert` and `key`, and `--peer-ca peer_ca`.
fn serve_tls(d: &serve::Dirs, cert: &Path, key: &Path, peer_ca: &Path) -> std::process::Command {
    let mut cmd = serve::command(d);
    cmd.arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .arg("--peer-ca")
        .arg(peer_ca);
    cmd
}

#[test]
fn a_bad_tls_file_stops_serve_at_start_naming_its_flag_and_file() {
    let d = serve::dirs();
    let pki = pki(&d.base);
    let bad = d.base.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let missing = bad.join("missing.pem");
    let fifo = bad.join("fifo.pem");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let not_pem = bad.join("not.pem");
    std::fs::write(&not_pem, "this is no certificate\n").unwrap();
    let huge = bad.join("huge.pem");
    std::fs::write(&huge, vec![b'A'; (1 << 20) + 1]).unwrap();
    let broken = bad.join("broken.pem");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();

    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("a missing --peer-ca", missing.clone(), "no such file"),
        ("a FIFO as --peer-ca", fifo.clone(), "a FIFO"),
        ("a directory as --peer-ca", bad.clone(), "a directory"),
        (
            "a --peer-ca that is not PEM",
            not_pem.clone(),
            "no PEM CERTIFICATE",
        ),
        ("a --peer-ca past the cap", huge.clone(), "at most 1048576"),
        (
            "a --peer-ca that is no certificate",
            broken.clone(),
            "cannot be trusted",
        ),
    ];
    for (what, peer_ca, why) in &cases {
        let err = serve::refused(what, serve_tls(&d, &pki.cert, &pki.key, peer_ca));
        let named = format!("--peer-ca {}", peer_ca.display());
        let named_by_reader = format!("--peer-ca: {}", peer_ca.display());
        assert!(
            (err.contains(&named) || err.contains(&named_by_reader)) && err.contains(why),
            "{what}: {err}"
        );
    }
    // The server's own files too, each named by its flag.
    let err = serve::refused(
        "a certificate as --tls-key",
        serve_tls(&d, &pki.cert, &pki.cert, &pki.ca),
    );
    assert!(
        err.contains(&format!("--tls-key {}", pki.cert.display()))
            && err.contains("no PEM private key"),
        "{err}"
    );
    let err = serve::refused(
        "a FIFO as --tls-cert",
        serve_tls(&d, &fifo, &pki.key, &pki.ca),
    );
    assert!(
        err.contains(&format!("--tls-cert: {}", fifo.display())) && err.contains("a FIFO"),
        "{err}"
    );
    // A refused start left nothing behind: good files start, through a symbolic link.
    let linked = d.base.join("ca-link.pem");
    std::os::unix::fs::symlink(&pki.ca, &linked).unwrap();
    let (mut child, _addr) = serve::start(
        "serve with good TLS files",
        serve_tls(&d, &pki.cert, &pki.key, &linked),
    );
    serve::terminate(&mut child);
}

/// `ctl` reads its TLS files with the same reader: a FIFO as `--ca` is refused at once (no
/// hang), naming the flag and the file, and so is a file past the cap, before any connection.
#[test]
fn ctl_reads_its_tls_files_as_serve_does() {
    let d = serve::dirs();
    let fifo = d.base.join("ctl-fifo.pem");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let huge = d.base.join("ctl-huge.pem");
    std::fs::write(&huge, vec![b'A'; (1 << 20) + 1]).unwrap();
    for (path, why) in [
        (&fifo, "a FIFO"),
        (&huge, "a TLS file holds at most 1048576"),
    ] {
        let out = std::process::Command::new(support::binary::BIN)
            .args(["ctl", "--server", "https://127.0.0.1:9", "--ca"])
            .arg(path)
            .arg("list-stores")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("ctl runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {err}", path.display());
        assert!(
            err.contains("--ca") && err.contains(&path.display().to_string()) && err.contains(why),
            "{}: {err}",
            path.display()
        );
    }
}

const ADMIN: &str = "peer-tls-test-admin-token";

/// The DNS name that binds a certificate to instance `id` (the README's promise).
fn peer_name(id: &str) -> String {
    format!("{id}.mushroom-instance.invalid")
}

/// `msg` with `authorization: Bearer <ADMIN>`.
fn admin<T>(msg: T) -> tonic::Request<T> {
    support::with_token(msg, ADMIN)
}

/// A client of `i` over TLS (by its certificate's name localhost), trusting `ca`.
async fn tls_client(i: &Instance, ca: &Path) -> serve::Client {
    let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
        tonic::transport::Certificate::from_pem(std::fs::read(ca).unwrap()),
    );
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://localhost:{}", i.addr.port()))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap_or_else(|e| {
                i.child
                    .fail(&format!("cannot be connected to over TLS: {e}"))
            });
    BackupControlClient::new(channel)
}

fn trigger(id: &str) -> tonic::Request<proto::TriggerRequest> {
    admin(proto::TriggerRequest {
        store_id: id.to_string(),
        kind: proto::TriggerKind::Ship as i32,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_whose_certificate_names_another_instance_is_refused_both_ways() {
    let Some(pg) = support::postgres::server() else {
        return;
    };
    let db = support::postgres::Database::create(&pg, "peer_tls_binding").await;
    let d = serve::dirs();
    let ca = peer_ca(&d.base);
    let admin_file = d.base.join("admin-token");
    std::fs::write(&admin_file, ADMIN).unwrap();
    let shared = d.base.join("shared");
    for s in ["s1", "s2"] {
        support::binary::write_store(&shared.join(s), 5);
    }
    // Every certificate names 127.0.0.1 (the advertised address) and localhost; r's names
    // instance x, not r.
    let start = |id: &str, named: &str| {
        let (cert, key) = instance_cert(&ca, id, &["127.0.0.1", "localhost", &peer_name(named)]);
        let args = [
            "--tls-cert".to_string(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--peer-ca".into(),
            ca.pem.display().to_string(),
            "--admin-token-file".into(),
            admin_file.display().to_string(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Instance::start(id, &db.url, &shared, &args)
    };
    let a = start("a", "a");
    let b = start("b", "b");
    let r = start("r", "x");
    let (mut on_a, mut cb, mut cr) = (
        tls_client(&a, &ca.pem).await,
        tls_client(&b, &ca.pem).await,
        tls_client(&r, &ca.pem).await,
    );
    let register = |store: &str| {
        admin(support::register_req(
            &shared.join(store),
            &support::file_url(&d.base.join("bucket").join(store)),
        ))
    };
    let s1 = cb.register(register("s1")).await.expect("Register s1 on b");
    let s1 = s1.into_inner().store_id;
    let s2 = cr.register(register("s2")).await.expect("Register s2 on r");
    let s2 = s2.into_inner().store_id;

    // Certificates that name their instances: a forwards to b.
    on_a.trigger(trigger(&s1)).await.unwrap_or_else(|e| {
        a.child
            .fail(&format!("Trigger of b's store through a: {e}"))
    });
    // The forwarder's check: r's certificate does not name r, so a does not call it.
    let refused = on_a
        .trigger(trigger(&s2))
        .await
        .expect_err("a Trigger forwarded to an owner whose certificate names another instance");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("instance r") && refused.message().contains("certificate"),
        "{refused:?}"
    );
    // The owner's check: r calls b as r with a certificate naming x, and b refuses it.
    let refused = cr
        .trigger(trigger(&s1))
        .await
        .expect_err("a Trigger forwarded by a peer whose certificate names another instance");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("does not name instance r"),
        "{refused:?}"
    );

    drop((a, b, r));
    db.drop_database().await;
}
