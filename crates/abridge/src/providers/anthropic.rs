//! Anthropic's Messages API, with extended thinking and prompt caching.

use super::http::{event_json, stream_error, Flow, Http, HttpOptions, Streamed};
use super::ApiKey;
use crate::message::{ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, Usage};
use crate::model::{Delta, ModelClient, ModelError, OnDelta};
use serde_json::{json, Value};

/// A [`ModelClient`] for the Messages API (`POST {base}/messages`).
///
/// - **Extended thinking** ([`Anthropic::with_thinking`]): thinking and
///   redacted-thinking blocks are stored with the response and sent back in
///   place, signature and all, before the tool calls they led to, as the API
///   requires when tools are used.
/// - **Prompt caching** (on by default, [`Anthropic::with_cache`]): abridge's
///   messages are an append-only, byte-identical prefix between compactions,
///   so three `cache_control` breakpoints are placed: on the system prompt
///   (tools and system), on the first message after it (the summary, or the
///   first turn's input) and on the last message (the history so far, read
///   back by the next step). Cache reads and writes are stored per step.
/// - Usage: `input_tokens` is the whole prompt (the API's uncached input plus
///   its cache reads and writes); the stop reason is `stop_reason`.
/// - Consecutive messages of one role (the summary, then a turn's input) are
///   sent as one message with both contents.
#[derive(Debug, Clone)]
pub struct Anthropic {
    http: Http,
    max_tokens: u32,
    thinking_budget: Option<u32>,
    cache: bool,
}

impl Anthropic {
    /// Anthropic's API, base URL `https://api.anthropic.com/v1`.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com/v1";
    /// The `anthropic-version` header sent.
    pub const API_VERSION: &'static str = "2023-06-01";

    /// A client at `options.base_url` sending `key` as `x-api-key`.
    pub fn new(options: HttpOptions, key: ApiKey) -> crate::Result<Anthropic> {
        Ok(Anthropic {
            http: Http::anthropic(&options, &key, None)?,
            max_tokens: 8192,
            thinking_budget: None,
            cache: true,
        })
    }

    /// Anthropic with the key in `ANTHROPIC_API_KEY`, at `ANTHROPIC_BASE_URL`
    /// when set (the API's root, as Anthropic's SDKs read it: see
    /// [`super::anthropic_base_url`]).
    pub fn from_env() -> crate::Result<Anthropic> {
        let (options, key) = super::anthropic_env()?;
        Anthropic::new(options, key)
    }

    /// `max_tokens` when the request names none. Default 8,192.
    pub fn with_max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = n;
        self
    }

    /// Extended thinking with a budget of `budget_tokens` (which must be
    /// below `max_tokens`).
    pub fn with_thinking(mut self, budget_tokens: u32) -> Self {
        self.thinking_budget = Some(budget_tokens);
        self
    }

    /// Prompt-cache breakpoints on or off. Default on.
    pub fn with_cache(mut self, on: bool) -> Self {
        self.cache = on;
        self
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ModelRequest) -> Value {
        let mut system = Vec::new();
        let mut messages: Vec<(Role, Vec<Value>)> = Vec::new();
        for m in request.messages.iter() {
            let blocks: Vec<Value> = m.content.iter().filter_map(block).collect();
            if m.role == Role::System {
                system.extend(blocks);
                continue;
            }
            match messages.last_mut() {
                Some((role, content)) if *role == m.role => content.extend(blocks),
                _ if blocks.is_empty() => {}
                _ => messages.push((m.role, blocks)),
            }
        }
        let cache = json!({"type": "ephemeral"});
        if self.cache {
            if let Some(last) = system.last_mut() {
                last["cache_control"] = cache.clone();
            }
            let n = messages.len();
            for i in [0, n.saturating_sub(1)] {
                if let Some(last) = messages.get_mut(i).and_then(|(_, c)| c.last_mut()) {
                    last["cache_control"] = cache.clone();
                }
            }
        }
        let messages: Vec<Value> = messages
            .into_iter()
            .map(|(role, content)| {
                let role = if role == Role::Assistant {
                    "assistant"
                } else {
                    "user"
                };
                json!({"role": role, "content": content})
            })
            .collect();
        let mut body = json!({
            "model": request.model,
            "max_tokens": request.max_output_tokens.unwrap_or(self.max_tokens),
            "messages": messages,
        });
        if !system.is_empty() {
            body["system"] = Value::Array(system);
        }
        if !request.tools.is_empty() {
            body["tools"] = Value::Array(
                request
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "name": t.name,
                            "description": t.description,
                            "input_schema": t.input_schema,
                        })
                    })
                    .collect(),
            );
        }
        if let Some(budget) = self.thinking_budget {
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
        }
        body
    }

    /// The response in `body`, an answer of the API.
    pub fn parse_response(body: &Value) -> Result<ModelResponse, ModelError> {
        let content = body
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| super::malformed("no content", body))?;
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let mut blocks = Vec::new();
        for b in content {
            let kind = b.get("type").and_then(Value::as_str).unwrap_or_default();
            blocks.push(match kind {
                "text" => ResponseBlock::Text {
                    text: s(b, "text").unwrap_or_default(),
                },
                "tool_use" => ResponseBlock::ToolUse {
                    id: s(b, "id").unwrap_or_default(),
                    name: s(b, "name").unwrap_or_default(),
                    input: b.get("input").cloned().unwrap_or_else(|| json!({})),
                    raw_input: None,
                },
                "thinking" => ResponseBlock::Thinking {
                    thinking: s(b, "thinking").unwrap_or_default(),
                    signature: s(b, "signature"),
                },
                "redacted_thinking" => ResponseBlock::RedactedThinking {
                    data: s(b, "data").unwrap_or_default(),
                },
                other => ResponseBlock::Other {
                    kind: other.to_string(),
                    value: b.clone(),
                },
            });
        }
        Ok(ModelResponse {
            blocks,
            usage: usage(body.get("usage").unwrap_or(&Value::Null)),
            stop_reason: s(body, "stop_reason"),
            model: s(body, "model"),
        })
    }
}

