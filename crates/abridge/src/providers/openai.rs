//! OpenAI's Chat Completions API, and every server that speaks it.

use super::http::{event_json, stream_error, Flow, Http, HttpOptions, Streamed};
use super::{malformed, ApiKey};
use crate::message::{
    ContentBlock, Message, ModelRequest, ModelResponse, ResponseBlock, Role, ToolSpec, Usage,
};
use crate::model::{Delta, ModelClient, ModelError, OnDelta};
use serde_json::{json, Map, Value};

/// A [`ModelClient`] for the Chat Completions API (`POST {base}/chat/completions`).
///
/// ```no_run
/// # fn f() -> abridge::Result<()> {
/// use abridge::providers::{ApiKey, HttpOptions, OpenAiChat};
/// let openai = OpenAiChat::from_env()?; // OPENAI_API_KEY, OPENAI_BASE_URL
/// let local = OpenAiChat::new(HttpOptions::new("http://127.0.0.1:8080/v1"), None)?;
/// # Ok(()) }
/// ```
///
/// Mapping: the system prompt is a `system` message; tool results are `tool`
/// messages (an error result prefixed `Error: `, as the API has no error
/// flag); a tool call's arguments are sent back as the exact text received;
/// reasoning blocks (another provider's) are not sent. Usage:
/// `prompt_tokens` (cached ones included), `completion_tokens`,
/// `prompt_tokens_details.cached_tokens` as cache reads. The stop reason is
/// `finish_reason`.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    http: Http,
}

impl OpenAiChat {
    /// OpenAI's API, base URL `https://api.openai.com/v1`.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// A client at `options.base_url`, sending `key` as a bearer token (None
    /// for a local server that wants none).
    pub fn new(options: HttpOptions, key: Option<ApiKey>) -> crate::Result<OpenAiChat> {
        Ok(OpenAiChat {
            http: Http::bearer(&options, key.as_ref())?,
        })
    }

    /// OpenAI with the key in `OPENAI_API_KEY`, at `OPENAI_BASE_URL` when set.
    pub fn from_env() -> crate::Result<OpenAiChat> {
        let (options, key) = super::openai_env()?;
        OpenAiChat::new(options, Some(key))
    }

    /// The JSON body sent for `request`.
    pub fn request_body(request: &ModelRequest) -> Value {
        let mut body = json!({
            "model": request.model,
            "messages": messages(&request.messages),
        });
        if !request.tools.is_empty() {
            body["tools"] = Value::Array(request.tools.iter().map(tool).collect());
        }
        if let Some(n) = request.max_output_tokens {
            body["max_completion_tokens"] = json!(n);
        }
        body
    }

    /// The response in `body`, an answer of the API.
    pub fn parse_response(body: &Value) -> Result<ModelResponse, ModelError> {
        let choice = body
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or_else(|| malformed("no choices", body))?;
        let message = choice
            .get("message")
            .ok_or_else(|| malformed("no message", body))?;
        let mut blocks = Vec::new();
        if let Some(text) = message.get("content").and_then(Value::as_str) {
            if !text.is_empty() {
                blocks.push(ResponseBlock::Text {
                    text: text.to_string(),
                });
            }
        }
        if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
            blocks.push(ResponseBlock::Text {
                text: refusal.to_string(),
            });
        }
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let f = call.get("function").unwrap_or(&Value::Null);
            let raw = f.get("arguments").and_then(Value::as_str).unwrap_or("{}");
            blocks.push(tool_use(
                call.get("id").and_then(Value::as_str).unwrap_or_default(),
                f.get("name").and_then(Value::as_str).unwrap_or_default(),
                raw,
            ));
        }
        let usage = body.get("usage").unwrap_or(&Value::Null);
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: usage.get("prompt_tokens").and_then(Value::as_u64),
                output_tokens: usage.get("completion_tokens").and_then(Value::as_u64),
                cache_read_tokens: usage
                    .pointer("/prompt_tokens_details/cached_tokens")
                    .and_then(Value::as_u64),
                cache_write_tokens: None,
            },
            stop_reason: choice
                .get("finish_reason")
                .and_then(Value::as_str)
                .map(str::to_string),
            model: body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

#[async_trait::async_trait]
impl ModelClient for OpenAiChat {
    fn provider_name(&self) -> Option<&str> {
        Some("openai")
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = OpenAiChat::request_body(request);
        let answer = self.http.post("/chat/completions", &body).await?;
        OpenAiChat::parse_response(&answer)
    }

    /// Streams with `stream: true` and `stream_options.include_usage` (the
    /// usage arrives in a last chunk of its own), to `data: [DONE]`.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        on_delta: OnDelta<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = OpenAiChat::request_body(request);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut answer = ChatStream::default();
        let streamed = self
            .http
            .post_stream("/chat/completions", &body, &mut |_, data| {
                answer.chunk(data, on_delta)
            })
            .await?;
        match streamed {
            Streamed::Whole(body) => OpenAiChat::parse_response(&body),
            Streamed::Events => OpenAiChat::parse_response(&answer.body()),
        }
    }
}

