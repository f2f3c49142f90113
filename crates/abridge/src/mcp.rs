//! Tools from MCP servers (feature `mcp`).
//!
//! [`McpServer`] connects to a Model Context Protocol server, over stdio (a
//! command line the server runs as) or streamable HTTP (a URL, with
//! headers), lists its tools and registers each in [`Tools`] with its name,
//! description and input schema as the server gives them. Each call is an
//! MCP `tools/call` on that server, recorded like any tool's (G5: a
//! completed call is never made again; its stored result text is reused).
//!
//! # Effect modes
//! An MCP tool's effects are unknown to abridge, so each tool is
//! **at-most-once** unless the host says otherwise ([`McpEffects`]): per
//! tool ([`McpEffects::tool`]), or by the server's tool annotations
//! ([`McpEffects::trust_annotations`]: a tool with `readOnlyHint` or
//! `idempotentHint` true is idempotent; `destructiveHint` alone changes
//! nothing). Annotations are hints from the server: trust them for servers
//! you trust.
//!
//! Every call carries its idempotency key ([`crate::ToolCall::idempotency_key`],
//! stable across retries and processes) in the request's `_meta`, under
//! [`IDEMPOTENCY_KEY_META`]: an idempotent call sent again after a crash or a
//! lost connection carries the same key, so a server can recognise it.
//!
//! # A server that dies
//! A server whose connection is gone (a stdio server that exited, an HTTP
//! server restarted) is connected to again before the next call
//! ([`McpServer::reconnects`] counts it). A call whose answer never came
//! (the connection dropped mid-call, or no answer within
//! [`McpServer::call_timeout`]) has an unknown outcome, and its mode decides,
//! as for a crash: an idempotent call is sent again (same key, up to
//! [`RESEND_LIMIT`] times, on a new connection); an at-most-once call is not,
//! and the model gets an error result saying the outcome is unknown.
//!
//! # Results
//! A result's text blocks, joined with newlines, are the result the model
//! sees (and what is stored); a result with no content blocks but
//! structured content is that JSON; an image or audio block is a
//! placeholder naming its type and size, an embedded resource its text (or
//! its URI), a resource link its URI. A result with `isError` is an error
//! result with the same text; a JSON-RPC error from the server (an unknown
//! tool, invalid arguments) is an error result with its message.
//!
//! ```no_run
//! use abridge::mcp::{McpEffects, McpServer};
//! # async fn run(store: abridge::Store, model: std::sync::Arc<dyn abridge::ModelClient>) -> Result<(), Box<dyn std::error::Error>> {
//! let files = McpServer::command_line("npx -y @modelcontextprotocol/server-filesystem /tmp").await?;
//! let remote = McpServer::http("https://mcp.example.com/mcp", [("authorization", "Bearer …")]).await?;
//! let tools = files.register(abridge::Tools::new(), &McpEffects::new().trust_annotations())?;
//! let tools = remote.register(tools, &McpEffects::new().tool("search", abridge::store::Effect::Idempotent))?;
//! let runner = abridge::Runner::builder(store, model).tools(tools).build()?;
//! # Ok(()) }
//! ```

use crate::message::ToolSpec;
use crate::store::Effect;
use crate::tools::{Tool, ToolCall, ToolError, Tools};
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::ServiceExt;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The `_meta` key of every call's idempotency key.
pub const IDEMPOTENCY_KEY_META: &str = "abridge/idempotency_key";

/// How many times an idempotent call whose answer was lost is sent again.
pub const RESEND_LIMIT: u32 = 3;

