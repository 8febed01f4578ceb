//! Who the other instances are to this one: the peer token they share (read once at start
//! with the capped secret-file reader, `Debug` never shows it), the DNS name an instance's
//! certificate carries for its id, and what an advertised address may be. Plain settings:
//! the edge checks callers with them (`edge::peer_auth`), the cluster calls peers with them
//! (`cluster::forward`).

use std::path::Path;

use tokio_rustls::rustls::pki_types::ServerName;

use crate::crypto::secret_file::{self, SecretFileError};

/// The largest peer token file read.
pub const PEER_TOKEN_FILE_MAX: u64 = 4096;

/// The shortest peer token accepted (`openssl rand -hex 32` gives 64).
pub const PEER_TOKEN_MIN: usize = 16;

/// The DNS suffix under which instance ids are named in certificates.
pub const PEER_NAME_SUFFIX: &str = "mushroom-instance.invalid";

/// The DNS name an instance's certificate carries for instance id `id`.
pub fn peer_name(id: &str) -> String {
    format!("{id}.{PEER_NAME_SUFFIX}")
}

/// [`peer_name`] as a name TLS can check; `Err` says why `id` cannot be one.
pub fn peer_server_name(id: &str) -> Result<ServerName<'static>, String> {
    let name = peer_name(id);
    match ServerName::try_from(name.clone()) {
        Ok(n @ ServerName::DnsName(_)) => Ok(n),
        _ => Err(format!(
            "instance id {id:?} cannot be named in a certificate as the DNS name {name:?}: \
             over TLS an instance id must be DNS labels (letters, digits, '-', dots between)"
        )),
    }
}

/// The peer token (`Debug` never shows it).
#[derive(Clone, PartialEq, Eq)]
pub struct PeerToken(String);

impl std::fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerToken(<redacted>)")
    }
}

/// Why the peer token file cannot be used (`serve` stops at start). Each names the setting
/// the path came from (`--peer-token-file` or the config file's `peer_token_file`).
#[derive(Debug, thiserror::Error)]
pub enum PeerTokenError {
    #[error("{key}: {source}")]
    Read {
        key: &'static str,
        source: SecretFileError,
    },
    #[error("{key} {path}: {why}")]
    Bad {
        key: &'static str,
        path: String,
        why: String,
    },
}

impl PeerToken {
    /// Reads and checks `path`, named `key` (the flag or the config key it came from; see the
    /// module docs). Its permission warnings are pushed to `warnings`, named by `key`: `serve`
    /// logs them once logging is set up (logged here, they would be lost).
    pub fn read(
        path: &Path,
        key: &'static str,
        warnings: &mut Vec<String>,
    ) -> Result<PeerToken, PeerTokenError> {
        let file = secret_file::read(path, PEER_TOKEN_FILE_MAX)
            .map_err(|source| PeerTokenError::Read { key, source })?;
        warnings.extend(file.warnings.iter().map(|w| format!("{key}: {w}")));
        let bad = |why: &str| PeerTokenError::Bad {
            key,
            path: path.display().to_string(),
            why: why.to_string(),
        };
        let text = std::str::from_utf8(&file.bytes).map_err(|_| bad("not UTF-8"))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(bad("blank"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad(
                "has a space or a character that is not printable ASCII",
            ));
        }
        if token.len() < PEER_TOKEN_MIN {
            return Err(bad(&format!(
                "{} bytes; a peer token has at least {PEER_TOKEN_MIN} (openssl rand -hex 32)",
                token.len()
            )));
        }
        Ok(PeerToken(token.to_string()))
    }

    /// The token itself, for the header and the comparison only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    #[cfg(test)]
    pub fn for_tests(t: &str) -> PeerToken {
        PeerToken(t.to_string())
    }
}

/// Whether `addr` is `HOST:PORT` an instance can be reached at: a host name or IP literal
/// (IPv6 in brackets) and a port in 1..=65535, nothing else (no scheme, path or spaces).
pub fn check_advertise_address(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > 255 {
        return Err("must be HOST:PORT, at most 255 bytes".into());
    }
    if !addr.bytes().all(|b| b.is_ascii_graphic()) || addr.contains('/') || addr.contains('@') {
        return Err("must be HOST:PORT (no scheme, path, user or space)".into());
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("has no :PORT".into());
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("port {port:?} is not in 1..=65535")),
    }
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.is_empty() || (host.contains(':') && !bracketed) {
        return Err("the host is empty, or an IPv6 literal not in brackets".into());
    }
    if bracketed
        && host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .is_err()
    {
        return Err(format!("{host} is not an IPv6 address"));
    }
    Ok(())
}
