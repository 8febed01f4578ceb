//! A webhook receiver for tests: a real HTTP server on std's `TcpListener` (a thread), keeping
//! every POST it answered 200.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::served::DEADLINE;

/// One POST a receiver took.
#[derive(Debug, Clone)]
pub struct Posted {
    pub path: String,
    pub content_type: String,
    pub body: serde_json::Value,
    /// Every header, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body's bytes, as sent.
    pub raw: Vec<u8>,
}

/// A webhook receiver: answers every POST 200 and keeps it (or, while [`Receiver::refuse`]
/// says so, answers 503 and keeps nothing).
#[derive(Clone, Default)]
pub struct Receiver {
    posted: Arc<Mutex<Vec<Posted>>>,
    refusing: Arc<AtomicBool>,
}

impl Receiver {
    /// Serves on `listener` (a thread, for the rest of the test).
    pub fn serve(listener: TcpListener) -> Receiver {
        let r = Receiver::default();
        let (posted, refusing) = (r.posted.clone(), r.refusing.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if let Some(p) = read_post(conn, &refusing) {
                    posted.lock().unwrap().push(p);
                }
            }
        });
        r
    }

    /// From now on, answer every POST 503 (`true`) or 200 again.
    pub fn refuse(&self, refuse: bool) {
        self.refusing.store(refuse, Ordering::SeqCst);
    }

    pub fn posted(&self) -> Vec<Posted> {
        self.posted.lock().unwrap().clone()
    }

    /// Waits until a POST satisfies `ok`.
    pub async fn wait_for(&self, what: &str, ok: impl Fn(&[Posted]) -> bool) -> Vec<Posted> {
        super::wait_for(DEADLINE, what, || {
            let got = self.posted();
            let ok = ok(&got);
            async move {
                if ok {
                    Ok(got)
                } else {
                    Err(format!("{} posts: {:?}", got.len(), kinds_of(&got)))
                }
            }
        })
        .await
    }
}

pub fn kinds_of(p: &[Posted]) -> Vec<String> {
    p.iter()
        .map(|p| p.body["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Reads one HTTP/1.1 request and answers 200 (503 while `refusing`); the request if it was a
/// POST with a JSON body that was answered 200.
fn read_post(conn: std::net::TcpStream, refusing: &AtomicBool) -> Option<Posted> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let (mut len, mut content_type) = (0usize, String::new());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':')?;
        let name = name.to_ascii_lowercase();
        match name.as_str() {
            "content-length" => len = value.trim().parse().ok()?,
            "content-type" => content_type = value.trim().to_string(),
            _ => {}
        }
        headers.push((name, value.trim().to_string()));
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let mut conn = conn;
    if refusing.load(Ordering::SeqCst) {
        let _ = conn.write_all(
            b"HTTP/1.1 503 Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        );
        return None;
    }
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    if method != "POST" {
        return None;
    }
    Some(Posted {
        path,
        content_type,
        body: serde_json::from_slice(&body).ok()?,
        headers,
        raw: body,
    })
}
