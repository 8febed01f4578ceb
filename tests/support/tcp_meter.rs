//! [`TcpMeter`]: a TCP relay in front of an endpoint that counts the bytes passing each way as
//! they pass (not per request, not after a body is read whole, as the fault proxy does), so a
//! test or a bench can sample the rate at the server side of a process's connections over time.
//! The bytes of both directions are counted as the relay writes them on.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes relayed so far: to the endpoint (`up`: request bodies) and from it (`down`).
#[derive(Debug, Default)]
pub struct Relayed {
    pub up: AtomicU64,
    pub down: AtomicU64,
}

/// A running relay; stops with the runtime that started it (its tasks are that runtime's).
pub struct TcpMeter {
    url: String,
    counts: Arc<Relayed>,
}

impl TcpMeter {
    /// A relay on 127.0.0.1 to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> TcpMeter {
        let target: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("an http://host:port upstream");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let counts = Arc::new(Relayed::default());
        let c = counts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = relay(cr, sw, c.clone(), true);
                    let down = relay(sr, cw, c, false);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        TcpMeter { url, counts }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Bytes sent down (from the endpoint to the client) so far.
    pub fn down(&self) -> u64 {
        self.counts.down.load(Ordering::Relaxed)
    }

    /// Bytes sent up (from the client to the endpoint) so far.
    pub fn up(&self) -> u64 {
        self.counts.up.load(Ordering::Relaxed)
    }

    /// The counters, to sample from another thread.
    pub fn counts(&self) -> Arc<Relayed> {
        self.counts.clone()
    }
}

async fn relay(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counts: Arc<Relayed>,
    up: bool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        let counter = if up { &counts.up } else { &counts.down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}