/// How long a call may wait for its answer by default.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Why an MCP server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The command line is empty or not well quoted.
    #[error("MCP command line {0:?}: {1}")]
    CommandLine(String, String),
    /// A header name or value is not valid HTTP.
    #[error("MCP header {0:?} is not a valid HTTP header")]
    Header(String),
    /// Connecting (starting the process, or the HTTP handshake) failed.
    #[error("could not connect to the MCP server {server}: {message}")]
    Connect {
        /// The server, as [`McpServer::label`] names it.
        server: String,
        /// What failed.
        message: String,
    },
    /// Listing its tools failed.
    #[error("could not list the tools of the MCP server {server}: {message}")]
    ListTools {
        /// The server.
        server: String,
        /// What failed.
        message: String,
    },
    /// A tool of that name is registered already (from another server, or
    /// the host's own): give one server a prefix ([`McpEffects::prefix`]).
    #[error("the MCP server {server}'s tool {tool:?} has the name of a tool registered already")]
    DuplicateTool {
        /// The server.
        server: String,
        /// The tool's name as registered.
        tool: String,
    },
    /// [`McpEffects::tool`] names a tool the server does not have, or a mode
    /// an MCP tool cannot have.
    #[error("{0}")]
    Effects(String),
}

/// Where an MCP server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A process the server runs as, spoken to over its stdin and stdout
    /// (its stderr is the host's).
    Stdio {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to its environment.
        env: Vec<(String, String)>,
    },
    /// A server at a URL, over streamable HTTP.
    Http {
        /// The endpoint (`https://host/mcp`).
        url: String,
        /// Headers sent with every request (`authorization`, ...).
        headers: Vec<(String, String)>,
    },
}

impl McpTransport {
    /// A command line, split as a POSIX shell splits words (quotes and
    /// backslashes; no variables, globs or pipes).
    pub fn command_line(line: &str) -> Result<McpTransport, McpError> {
        let words = shell_words::split(line)
            .map_err(|e| McpError::CommandLine(line.to_string(), e.to_string()))?;
        let mut words = words.into_iter();
        let program = words
            .next()
            .ok_or_else(|| McpError::CommandLine(line.to_string(), "no program".into()))?;
        Ok(McpTransport::Stdio {
            program,
            args: words.collect(),
            env: Vec::new(),
        })
    }

    fn label(&self) -> String {
        match self {
            McpTransport::Stdio { program, args, .. } => {
                let mut words = vec![program.clone()];
                words.extend(args.iter().cloned());
                shell_words::join(words)
            }
            McpTransport::Http { url, .. } => url.clone(),
        }
    }
}

/// A tool an MCP server lists.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// Its name on the server.
    pub name: String,
    /// Its description (empty when the server gives none).
    pub description: String,
    /// Its input schema, as given.
    pub input_schema: Value,
    /// `readOnlyHint`, where the server says.
    pub read_only: Option<bool>,
    /// `idempotentHint`, where the server says.
    pub idempotent: Option<bool>,
    /// `destructiveHint`, where the server says.
    pub destructive: Option<bool>,
}

/// Which effect mode each of a server's tools gets, and under which name it
/// is registered.
#[derive(Debug, Clone, Default)]
pub struct McpEffects {
    trust_annotations: bool,
    per_tool: BTreeMap<String, Effect>,
    prefix: String,
}

impl McpEffects {
    /// Every tool at-most-once.
    pub fn new() -> McpEffects {
        McpEffects::default()
    }

    /// Follow the server's annotations: a tool with `readOnlyHint` or
    /// `idempotentHint` true is idempotent (sent again after a crash, with
    /// the same key); the others stay at-most-once.
    pub fn trust_annotations(mut self) -> McpEffects {
        self.trust_annotations = true;
        self
    }

    /// The mode of the tool `name` (its name on the server): `Idempotent` or
    /// `AtMostOnce`; wins over the annotations.
    pub fn tool(mut self, name: impl Into<String>, effect: Effect) -> McpEffects {
        self.per_tool.insert(name.into(), effect);
        self
    }

    /// Register the server's tools as `{prefix}{name}` (for two servers
    /// with tools of the same name).
    pub fn prefix(mut self, prefix: impl Into<String>) -> McpEffects {
        self.prefix = prefix.into();
        self
    }

    /// The mode `tool` gets.
    pub fn effect_of(&self, tool: &McpTool) -> Effect {
        if let Some(e) = self.per_tool.get(&tool.name) {
            return *e;
        }
        if self.trust_annotations && (tool.read_only == Some(true) || tool.idempotent == Some(true))
        {
            return Effect::Idempotent;
        }
        Effect::AtMostOnce
    }
}

