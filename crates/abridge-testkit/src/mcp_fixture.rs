//! A small MCP server of the project's own, for the MCP tests: the binary
//! `abridge-mcp-fixture` serves it over stdio (`--stdio`) or streamable
//! HTTP (`--http ADDR`, JSON answers, printing `listening on http://ADDR/mcp`
//! first). Written from the protocol's JSON-RPC messages, apart from the
//! SDK the engine's client uses, so that the two check each other.
//!
//! Its tools, each call of which is appended to the log file (`--log PATH`,
//! one JSON object a line: `tool`, `arguments`, `key` (the `_meta`
//! idempotency key), `pid`, `applied`):
//! - `echo {text}`: the text (`readOnlyHint`);
//! - `add_note {note}`: appends the note once per idempotency key
//!   (`idempotentHint`): a call sent again with its key is not applied again;
//! - `send_email {to, body}`: applied on every call (`destructiveHint`);
//! - `weather {city}`: structured content only;
//! - `fail`: an `isError` result;
//! - `slow {ms}`: answers after `ms` milliseconds;
//! - `die_once`: the first call (per `--state DIR`) logs itself and ends
//!   the process before answering; later calls answer `survived`
//!   (`idempotentHint`).

use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The server's files.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// One line per call.
    pub log: PathBuf,
    /// Where the notes, keys and the `die_once` marker live.
    pub state: PathBuf,
    lock: Arc<Mutex<()>>,
}

