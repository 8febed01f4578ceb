//! `serve`'s TLS files, read and checked once at start: the server's certificate and key
//! (`--tls-cert`, `--tls-key`), the CA its clients' certificates must chain to
//! (`--tls-client-ca`), and the CA the other instances' certificates chain to (`--peer-ca`,
//! default `--tls-client-ca`) for the calls this instance forwards to them (`forward.rs`).
//!
//! # Invariants
//!
//! - Every file is read once, before the instance claims its id or listens for calls, with
//!   the project's reader of small secret files ([`crate::crypto::secret_file`]): opened
//!   non-blocking (a FIFO cannot hang the start), checked on the open descriptor to be a
//!   regular file (a directory, FIFO, socket or device is refused), at most [`PEM_FILE_MAX`]
//!   bytes (on the descriptor and again while reading), not empty. A symbolic link is
//!   followed, since Kubernetes mounts a Secret's files as links (`..data/tls.crt`); a link
//!   loop is refused.
//! - What was read must be what the flag asks for: a certificate file at least one PEM
//!   `CERTIFICATE`, each a certificate rustls can parse (a CA's are added to a root store, as
//!   a TLS handshake would use them); a key file a PEM private key (PKCS#8, PKCS#1 or SEC1).
//!   The configurations are then built as tonic builds them, so what tonic would refuse at
//!   the first forwarded call is refused here.
//! - A file that fails any of this stops `serve` ([`TlsFileError`], naming the flag and the
//!   file), before it claimed anything: nothing to clean up.
//! - Nothing is read again while serving: forwarding never touches the disk, and a
//!   certificate rotated on disk takes a restart (as the server's own always did).
//!
//! # Which client certificates the server asks for
//!
//! A peer's calls are checked against its certificate (`peer_auth.rs`), so the server asks
//! for one: with `--tls-client-ca` every client must present one chaining to it or, when
//! `--peer-ca` is set too, to the peers' CA; with `--peer-ca` alone a client may present one
//! chaining to the peers' CA (operators and probes without a certificate still connect, and
//! still need the admin token). Without either, no certificate is asked for, and peer calls
//! over TLS are refused.
//!
//! The key file's permissions earn the reader's warning (group or others may read it),
//! logged once at start; certificates and CAs are public.

use std::path::{Path, PathBuf};

use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use crate::crypto::secret_file::{self, SecretFileError};
use crate::service::config::TlsFiles;

/// The largest TLS file read: a CA bundle of a few hundred certificates is about 200 KiB; a
/// certificate chain or a key a few KiB.
pub const PEM_FILE_MAX: u64 = 1 << 20;

/// Why a TLS file cannot be used (`serve` stops at start).
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    #[error("{flag}: {source}")]
    Read {
        flag: &'static str,
        source: SecretFileError,
    },
    #[error("{flag} {}: {len} bytes or more; a TLS file holds at most {max}", path.display())]
    TooLarge {
        flag: &'static str,
        path: PathBuf,
        len: u64,
        max: u64,
    },
    #[error("{flag} {}: {what}", path.display())]
    Pem {
        flag: &'static str,
        path: PathBuf,
        what: String,
    },
    #[error("{flags}: {detail}")]
    Config { flags: String, detail: String },
}

/// What `serve` serves and forwards with.
pub struct ServeTls {
    pub server: ServerTlsConfig,
    /// How this instance reaches the others; `None`: no CA to trust them by (neither
    /// `--peer-ca` nor `--tls-client-ca`), so a call to forward answers `FAILED_PRECONDITION`
    /// saying so (`ForwardError::NoPeerCa`).
    pub peers: Option<ClientTlsConfig>,
}