/// The API's usage: input is its uncached input plus cache reads and writes.
fn usage(usage: &Value) -> Usage {
    let n = |k: &str| usage.get(k).and_then(Value::as_u64);
    let (fresh, read, write) = (
        n("input_tokens"),
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
    );
    Usage {
        input_tokens: fresh.map(|f| f + read.unwrap_or(0) + write.unwrap_or(0)),
        output_tokens: n("output_tokens"),
        cache_read_tokens: read,
        cache_write_tokens: write,
    }
}

/// A content block as the API takes it (None: nothing to send).
fn block(b: &ContentBlock) -> Option<Value> {
    Some(match b {
        ContentBlock::Text { text } if text.is_empty() => return None,
        ContentBlock::Text { text } => json!({"type": "text", "text": text}),
        ContentBlock::Data { value } => json!({"type": "text", "text": value.to_string()}),
        ContentBlock::ToolUse {
            id, name, input, ..
        } => json!({"type": "tool_use", "id": id, "name": name, "input": input}),
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => json!({
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": content,
            "is_error": is_error,
        }),
        ContentBlock::Thinking {
            thinking,
            signature,
        } => {
            let mut v = json!({"type": "thinking", "thinking": thinking});
            if let Some(sig) = signature {
                v["signature"] = json!(sig);
            }
            v
        }
        ContentBlock::RedactedThinking { data } => {
            json!({"type": "redacted_thinking", "data": data})
        }
    })
}

#[async_trait::async_trait]
impl ModelClient for Anthropic {
    fn provider_name(&self) -> Option<&str> {
        Some("anthropic")
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = self.request_body(request);
        let answer = self.http.post("/messages", &body).await?;
        Anthropic::parse_response(&answer)
    }

    /// Streams with `stream: true`, to the `message_stop` event.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        on_delta: OnDelta<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = self.request_body(request);
        body["stream"] = json!(true);
        let mut answer = MessageStream::default();
        let streamed = self
            .http
            .post_stream("/messages", &body, &mut |_, data| {
                answer.event(data, on_delta)
            })
            .await?;
        match streamed {
            Streamed::Whole(body) => Anthropic::parse_response(&body),
            Streamed::Events => Anthropic::parse_response(&answer.message),
        }
    }
}

