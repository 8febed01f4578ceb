//! The webhooks' HTTP client: one POST on its own connection (HTTP/1.1, `Connection: close`),
//! over TCP for `http://` and over TLS (rustls, the system's root certificates) for
//! `https://`, bounded by one timeout from connecting to the response's status line. It reads
//! the status and drops the body. No redirect is followed, no retry is made here: the one retry
//! layer is the webhook's ([`super::webhook`]).
//!
//! A connection per delivery costs a handshake, which a webhook's rate (a few events a second
//! at most, per fleet) can afford, and leaves no pooled connection to go stale.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, pki_types::ServerName};

/// Where a webhook posts: parsed and checked once, at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as posted to (what the operator gave, without a `kinds` parameter).
    pub url: url::Url,
    host: String,
    port: u16,
    tls: bool,
}

impl Target {
    /// An `http://` or `https://` URL with a host; anything else is an error saying what.
    pub fn parse(url: url::Url) -> Result<Target, String> {
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(format!(
                    "{}: the scheme {other:?} is not http or https",
                    redact(&url)
                ));
            }
        };
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(a)) => a.to_string(),
            Some(url::Host::Ipv6(a)) => a.to_string(),
            None => return Err(format!("{}: no host", redact(&url))),
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "{}: credentials in the URL would be logged; put a token in its path or query",
                redact(&url)
            ));
        }
        let port = url
            .port_or_known_default()
            .unwrap_or(if tls { 443 } else { 80 });
        Ok(Target {
            url,
            host,
            port,
            tls,
        })
    }

    /// `host:port`: what logs and metrics name the webhook by (never its path or query, which
    /// may hold a token).
    pub fn name(&self) -> String {
        match self.url.host() {
            Some(url::Host::Ipv6(_)) => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }

    fn path_and_query(&self) -> String {
        match self.url.query() {
            Some(q) => format!("{}?{q}", self.url.path()),
            None => self.url.path().to_string(),
        }
    }
}

/// The URL with its path and query left out.
fn redact(url: &url::Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""))
}

/// Why a POST did not get a status.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: String,
        source: std::io::Error,
    },
    #[error("TLS with {target}: {detail}")]
    Tls { target: String, detail: String },
    #[error("{target}: {detail}")]
    Http { target: String, detail: String },
    #[error("{target} did not answer within {ms} ms")]
    Timeout { target: String, ms: u128 },
}

/// Posts documents; holds the TLS configuration (the root certificates are read once).
#[derive(Clone)]
pub struct Client {
    tls: Option<TlsConnector>,
}

impl Client {
    /// A client; with `tls`, reading the system's root certificates (none readable is an
    /// error: no https webhook could be verified).
    pub fn new(tls: bool) -> Result<Client, String> {
        if !tls {
            return Ok(Client { tls: None });
        }
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(format!(
                "an https webhook needs the system's root certificates, and none could be read{}",
                found
                    .errors
                    .first()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client {
            tls: Some(TlsConnector::from(Arc::new(config))),
        })
    }

    /// POSTs `body` as `content_type`, with `headers` besides, to `target`: the response's
    /// status.
    pub async fn post(
        &self,
        target: &Target,
        content_type: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
        timeout: Duration,
    ) -> Result<u16, PostError> {
        match tokio::time::timeout(timeout, self.post_once(target, content_type, headers, body))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(PostError::Timeout {
                target: target.name(),
                ms: timeout.as_millis(),
            }),
        }
    }

    async fn post_once(
        &self,
        target: &Target,
        content_type: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
    ) -> Result<u16, PostError> {
        let name = target.name();
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|source| PostError::Connect {
                target: name.clone(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let mut request = http::Request::post(target.path_and_query());
        for (name, value) in headers {
            request = request.header(*name, value.as_str());
        }
        let request = request
            .header(http::header::HOST, host_header(target))
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONNECTION, "close")
            .header(
                http::header::USER_AGENT,
                concat!("mushroom-backup/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body))
            .map_err(|e| PostError::Http {
                target: name.clone(),
                detail: e.to_string(),
            })?;
        match (&self.tls, target.tls) {
            (_, false) => exchange(TokioIo::new(tcp), request, &name).await,
            (Some(tls), true) => {
                let server =
                    ServerName::try_from(target.host.clone()).map_err(|e| PostError::Tls {
                        target: name.clone(),
                        detail: e.to_string(),
                    })?;
                let stream = tls.connect(server, tcp).await.map_err(|e| PostError::Tls {
                    target: name.clone(),
                    detail: e.to_string(),
                })?;
                exchange(TokioIo::new(stream), request, &name).await
            }
            (None, true) => Err(PostError::Tls {
                target: name,
                detail: "this client was built without TLS".into(),
            }),
        }
    }
}

fn host_header(t: &Target) -> String {
    let default = if t.tls { 443 } else { 80 };
    let host = match t.url.host() {
        Some(url::Host::Ipv6(_)) => format!("[{}]", t.host),
        _ => t.host.clone(),
    };
    if t.port == default {
        host
    } else {
        format!("{host}:{}", t.port)
    }
}

/// One request over `io`, driving the connection in this task (no spawn) until the status.
async fn exchange<I>(
    io: I,
    request: http::Request<Full<Bytes>>,
    name: &str,
) -> Result<u16, PostError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| PostError::Http {
        target: name.to_string(),
        detail: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http)?;
    let mut conn = std::pin::pin!(conn);
    let mut send = std::pin::pin!(sender.send_request(request));
    let response = tokio::select! {
        r = &mut send => r,
        r = &mut conn => match r {
            // The connection ends once the response is in (`Connection: close`): it is there.
            Ok(()) => send.await,
            Err(e) => return Err(http(e)),
        },
    };
    Ok(response.map_err(http)?.status().as_u16())
}