/// Reads and checks every TLS file (see the module docs); `peer_ca`: `--peer-ca` when set.
pub fn load(tls: &TlsFiles, peer_ca: Option<&Path>) -> Result<ServeTls, TlsFileError> {
    let cert = read("--tls-cert", &tls.cert)?;
    certificates("--tls-cert", &tls.cert, &cert, false)?;
    let key = read("--tls-key", &tls.key)?;
    if PrivateKeyDer::from_pem_slice(&key).is_err() {
        return Err(TlsFileError::Pem {
            flag: "--tls-key",
            path: tls.key.clone(),
            what: "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)".into(),
        });
    }
    let client_ca = match &tls.client_ca {
        Some(p) => {
            let pem = read("--tls-client-ca", p)?;
            certificates("--tls-client-ca", p, &pem, true)?;
            Some(pem)
        }
        None => None,
    };
    let own_peer_ca = match peer_ca {
        Some(p) => {
            let pem = read("--peer-ca", p)?;
            certificates("--peer-ca", p, &pem, true)?;
            Some(pem)
        }
        None => None,
    };
    let identity = Identity::from_pem(&cert, &key);
    let mut server = ServerTlsConfig::new().identity(identity.clone());
    // Which client certificates are asked for (see the module docs).
    match (&client_ca, &own_peer_ca) {
        (Some(clients), Some(peers)) => {
            let mut both = clients.clone();
            both.push(b'\n');
            both.extend_from_slice(peers);
            server = server.client_ca_root(Certificate::from_pem(both));
        }
        (Some(clients), None) => server = server.client_ca_root(Certificate::from_pem(clients)),
        (None, Some(peers)) => {
            server = server
                .client_ca_root(Certificate::from_pem(peers))
                .client_auth_optional(true);
        }
        (None, None) => {}
    }
    let peer_ca = own_peer_ca.or_else(|| client_ca.clone());
    let peers = match peer_ca {
        Some(ca) => {
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(identity);
            // What the first forwarded call would do, now: tonic builds its connector here.
            Endpoint::from_static("https://peer.check.invalid")
                .tls_config(config.clone())
                .map_err(|e| TlsFileError::Config {
                    flags: "--tls-cert, --tls-key, --peer-ca (or --tls-client-ca)".into(),
                    detail: crate::units::error_chain(&e),
                })?;
            Some(config)
        }
        None => None,
    };
    Ok(ServeTls { server, peers })
}

/// `path`'s bytes, read as the module docs say; the key's permission warnings logged.
pub fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let file = secret_file::read(path, PEM_FILE_MAX).map_err(|e| match e {
        SecretFileError::TooLarge { len, max, .. } => TlsFileError::TooLarge {
            flag,
            path: path.to_path_buf(),
            len,
            max,
        },
        source => TlsFileError::Read { flag, source },
    })?;
    if flag.ends_with("-key") {
        for w in &file.warnings {
            tracing::warn!("{flag}: {w}");
        }
    }
    Ok(file.bytes.to_vec())
}

/// Checks that `pem` holds one certificate or more, each parsable; for a CA (`trust`), each
/// a trust anchor rustls accepts.
fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
    trust: bool,
) -> Result<(), TlsFileError> {
    let bad = |what: String| TlsFileError::Pem {
        flag,
        path: path.to_path_buf(),
        what,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM CERTIFICATE".into()));
    }
    if trust {
        let mut roots = RootCertStore::empty();
        for (i, c) in certs.into_iter().enumerate() {
            roots
                .add(c)
                .map_err(|e| bad(format!("certificate {} cannot be trusted: {e}", i + 1)))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &[u8], key: &[u8]) -> TlsFiles {
        std::fs::write(dir.join("c.pem"), cert).unwrap();
        std::fs::write(dir.join("k.pem"), key).unwrap();
        TlsFiles {
            cert: dir.join("c.pem"),
            key: dir.join("k.pem"),
            client_ca: None,
        }
    }

    #[test]
    fn files_that_are_not_what_their_flag_asks_for_are_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = b"hello\n";
        let e = load(&files(dir.path(), not_pem, not_pem), None)
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("--tls-cert "), "{e}");
        assert!(e.to_string().contains("no PEM CERTIFICATE"), "{e}");
        let huge = vec![b'a'; usize::try_from(PEM_FILE_MAX).unwrap() + 1];
        let e = load(&files(dir.path(), &huge, not_pem), None)
            .err()
            .unwrap();
        assert!(
            matches!(
                e,
                TlsFileError::TooLarge {
                    flag: "--tls-cert",
                    ..
                }
            ),
            "{e}"
        );
        let e = load(
            &TlsFiles {
                cert: dir.path().to_path_buf(),
                key: dir.path().join("k.pem"),
                client_ca: None,
            },
            None,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("a directory"), "{e}");
    }
}