/// A Messages answer as its stream's events build it up: the message a call
/// without streaming gets (its content blocks whole, a tool call's input
/// parsed from the JSON text its pieces make, the stop reason, the usage of
/// `message_start` updated by `message_delta`), so the same parser reads
/// both.
#[derive(Debug, Default)]
struct MessageStream {
    message: Value,
    /// A tool call's input text so far, by content block.
    inputs: Vec<Option<String>>,
    /// A tool call's position among the answer's calls, by content block.
    call_index: Vec<Option<usize>>,
    calls: usize,
}

impl MessageStream {
    fn event(&mut self, data: &str, on_delta: OnDelta<'_>) -> Result<Flow, ModelError> {
        let v = event_json(data)?;
        let malformed = |what: &str| super::malformed(what, &v);
        let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
        let index = || -> Result<usize, ModelError> {
            v.get("index")
                .and_then(Value::as_u64)
                .map(|i| i as usize)
                .ok_or_else(|| malformed("an event without its block's index"))
        };
        match kind {
            "message_start" => {
                self.message = v
                    .get("message")
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| malformed("message_start without its message"))?;
                self.message["content"] = json!([]);
            }
            "content_block_start" => {
                let i = index()?;
                let calls = self.calls;
                let content = self.content()?;
                if i != content.len() {
                    return Err(malformed("a content block out of order"));
                }
                let block = v
                    .get("content_block")
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| malformed("content_block_start without its block"))?;
                let is_call = block.get("type").and_then(Value::as_str) == Some("tool_use");
                if is_call {
                    let s = |k: &str| block.get(k).and_then(Value::as_str).map(str::to_string);
                    on_delta(Delta::ToolCall {
                        index: calls,
                        id: s("id"),
                        name: s("name"),
                        arguments: String::new(),
                    });
                }
                content.push(block);
                self.inputs.push(is_call.then(String::new));
                self.call_index.push(is_call.then_some(self.calls));
                self.calls += usize::from(is_call);
            }
            "content_block_delta" => {
                let i = index()?;
                let delta = v.get("delta").unwrap_or(&Value::Null);
                let s = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or_default();
                let block = self
                    .content()?
                    .get_mut(i)
                    .ok_or_else(|| malformed("a delta for a block not started"))?;
                let append = |block: &mut Value, key: &str, piece: &str| {
                    let mut text = block
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    text.push_str(piece);
                    block[key] = json!(text);
                };
                match delta
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                {
                    "text_delta" => {
                        append(block, "text", s("text"));
                        on_delta(Delta::Text {
                            text: s("text").to_string(),
                        });
                    }
                    "thinking_delta" => {
                        append(block, "thinking", s("thinking"));
                        on_delta(Delta::Thinking {
                            text: s("thinking").to_string(),
                        });
                    }
                    "signature_delta" => append(block, "signature", s("signature")),
                    "input_json_delta" => {
                        let (Some(Some(input)), Some(Some(index))) =
                            (self.inputs.get_mut(i), self.call_index.get(i))
                        else {
                            return Err(malformed("input for a block that is not a tool call"));
                        };
                        input.push_str(s("partial_json"));
                        on_delta(Delta::ToolCall {
                            index: *index,
                            id: None,
                            name: None,
                            arguments: s("partial_json").to_string(),
                        });
                    }
                    "citations_delta" => {
                        if let Some(c) = delta.get("citation") {
                            match block.get_mut("citations").and_then(Value::as_array_mut) {
                                Some(list) => list.push(c.clone()),
                                None => block["citations"] = json!([c]),
                            }
                        }
                    }
                    // A delta of a kind this client does not know: the block
                    // keeps what the start event gave.
                    _ => {}
                }
            }
            "content_block_stop" => {
                let i = index()?;
                if let Some(Some(text)) = self.inputs.get(i) {
                    if !text.trim().is_empty() {
                        let input: Value = serde_json::from_str(text).map_err(|e| {
                            ModelError::Transient(format!(
                                "a tool call's streamed input is not JSON ({e})"
                            ))
                        })?;
                        let block = self
                            .content()?
                            .get_mut(i)
                            .ok_or_else(|| malformed("a stop for a block not started"))?;
                        block["input"] = input;
                    }
                }
            }
            "message_delta" => {
                if !self.message.is_object() {
                    return Err(malformed("message_delta before message_start"));
                }
                if let Some(delta) = v.get("delta").and_then(Value::as_object) {
                    for (k, x) in delta {
                        self.message[k] = x.clone();
                    }
                }
                if let Some(usage) = v.get("usage").and_then(Value::as_object) {
                    if !self.message["usage"].is_object() {
                        self.message["usage"] = json!({});
                    }
                    for (k, x) in usage {
                        self.message["usage"][k] = x.clone();
                    }
                }
            }
            "message_stop" => {
                self.content()?;
                return Ok(Flow::Done);
            }
            "error" => {
                let kind = v
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Err(stream_error(kind, data));
            }
            // `ping`, and events of kinds added after this client.
            _ => {}
        }
        Ok(Flow::More)
    }

    /// The content blocks so far; an error before `message_start`.
    fn content(&mut self) -> Result<&mut Vec<Value>, ModelError> {
        self.message
            .get_mut("content")
            .and_then(Value::as_array_mut)
            .ok_or_else(|| {
                ModelError::Transient("the answer's stream began without message_start".into())
            })
    }
}

