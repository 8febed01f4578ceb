//! The client side of TLS, as `ctl` and `node` take it: the server's CA and, for a server that
//! requires one, a client certificate. One set of flags, read the same way for both: with the
//! project's reader of small secret files (`crypto::secret_file`: a FIFO cannot hang the
//! command, a directory or device is refused, at most `service::tls_files::PEM_FILE_MAX`
//! bytes, a Kubernetes Secret's symlink followed), as `serve` reads its own TLS files.

use std::path::{Path, PathBuf};

use clap::Args;

use mushroom_backup::service::tls_files;

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
        let ca = self.ca.as_deref().map(|ca| read("--ca", ca)).transpose()?;
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                Some((read("--client-cert", cert)?, read("--client-key", key)?))
            }
            _ => None,
        };
        Ok(ClientTlsPem { ca, identity })
    }
}

/// One PEM file a flag names, read by `serve`'s reader (its errors name the flag and file).
fn read(flag: &'static str, path: &Path) -> anyhow::Result<Vec<u8>> {
    Ok(tls_files::read(flag, path)?)
}