type Connection = RunningService<RoleClient, ()>;

struct Shared {
    label: String,
    transport: McpTransport,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    connects: AtomicU64,
    call_timeout: std::sync::Mutex<Duration>,
}

/// A connection to one MCP server and the tools it listed (cheap to clone:
/// clones share the connection).
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    tools: Arc<Vec<McpTool>>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("server", &self.shared.label)
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl McpServer {
    /// Connects to the server and lists its tools.
    pub async fn connect(transport: McpTransport) -> Result<McpServer, McpError> {
        let shared = Arc::new(Shared {
            label: transport.label(),
            transport,
            conn: tokio::sync::Mutex::new(None),
            connects: AtomicU64::new(0),
            call_timeout: std::sync::Mutex::new(DEFAULT_CALL_TIMEOUT),
        });
        let conn = shared.connection().await?;
        let listed = conn
            .list_all_tools()
            .await
            .map_err(|e| McpError::ListTools {
                server: shared.label.clone(),
                message: e.to_string(),
            })?;
        let tools = listed
            .into_iter()
            .map(|t| {
                let a = t.annotations.as_ref();
                McpTool {
                    name: t.name.to_string(),
                    description: t.description.as_deref().unwrap_or_default().to_string(),
                    input_schema: Value::Object((*t.input_schema).clone()),
                    read_only: a.and_then(|a| a.read_only_hint),
                    idempotent: a.and_then(|a| a.idempotent_hint),
                    destructive: a.and_then(|a| a.destructive_hint),
                }
            })
            .collect();
        Ok(McpServer {
            shared,
            tools: Arc::new(tools),
        })
    }

    /// A server run as the command `line` (split as a shell splits words),
    /// over stdio.
    pub async fn command_line(line: &str) -> Result<McpServer, McpError> {
        McpServer::connect(McpTransport::command_line(line)?).await
    }

    /// A server at `url`, over streamable HTTP, with `headers` on every
    /// request.
    pub async fn http<I, K, V>(url: &str, headers: I) -> Result<McpServer, McpError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        McpServer::connect(McpTransport::Http {
            url: url.to_string(),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        })
        .await
    }

    /// The server as errors and logs name it (its command line or URL).
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// The tools it listed when connected.
    pub fn tools(&self) -> &[McpTool] {
        &self.tools
    }

    /// How many times the server was connected to again after its
    /// connection was lost.
    pub fn reconnects(&self) -> u64 {
        self.shared
            .connects
            .load(Ordering::Relaxed)
            .saturating_sub(1)
    }

    /// How long a call waits for its answer before its outcome counts as
    /// unknown (default [`DEFAULT_CALL_TIMEOUT`]).
    pub fn call_timeout(self, timeout: Duration) -> McpServer {
        *self
            .shared
            .call_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = timeout;
        self
    }

    /// Registers every tool of the server in `tools`, each with the mode
    /// `effects` gives it.
    pub fn register(&self, mut tools: Tools, effects: &McpEffects) -> Result<Tools, McpError> {
        let names: BTreeSet<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
        for (name, effect) in &effects.per_tool {
            if !names.contains(name.as_str()) {
                return Err(McpError::Effects(format!(
                    "the MCP server {} has no tool {name:?} (it has: {})",
                    self.shared.label,
                    names.iter().copied().collect::<Vec<_>>().join(", ")
                )));
            }
            if !matches!(effect, Effect::Idempotent | Effect::AtMostOnce) {
                return Err(McpError::Effects(format!(
                    "an MCP tool is idempotent or at-most-once, not {effect:?} ({name:?})"
                )));
            }
        }
        for tool in self.tools.iter() {
            let registered = format!("{}{}", effects.prefix, tool.name);
            if tools.get(&registered).is_some() {
                return Err(McpError::DuplicateTool {
                    server: self.shared.label.clone(),
                    tool: registered,
                });
            }
            let spec = ToolSpec {
                name: registered,
                description: tool.description.clone(),
                input_schema: tool.input_schema.clone(),
            };
            let effect = effects.effect_of(tool);
            let call = McpCall {
                shared: self.shared.clone(),
                name: tool.name.clone(),
                effect,
            };
            tools = match effect {
                Effect::Idempotent => tools.idempotent(spec, call),
                _ => tools.at_most_once(spec, call),
            };
        }
        Ok(tools)
    }

    /// Closes the connection (a stdio server's process is ended); a later
    /// call connects again.
    pub async fn close(&self) {
        let conn = self.shared.conn.lock().await.take();
        if let Some(conn) = conn {
            if let Ok(mut conn) = Arc::try_unwrap(conn) {
                let _ = conn.close().await;
            }
        }
    }
}