/// A Chat Completions answer as its stream's chunks build it up: the body a
/// call without streaming gets (the first choice's message, its finish
/// reason, the usage), so the same parser reads both.
#[derive(Debug, Default)]
struct ChatStream {
    content: Option<String>,
    refusal: Option<String>,
    /// By the call's index: id, name, arguments' text.
    calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// The model that answered, as its chunks name it.
    model: Option<String>,
}

impl ChatStream {
    fn chunk(&mut self, data: &str, on_delta: OnDelta<'_>) -> Result<Flow, ModelError> {
        if data.trim() == "[DONE]" {
            return Ok(Flow::Done);
        }
        let v = event_json(data)?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let kind = ["code", "type"]
                .iter()
                .find_map(|k| err.get(*k).and_then(Value::as_str))
                .unwrap_or_default();
            return Err(stream_error(kind, data));
        }
        if let Some(m) = v.get("model").and_then(Value::as_str) {
            self.model = Some(m.to_string());
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| {
            c.iter()
                .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
                .or(c.first())
        }) else {
            return Ok(Flow::More);
        };
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        let text = |k: &str| {
            delta
                .get(k)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
        };
        if let Some(t) = text("content") {
            self.content.get_or_insert_with(String::new).push_str(t);
            on_delta(Delta::Text {
                text: t.to_string(),
            });
        }
        if let Some(t) = text("refusal") {
            self.refusal.get_or_insert_with(String::new).push_str(t);
            on_delta(Delta::Text {
                text: t.to_string(),
            });
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .map_or(self.calls.len().saturating_sub(1), |i| i as usize);
            // An index far past the calls so far is a malformed chunk, not a
            // reason to allocate.
            if index > self.calls.len() {
                return Err(ModelError::Transient(format!(
                    "a chunk of the answer's stream skips to tool call {index}"
                )));
            }
            if index == self.calls.len() {
                self.calls.push(Default::default());
            }
            let f = call.get("function").unwrap_or(&Value::Null);
            let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            let (id, name) = (s(call, "id"), s(f, "name"));
            let args = s(f, "arguments").unwrap_or_default();
            let slot = &mut self.calls[index];
            if let Some(id) = id.as_ref().filter(|_| slot.0.is_empty()) {
                slot.0 = id.clone();
            }
            if let Some(name) = name.as_ref().filter(|_| slot.1.is_empty()) {
                slot.1 = name.clone();
            }
            slot.2.push_str(&args);
            on_delta(Delta::ToolCall {
                index,
                id,
                name,
                arguments: args,
            });
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(r.to_string());
        }
        Ok(Flow::More)
    }

    fn body(&self) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(self.content));
        if let Some(r) = &self.refusal {
            message.insert("refusal".into(), json!(r));
        }
        if !self.calls.is_empty() {
            let calls = self
                .calls
                .iter()
                .map(|(id, name, args)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        json!({
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        })
    }
}

/// A tool call whose arguments came as the text `raw`: parsed into `input`
/// (kept as a JSON string when it does not parse, so the model is told), and
/// the text kept as it came.
pub(super) fn tool_use(id: &str, name: &str, raw: &str) -> ResponseBlock {
    let input = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
    ResponseBlock::ToolUse {
        id: id.to_string(),
        name: name.to_string(),
        input,
        raw_input: Some(raw.to_string()),
    }
}

/// A tool call's arguments as text: the text received, else `input` as JSON.
pub(super) fn arguments(input: &Value, raw_input: &Option<String>) -> String {
    match raw_input {
        Some(raw) => raw.clone(),
        None => input.to_string(),
    }
}

/// A text rendering of a data block, for APIs with no place for one.
pub(super) fn data_text(value: &Value) -> String {
    value.to_string()
}

fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        }
    })
}

fn messages(messages: &[Message]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let mut text = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for block in &m.content {
            match block {
                ContentBlock::Text { text: t } => text.push(t.clone()),
                ContentBlock::Data { value } => text.push(data_text(value)),
                ContentBlock::ToolUse {
                    id,
                    name,
                    input,
                    raw_input,
                } => calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments(input, raw_input)},
                })),
                ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => results.push(json!({
                    "role": "tool",
                    "tool_call_id": tool_use_id,
                    "content": if *is_error { format!("Error: {content}") } else { content.clone() },
                })),
                ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => {}
            }
        }
        // Tool results answer the previous assistant message's calls, so
        // they come first.
        out.extend(results);
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        if m.role == Role::Assistant && text.is_empty() && calls.is_empty() {
            // Only another provider's reasoning: nothing this API takes.
        } else if m.role == Role::Assistant {
            let mut msg = Map::new();
            msg.insert("role".into(), json!(role));
            msg.insert(
                "content".into(),
                if text.is_empty() {
                    Value::Null
                } else {
                    json!(text.join("\n"))
                },
            );
            if !calls.is_empty() {
                msg.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(Value::Object(msg));
        } else if !text.is_empty() {
            out.push(json!({"role": role, "content": text.join("\n")}));
        }
    }
    out
}
