//! The client side of TLS, as `ctl` and `node` take it: the server's CA and, for a server that
//! requires one, a client certificate. One set of flags, read the same way for both.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct ClientTlsArgs {
    /// PEM CA of the server's certificate, for https://.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// PEM client certificate, for a server that requires one (mutual TLS); with --client-key.
    #[arg(long, env = "MUSHROOMDB_BACKUP_CLIENT_CERT", requires = "client_key")]
    client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "MUSHROOMDB_BACKUP_CLIENT_KEY", requires = "client_cert")]
    client_key: Option<PathBuf>,
}

/// The PEM files the flags name, read.
pub struct ClientTlsPem {
    pub ca: Option<Vec<u8>>,
    /// `(certificate, key)`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl ClientTlsArgs {
    pub fn wants_identity(&self) -> bool {
        self.client_cert.is_some()
    }

    /// Reads the files; an error names the flag and the file.
    pub fn read(&self) -> anyhow::Result<ClientTlsPem> {
        let ca = self
            .ca
            .as_ref()
            .map(|ca| std::fs::read(ca).with_context(|| format!("--ca {}", ca.display())))
            .transpose()?;
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((
                std::fs::read(cert).with_context(|| format!("--client-cert {}", cert.display()))?,
                std::fs::read(key).with_context(|| format!("--client-key {}", key.display()))?,
            )),
            _ => None,
        };
        Ok(ClientTlsPem { ca, identity })
    }
}