impl Shared {
    /// The live connection, connecting (again) when there is none or it is
    /// closed.
    async fn connection(&self) -> Result<Arc<Connection>, McpError> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref() {
            if !conn.is_transport_closed() {
                return Ok(conn.clone());
            }
        }
        let conn = Arc::new(self.open().await?);
        if self.connects.fetch_add(1, Ordering::Relaxed) > 0 {
            tracing::info!(server = %self.label, "connected to the MCP server again");
        }
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets `conn` (when it is still the current one): the next call
    /// connects again.
    async fn drop_connection(&self, conn: &Arc<Connection>) {
        let mut slot = self.conn.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }

    async fn open(&self) -> Result<Connection, McpError> {
        let failed = |message: String| McpError::Connect {
            server: self.label.clone(),
            message,
        };
        match &self.transport {
            McpTransport::Stdio { program, args, env } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                for (k, v) in env {
                    command.env(k, v);
                }
                let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|e| failed(e.to_string()))?;
                ().serve(transport).await.map_err(|e| failed(e.to_string()))
            }
            McpTransport::Http { url, headers } => {
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let mut custom = std::collections::HashMap::new();
                for (k, v) in headers {
                    let name = http::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| McpError::Header(k.clone()))?;
                    let value =
                        http::HeaderValue::from_str(v).map_err(|_| McpError::Header(k.clone()))?;
                    custom.insert(name, value);
                }
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
                ().serve(transport).await.map_err(|e| failed(e.to_string()))
            }
        }
    }
}

/// One registered MCP tool.
struct McpCall {
    shared: Arc<Shared>,
    name: String,
    effect: Effect,
}

#[async_trait]
impl Tool for McpCall {
    async fn call(&self, call: &ToolCall) -> Result<Value, ToolError> {
        let arguments = match &call.input {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            other => {
                return Err(ToolError::new(format!(
                    "the arguments of {} must be a JSON object, not {other}",
                    self.name
                )))
            }
        };
        let mut meta = RequestMetaObject::new();
        meta.insert(
            IDEMPOTENCY_KEY_META.to_string(),
            Value::String(call.idempotency_key.clone()),
        );
        let mut params = CallToolRequestParams::new(self.name.clone());
        params.arguments = Some(arguments);
        params.meta = Some(meta);
        let timeout = *self
            .shared
            .call_timeout
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut sent = 0u32;
        loop {
            // Not sent yet: a server that cannot be reached is an error
            // result in every mode (nothing happened).
            let conn = self.shared.connection().await.map_err(|e| {
                ToolError::new(format!("{e}; the tool {} was not called", self.name))
            })?;
            sent += 1;
            let lost = match tokio::time::timeout(timeout, conn.call_tool(params.clone())).await {
                Ok(Ok(result)) => return result_of(result),
                Ok(Err(ServiceError::McpError(e))) => {
                    return Err(ToolError::new(format!(
                        "the MCP server refused the call: {}",
                        e.message
                    )))
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {timeout:?}"),
            };
            self.shared.drop_connection(&conn).await;
            tracing::warn!(server = %self.shared.label, tool = %self.name, error = %lost,
                "an MCP call's answer was lost");
            if self.effect == Effect::Idempotent && sent <= RESEND_LIMIT {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(sent))).await;
                continue;
            }
            return Err(ToolError::new(match self.effect {
                Effect::Idempotent => format!(
                    "the MCP server {} lost the call to {} {sent} times ({lost}); its outcome is unknown",
                    self.shared.label, self.name
                ),
                _ => format!(
                    "the MCP server {} did not answer the call to {} ({lost}): its outcome is \
                     unknown, and an at-most-once call is not sent again",
                    self.shared.label, self.name
                ),
            }));
        }
    }
}

