//! Who is calling: an operator's client, or another instance of the fleet forwarding a call
//! (`forward.rs`) or asking a move's target (`CanHost`, `Host`). Issue 25 part 6: peers prove
//! who they are with a credential of their own, never with the operators' admin token.
//!
//! # The peer token
//!
//! `serve --peer-token-file` (`peer_token_file`, `MUSHROOMDB_BACKUP_PEER_TOKEN_FILE`) names a
//! file holding one token shared by every instance on the registry, read once at start with
//! the capped secret-file reader ([`crate::crypto::secret_file`]: a regular file of at most
//! [`PEER_TOKEN_FILE_MAX`] bytes; a FIFO, directory or huge file stops `serve` naming the flag
//! and the file). It must be printable ASCII without spaces, at least [`PEER_TOKEN_MIN`]
//! bytes, and differ from the admin token.
//!
//! - **Sent** as [`PEER_TOKEN`] (its own header, never `authorization`) on calls this
//!   instance forwards, and only when it is configured. The operator's admin token, and the
//!   `authorization` a client sent, are never passed to a peer: an instance that enforces an
//!   admin token and has no peer token refuses to forward (`FAILED_PRECONDITION` naming
//!   `--peer-token-file`). A fleet with neither (loopback, or a mesh that authenticates every
//!   caller) forwards with no credential, as before.
//! - **Accepted** ([`check`]) only on a call that says it was forwarded ([`FORWARDED_BY`],
//!   the forwarding instance's id) and on the calls instances make to each other (`CanHost`,
//!   `Host`); never on `ListStores` (never forwarded), and never as a bearer token: the
//!   public API compares `authorization` with the admin token only.
//! - **What it grants**: what the admin token grants over the stores of the instances that
//!   share it, through forwarded calls (the forwarder checked the caller against its own
//!   admin token; the owner takes its word). Keep it as secret as the admin token; what it
//!   buys is that it is not the operators' token (rotated on its own, never typed by people,
//!   never sent to an address unless configured), and that over TLS it is sent only to a
//!   peer whose certificate names the instance the registry names.
//!
//! # Instance ids in certificates (TLS)
//!
//! Over TLS an instance's certificate names its instance id as the DNS name
//! [`peer_name`]`(id)`, `<id>.mushroom-instance.invalid` (a name that resolves nowhere and
//! collides with no host name). The forwarder checks the owner's certificate against that
//! name of the instance the registry names as the owner (not the advertised address: a
//! registry row pointing a store at another instance's address is refused by the handshake);
//! the receiver checks the forwarder's client certificate against the name of the instance
//! [`FORWARDED_BY`] claims, and refuses a peer call without one. A certificate shared by
//! several instances (or naming `*.mushroom-instance.invalid`) stands for each of them: give
//! each instance its own for the binding to mean something. An instance id that is not a
//! DNS label sequence cannot be named so: over TLS with a peer token `serve` refuses it at
//! start.
//!
//! # The original caller
//!
//! A forwarded call carries [`ORIGINAL_CALLER`], the address of the client the forwarder
//! served. The owner believes it only from an authenticated peer (a valid peer token, and
//! over TLS the certificate check): it audits `<client address> via instance <forwarder>`.
//! From anyone else the header is ignored, and the audit names the socket that called.
//! Without a peer token (an open fleet) a forwarded call is audited with the forwarder's
//! address.
//!
//! Nothing here holds state: a crash leaves nothing behind.

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tonic::metadata::MetadataMap;

use super::auth::{self, AuthError};
pub use crate::service::cluster::forward::{FORWARDED_BY, ORIGINAL_CALLER, PEER_TOKEN};
pub use crate::service::config::peers::{PeerToken, peer_name, peer_server_name};

/// The longest original-caller value believed (an address, with room to spare).
const MAX_ORIGINAL_CALLER: usize = 256;

/// Who made a call, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An operator's client (or a peer in a fleet without a peer token): its socket address.
    Client { addr: Option<String> },
    /// Another instance, authenticated: its id, its socket address, and the client it
    /// forwards for.
    Peer {
        instance: String,
        addr: Option<String>,
        origin: Option<String>,
    },
}

impl Caller {
    /// Who asked, as the audit log records it.
    pub fn audited(&self) -> Option<String> {
        match self {
            Caller::Client { addr } => addr.clone(),
            Caller::Peer {
                instance,
                origin: Some(o),
                ..
            } => Some(format!("{o} via instance {instance}")),
            Caller::Peer {
                instance,
                addr,
                origin: None,
            } => Some(format!(
                "instance {instance} at {}",
                addr.as_deref().unwrap_or("an unknown address")
            )),
        }
    }

    /// The client address a call forwarded from here names as its original caller.
    pub fn origin(&self) -> Option<&str> {
        match self {
            Caller::Client { addr } => addr.as_deref(),
            Caller::Peer { origin, addr, .. } => origin.as_deref().or(addr.as_deref()),
        }
    }
}

/// What [`check`] checks a call against.
pub struct Expect<'a> {
    pub admin_token: Option<&'a str>,
    pub peer_token: Option<&'a PeerToken>,
    /// This instance serves TLS: a peer must present a certificate naming itself.
    pub tls: bool,
    /// The call may come from a peer (everything but `ListStores`).
    pub peers_ok: bool,
}

