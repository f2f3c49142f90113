//! A scripted HTTP server on a loopback address, for provider clients:
//! each request's JSON body is kept, and the answer is whatever bytes the
//! script says, whole, piece by piece (a stream, cut or stalled at will), or
//! without end. The hostile-provider and streaming tests, and the provider
//! examples' local stand-in ([`crate::local_provider`]), run on it.

use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server sends back for one request.
pub enum Reply {
    /// These bytes, then the connection is closed.
    Raw(Vec<u8>),
    /// A head, then `chunk` again and again until the client hangs up (or
    /// 1 GiB has gone out, so that the test ends whatever the client does).
    Endless {
        /// The status line and headers.
        head: String,
        /// What is sent again and again.
        chunk: Vec<u8>,
    },
    /// A head, then each piece written and flushed on its own, `gap` apart
    /// (so the client reads them apart), then the connection closed, or
    /// held open and silent for `hang` first.
    Pieces {
        /// The status line and headers.
        head: String,
        /// The body, piece by piece.
        pieces: Vec<Vec<u8>>,
        /// The pause before each piece.
        gap: Duration,
        /// How long the connection stays open after the last.
        hang: Duration,
    },
}

/// A whole JSON answer: `status`, `headers` and `body`, then the
/// connection closed.
pub fn answer(status: u16, headers: &[(&str, String)], body: &str) -> Reply {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    Reply::Raw(out.into_bytes())
}

/// A server that has received `requests` requests and sent `sent` bytes.
pub struct FakeServer {
    /// `http://ADDR/v1`.
    pub base: String,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// Requests received.
    pub requests: Arc<AtomicUsize>,
    /// Each request's JSON body (Null when it was not JSON), in order.
    pub bodies: Arc<Mutex<Vec<Value>>>,
    /// Bytes of answers sent.
    pub sent: Arc<AtomicUsize>,
}

/// Serves every request on `ip` with `reply(n, body)`, `n` counting from 0.
pub async fn serve(
    ip: &str,
    reply: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static,
) -> FakeServer {
    let reply = Arc::new(reply);
    let listener = TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicUsize::new(0));
    let (r, b, s) = (requests.clone(), bodies.clone(), sent.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let (reply, r, b, s) = (reply.clone(), r.clone(), b.clone(), s.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body: Value =
                    serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or(Value::Null);
                let n = r.fetch_add(1, Ordering::SeqCst);
                let out = reply(n, &body);
                b.lock().unwrap().push(body);
                match out {
                    Reply::Raw(bytes) => {
                        if sock.write_all(&bytes).await.is_ok() {
                            s.fetch_add(bytes.len(), Ordering::SeqCst);
                        }
                        let _ = sock.shutdown().await;
                    }
                    Reply::Pieces {
                        head,
                        pieces,
                        gap,
                        hang,
                    } => {
                        let _ = sock.set_nodelay(true);
                        if sock.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        for piece in pieces {
                            if !gap.is_zero() {
                                tokio::time::sleep(gap).await;
                            }
                            if sock.write_all(&piece).await.is_err() || sock.flush().await.is_err()
                            {
                                return;
                            }
                            s.fetch_add(piece.len(), Ordering::SeqCst);
                        }
                        tokio::time::sleep(hang).await;
                        let _ = sock.shutdown().await;
                    }
                    Reply::Endless { head, chunk } => {
                        if sock.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        while s.load(Ordering::SeqCst) < 1 << 30 {
                            if sock.write_all(&chunk).await.is_err() {
                                return;
                            }
                            s.fetch_add(chunk.len(), Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    FakeServer {
        base: format!("http://{addr}/v1"),
        addr,
        requests,
        bodies,
        sent,
    }
}

impl FakeServer {
    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}