/// A call's result as the model sees it.
fn result_of(result: rmcp::model::CallToolResult) -> Result<Value, ToolError> {
    let wire = serde_json::to_value(&result).unwrap_or(Value::Null);
    let blocks = wire
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let texts: Vec<String> = blocks.iter().map(block_text).collect();
    let value = if !texts.is_empty() {
        Value::String(texts.join("\n"))
    } else {
        match wire.get("structuredContent") {
            Some(v) => v.clone(),
            None => Value::String(String::new()),
        }
    };
    if wire.get("isError").and_then(Value::as_bool) == Some(true) {
        return Err(ToolError::new(match value {
            Value::String(s) => s,
            other => other.to_string(),
        }));
    }
    Ok(value)
}

/// One content block as text.
fn block_text(block: &Value) -> String {
    let field = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or_default();
    match field("type") {
        "text" => field("text").to_string(),
        kind @ ("image" | "audio") => format!(
            "[{kind} {}, {} bytes of base64]",
            field("mimeType"),
            field("data").len()
        ),
        "resource" => {
            let r = block.get("resource").cloned().unwrap_or(Value::Null);
            match r.get("text").and_then(Value::as_str) {
                Some(t) => t.to_string(),
                None => format!(
                    "[resource {}]",
                    r.get("uri").and_then(Value::as_str).unwrap_or_default()
                ),
            }
        }
        "resource_link" => format!("[resource {}]", field("uri")),
        other => format!("[{other} content]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_splits_as_a_shell_splits_words() {
        let t = McpTransport::command_line("npx -y 'server two' \"a b\"").unwrap();
        assert_eq!(
            t,
            McpTransport::Stdio {
                program: "npx".into(),
                args: vec!["-y".into(), "server two".into(), "a b".into()],
                env: vec![]
            }
        );
        assert!(McpTransport::command_line("  ").is_err());
        assert!(McpTransport::command_line("a 'b").is_err());
    }

    #[test]
    fn modes_follow_the_host_then_the_annotations_then_at_most_once() {
        let tool = |ro, idem| McpTool {
            name: "t".into(),
            description: String::new(),
            input_schema: Value::Null,
            read_only: ro,
            idempotent: idem,
            destructive: None,
        };
        let plain = McpEffects::new();
        assert_eq!(plain.effect_of(&tool(Some(true), None)), Effect::AtMostOnce);
        let trusting = McpEffects::new().trust_annotations();
        assert_eq!(
            trusting.effect_of(&tool(Some(true), None)),
            Effect::Idempotent
        );
        assert_eq!(
            trusting.effect_of(&tool(None, Some(true))),
            Effect::Idempotent
        );
        assert_eq!(
            trusting.effect_of(&tool(Some(false), Some(false))),
            Effect::AtMostOnce
        );
        let host = trusting.tool("t", Effect::AtMostOnce);
        assert_eq!(host.effect_of(&tool(Some(true), None)), Effect::AtMostOnce);
    }

    #[test]
    fn results_map_text_structured_content_and_errors() {
        let r = |v: Value| result_of(serde_json::from_value(v).unwrap());
        assert_eq!(
            r(
                serde_json::json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
            ),
            Ok(Value::String("a\nb".into()))
        );
        assert_eq!(
            r(serde_json::json!({"content": [], "structuredContent": {"sky": "clear"}})),
            Ok(serde_json::json!({"sky": "clear"}))
        );
        assert_eq!(
            r(serde_json::json!({"content": [{"type": "text", "text": "no"}], "isError": true})),
            Err(ToolError::new("no"))
        );
        assert_eq!(
            r(
                serde_json::json!({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}]})
            ),
            Ok(Value::String("[image image/png, 4 bytes of base64]".into()))
        );
    }
}