/// Checks a call's caller (see the module docs): a peer by its token (and certificate over
/// TLS), anyone else by the admin token.
pub fn check(
    want: &Expect<'_>,
    meta: &MetadataMap,
    certs: Option<&[CertificateDer<'static>]>,
    addr: Option<String>,
) -> Result<Caller, AuthError> {
    let refuse = |why: String| Err(AuthError(why));
    if let Some(got) = meta.get(PEER_TOKEN) {
        if !want.peers_ok {
            return refuse(
                "this call is never forwarded: it takes the admin token, not a peer token".into(),
            );
        }
        let Some(token) = want.peer_token else {
            return refuse(
                "a peer call, but this instance has no --peer-token-file: it accepts no \
                 calls from other instances"
                    .into(),
            );
        };
        let got = got.to_str().unwrap_or("");
        if !auth::constant_time_eq(got.as_bytes(), token.expose().as_bytes()) {
            return refuse("the peer token is wrong".into());
        }
        let Some(instance) = meta
            .get(FORWARDED_BY)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
        else {
            return refuse(format!(
                "a peer call must name its instance ({FORWARDED_BY})"
            ));
        };
        if want.tls {
            certificate_names(instance, certs)?;
        }
        let origin = meta
            .get(ORIGINAL_CALLER)
            .and_then(|v| v.to_str().ok())
            .filter(|o| !o.is_empty() && o.len() <= MAX_ORIGINAL_CALLER)
            .map(str::to_string);
        return Ok(Caller::Peer {
            instance: instance.to_string(),
            addr,
            origin,
        });
    }
    if want.peer_token.is_some() && meta.get(FORWARDED_BY).is_some() {
        return refuse(format!(
            "{FORWARDED_BY} without the peer token: only an instance sharing this fleet's \
             --peer-token-file forwards calls"
        ));
    }
    auth::require_admin(want.admin_token, meta)?;
    Ok(Caller::Client { addr })
}

/// The caller's certificate (the first of its chain, which TLS already verified against
/// this instance's client CAs) names instance `instance`.
fn certificate_names(
    instance: &str,
    certs: Option<&[CertificateDer<'static>]>,
) -> Result<(), AuthError> {
    let name = peer_name(instance);
    let Some(cert) = certs.and_then(|c| c.first()) else {
        return Err(AuthError(format!(
            "a peer call over TLS must present the certificate of instance {instance} \
             (naming {name}); this instance asks for one with --tls-client-ca or --peer-ca"
        )));
    };
    let server_name = peer_server_name(instance).map_err(AuthError)?;
    let parsed = rustls::server::ParsedCertificate::try_from(cert)
        .map_err(|e| AuthError(format!("the peer's certificate cannot be read: {e}")))?;
    rustls::client::verify_server_name(&parsed, &server_name).map_err(|_| {
        AuthError(format!(
            "the peer's certificate does not name instance {instance} ({name}): a peer \
             calls only as the instance its certificate names"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_peer_token_is_no_admin_token_and_a_claim_needs_the_token() {
        let token = PeerToken::for_tests("peer-token-0123456789");
        let want = Expect {
            admin_token: Some("admin-token"),
            peer_token: Some(&token),
            tls: false,
            peers_ok: true,
        };
        let addr = || Some("127.0.0.1:1".to_string());
        // As a bearer token, the peer token is a wrong admin token.
        let m = meta(&[("authorization", "Bearer peer-token-0123456789")]);
        assert!(check(&want, &m, None, addr()).is_err());
        // A claim to be forwarded without the token is refused, with or without the admin token.
        let m = meta(&[(FORWARDED_BY, "a"), ("authorization", "Bearer admin-token")]);
        assert!(check(&want, &m, None, addr()).is_err());
        let m = meta(&[(PEER_TOKEN, "wrong"), (FORWARDED_BY, "a")]);
        assert!(check(&want, &m, None, addr()).is_err());
        // A peer without its instance id is refused; with it, it is believed.
        let m = meta(&[(PEER_TOKEN, token.expose())]);
        assert!(check(&want, &m, None, addr()).is_err());
        let m = meta(&[
            (PEER_TOKEN, token.expose()),
            (FORWARDED_BY, "a"),
            (ORIGINAL_CALLER, "10.1.2.3:4"),
        ]);
        let caller = check(&want, &m, None, addr()).unwrap();
        assert_eq!(
            caller.audited().as_deref(),
            Some("10.1.2.3:4 via instance a")
        );
        // Not for calls that are never forwarded.
        let never = Expect {
            peers_ok: false,
            ..want
        };
        assert!(check(&never, &m, None, addr()).is_err());
        // A client's own original-caller header is not believed.
        let m = meta(&[
            ("authorization", "Bearer admin-token"),
            (ORIGINAL_CALLER, "10.9.9.9:9"),
        ]);
        let caller = check(&want, &m, None, addr()).unwrap();
        assert_eq!(caller.audited().as_deref(), Some("127.0.0.1:1"));
    }

    #[test]
    fn instance_ids_that_are_no_dns_names_are_named_as_such() {
        assert!(peer_server_name("backup-0").is_ok());
        assert!(peer_server_name("a.b").is_ok());
        let e = peer_server_name("has space").unwrap_err();
        assert!(e.contains("has space"), "{e}");
    }
}