/// Anthropic's server-side compaction as a [`crate::Summariser`].
///
/// The span (the previous summary and the turns to fold, with abridge's
/// summary rules) is sent as one request with the `compact_20260112` context
/// edit (beta `compact-2026-01-12`), its trigger at the API's floor of
/// 50,000 input tokens and `pause_after_compaction` set: a span past the
/// floor is compacted by the provider, and the `compaction` block's text is
/// the summary; a smaller one is answered by the model as an ordinary
/// summary request (the rules ask for exactly that). Either way abridge
/// claims the row once, stores the text, and every step that reads it sends
/// it as any summary.
#[derive(Debug, Clone)]
pub struct AnthropicCompaction {
    http: Http,
    model: String,
    max_tokens: u32,
}

impl AnthropicCompaction {
    /// The beta this uses.
    pub const BETA: &'static str = "compact-2026-01-12";
    /// The API's lowest compaction trigger, in input tokens.
    pub const TRIGGER_FLOOR: u64 = 50_000;

    /// Compacts with `model` at `options.base_url`.
    pub fn new(
        options: HttpOptions,
        key: ApiKey,
        model: impl Into<String>,
    ) -> crate::Result<AnthropicCompaction> {
        Ok(AnthropicCompaction {
            http: Http::anthropic(&options, &key, Some(AnthropicCompaction::BETA))?,
            model: model.into(),
            max_tokens: 8192,
        })
    }

    /// Anthropic with the key in `ANTHROPIC_API_KEY`, at `ANTHROPIC_BASE_URL`
    /// when set.
    pub fn from_env(model: impl Into<String>) -> crate::Result<AnthropicCompaction> {
        let (options, key) = super::anthropic_env()?;
        AnthropicCompaction::new(options, key, model)
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &crate::compaction::SummaryRequest) -> Value {
        json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": request.rules,
            "messages": [{"role": "user", "content": [{"type": "text", "text": request.body()}]}],
            "context_management": {"edits": [{
                "type": "compact_20260112",
                "trigger": {"type": "input_tokens", "value": AnthropicCompaction::TRIGGER_FLOOR},
                "pause_after_compaction": true,
                "instructions": format!(
                    "{}\n\nWrite the summary in at most {} characters.",
                    request.rules, request.max_chars
                ),
            }]},
        })
    }
}

#[async_trait::async_trait]
impl crate::compaction::Summariser for AnthropicCompaction {
    async fn summarise(
        &self,
        request: &crate::compaction::SummaryRequest,
    ) -> Result<crate::compaction::SummaryResponse, ModelError> {
        let body = self.request_body(request);
        let answer = self.http.post("/messages", &body).await?;
        let content = answer
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| super::malformed("no content", &answer))?;
        let text_of = |kind: &str, field: &str| -> Vec<String> {
            content
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some(kind))
                .filter_map(|b| b.get(field).and_then(Value::as_str).map(str::to_string))
                .collect()
        };
        // The provider's compaction when it ran; the model's answer otherwise.
        let compacted = text_of("compaction", "content");
        let text = if compacted.is_empty() {
            text_of("text", "text").join("\n")
        } else {
            compacted.join("\n")
        };
        Ok(crate::compaction::SummaryResponse {
            text,
            usage: usage(answer.get("usage").unwrap_or(&Value::Null)),
        })
    }

    fn model(&self) -> Option<String> {
        Some(self.model.clone())
    }
}
