//! `serve`'s TLS files are read and checked at start (`service::tls_files`), the peers' CA
//! for forwarded calls included: the real binary refuses to start, naming the flag and the
//! file, when one is missing, a FIFO (without hanging), a directory, too large, not PEM, or
//! not what its flag asks for; and it starts with good files reached through a symbolic link
//! (as Kubernetes mounts a Secret).

mod support;

use std::path::{Path, PathBuf};

use support::served as serve;

struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA and a certificate for 127.0.0.1 and localhost signed by it, as PEM files in `dir`.
fn pki(dir: &Path) -> Pki {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "mushroom-backup peer test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "mushroom-backup instance");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", &ca.pem()),
        cert: write("tls.pem", &cert.pem()),
        key: write("tls.key", &key.serialize_pem()),
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