impl Fixture {
    /// A server logging to `log`, keeping its state in `state` (a directory).
    pub fn new(log: PathBuf, state: PathBuf) -> Fixture {
        let _ = std::fs::create_dir_all(&state);
        Fixture {
            log,
            state,
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// The tools, as `tools/list` gives them.
    pub fn tools() -> Value {
        let text = |name: &str| json!({"type": "object", "properties": {name: {"type": "string"}}, "required": [name]});
        json!([
            {"name": "echo", "description": "Says the text back.", "inputSchema": text("text"),
             "annotations": {"readOnlyHint": true}},
            {"name": "add_note", "description": "Adds a note to the notebook.", "inputSchema": text("note"),
             "annotations": {"readOnlyHint": false, "idempotentHint": true, "destructiveHint": false}},
            {"name": "send_email", "description": "Sends an email.",
             "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}}},
             "annotations": {"readOnlyHint": false, "destructiveHint": true}},
            {"name": "weather", "description": "The weather in a city.", "inputSchema": text("city"),
             "annotations": {"readOnlyHint": true}},
            {"name": "fail", "description": "Always fails.", "inputSchema": {"type": "object"}},
            {"name": "slow", "description": "Answers after ms milliseconds.",
             "inputSchema": {"type": "object", "properties": {"ms": {"type": "integer"}}}},
            {"name": "die_once", "description": "Ends the server the first time.",
             "inputSchema": {"type": "object"}, "annotations": {"idempotentHint": true}},
        ])
    }

    fn record(&self, tool: &str, arguments: &Value, key: &Value, applied: bool) {
        let line = json!({"tool": tool, "arguments": arguments, "key": key,
                          "pid": std::process::id(), "applied": applied});
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
        {
            let _ = writeln!(f, "{line}");
            let _ = f.sync_all();
        }
    }

    /// Answers one JSON-RPC message (None: a notification, no answer).
    pub async fn handle(&self, msg: &Value) -> Option<Value> {
        let id = msg.get("id")?.clone();
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method {
            "initialize" => {
                let asked = params.get("protocolVersion").and_then(Value::as_str);
                const KNOWN: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
                let version = asked.filter(|v| KNOWN.contains(v)).unwrap_or("2025-06-18");
                Ok(json!({"protocolVersion": version,
                          "capabilities": {"tools": {"listChanged": false}},
                          "serverInfo": {"name": "abridge-mcp-fixture", "version": "1"}}))
            }
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": Fixture::tools()})),
            "tools/call" => self.call(&params).await,
            _ => Err((-32601, format!("no method {method}"))),
        };
        Some(match result {
            Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        })
    }

    async fn call(&self, params: &Value) -> Result<Value, (i64, String)> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        let key = params
            .pointer("/_meta/abridge~1idempotency_key")
            .cloned()
            .unwrap_or(Value::Null);
        let text = |t: String| Ok(json!({"content": [{"type": "text", "text": t}]}));
        let arg = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        match name {
            "echo" => {
                self.record(name, &args, &key, true);
                text(arg("text"))
            }
            "add_note" => {
                let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
                let keys = self.state.join("keys");
                let seen = std::fs::read_to_string(&keys).unwrap_or_default();
                let k = key.as_str().unwrap_or_default().to_string();
                let applied = k.is_empty() || !seen.lines().any(|l| l == k);
                if applied {
                    append(&self.state.join("notes"), &arg("note"));
                    if !k.is_empty() {
                        append(&keys, &k);
                    }
                }
                self.record(name, &args, &key, applied);
                text(format!("noted: {}", arg("note")))
            }
            "send_email" => {
                append(&self.state.join("outbox"), &arg("to"));
                self.record(name, &args, &key, true);
                text(format!("sent to {}", arg("to")))
            }
            "weather" => {
                self.record(name, &args, &key, true);
                Ok(
                    json!({"content": [], "structuredContent": {"city": arg("city"), "sky": "clear"}}),
                )
            }
            "fail" => {
                self.record(name, &args, &key, false);
                Ok(
                    json!({"content": [{"type": "text", "text": "the fixture always fails"}], "isError": true}),
                )
            }
            "slow" => {
                self.record(name, &args, &key, true);
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                text(format!("slept {ms} ms"))
            }
            "die_once" => {
                let marker = self.state.join("died");
                if !marker.exists() {
                    append(&marker, "died");
                    self.record(name, &args, &key, false);
                    std::process::exit(3);
                }
                self.record(name, &args, &key, true);
                text("survived".into())
            }
            _ => Err((-32602, format!("no tool {name}"))),
        }
    }

    /// Serves stdio: one JSON message a line, until stdin ends.
    pub async fn serve_stdio(self) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let out = Arc::new(tokio::sync::Mutex::new(tokio::io::stdout()));
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let (me, out) = (self.clone(), out.clone());
            // Calls run side by side, as a real server's do.
            tokio::spawn(async move {
                if let Some(answer) = me.handle(&msg).await {
                    let mut out = out.lock().await;
                    let _ = out.write_all(format!("{answer}\n").as_bytes()).await;
                    let _ = out.flush().await;
                }
            });
        }
    }

    /// Serves streamable HTTP on `addr` (POST `/mcp`, JSON answers; GET is
    /// 405: no server-sent stream), printing its URL on stdout first.
    pub async fn serve_http(self, addr: &str) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!("listening on http://{}/mcp", listener.local_addr()?);
        let _ = std::io::stdout().flush();
        loop {
            let (socket, _) = listener.accept().await?;
            let me = self.clone();
            tokio::spawn(async move {
                let _ = me.http_connection(socket).await;
            });
        }
    }

    async fn http_connection(&self, socket: tokio::net::TcpStream) -> std::io::Result<()> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let mut reader = BufReader::new(socket);
        loop {
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).await? == 0 {
                return Ok(());
            }
            let method = request_line
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_string();
            let mut length = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).await? == 0 {
                    return Ok(());
                }
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            reader.read_exact(&mut body).await?;
            let (status, reply) = match method.as_str() {
                "POST" => match serde_json::from_slice::<Value>(&body) {
                    Ok(msg) => match self.handle(&msg).await {
                        Some(answer) => ("200 OK", Some(answer.to_string())),
                        None => ("202 Accepted", None),
                    },
                    Err(_) => ("400 Bad Request", None),
                },
                "DELETE" => ("200 OK", None),
                _ => ("405 Method Not Allowed", None),
            };
            let body = reply.unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 mcp-session-id: fixture-{}\r\n\r\n",
                body.len(),
                std::process::id()
            );
            let socket = reader.get_mut();
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(body.as_bytes()).await?;
            socket.flush().await?;
        }
    }
}

fn append(path: &std::path::Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
        let _ = f.sync_all();
    }
}

/// The log's lines.
pub fn calls(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
