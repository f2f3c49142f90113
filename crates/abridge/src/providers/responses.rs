//! OpenAI's Responses API.

use super::http::{event_json, stream_error, Flow, Http, HttpOptions, Streamed};
use super::openai::{arguments, data_text, tool_use};
use super::{malformed, ApiKey};
use crate::message::{ContentBlock, ModelRequest, ModelResponse, ResponseBlock, Role, Usage};
use crate::model::{Delta, ModelClient, ModelError, OnDelta};
use serde_json::{json, Value};

/// A [`ModelClient`] for the Responses API (`POST {base}/responses`).
///
/// Stateless: every request carries the whole input (`store: false`), so the
/// messages sent are exactly abridge's, as replay rebuilds them. Mapping: the
/// system prompt is the `instructions`; tool calls are `function_call` items
/// (arguments sent back as the exact text received) and results
/// `function_call_output` items; output items of other types (reasoning) are
/// stored as [`ResponseBlock::Other`] and not sent back. A summary made by
/// [`super::OpenAiCompaction`] is sent as its items. Usage:
/// `input_tokens` (cached ones included), `output_tokens`,
/// `input_tokens_details.cached_tokens` as cache reads. The stop reason is
/// `incomplete_details.reason` when the response is incomplete, else its
/// `status`.
#[derive(Debug, Clone)]
pub struct OpenAiResponses {
    http: Http,
}

impl OpenAiResponses {
    /// A client at `options.base_url` sending `key` as a bearer token.
    pub fn new(options: HttpOptions, key: Option<ApiKey>) -> crate::Result<OpenAiResponses> {
        Ok(OpenAiResponses {
            http: Http::bearer(&options, key.as_ref())?,
        })
    }

    /// OpenAI with the key in `OPENAI_API_KEY`, at `OPENAI_BASE_URL` when set.
    pub fn from_env() -> crate::Result<OpenAiResponses> {
        let (options, key) = super::openai_env()?;
        OpenAiResponses::new(options, Some(key))
    }

    /// The JSON body sent for `request`.
    pub fn request_body(request: &ModelRequest) -> Value {
        let mut instructions = Vec::new();
        let mut input = Vec::new();
        for m in request.messages.iter() {
            let (role, text_type) = match m.role {
                Role::System => ("system", "input_text"),
                Role::User => ("user", "input_text"),
                Role::Assistant => ("assistant", "output_text"),
            };
            let mut parts = Vec::new();
            let flush = |parts: &mut Vec<Value>, input: &mut Vec<Value>| {
                if !parts.is_empty() {
                    input.push(json!({"role": role, "content": std::mem::take(parts)}));
                }
            };
            for block in &m.content {
                // A summary made by OpenAI's compaction goes back as its items.
                if let ContentBlock::Text { text } = block {
                    if let Some(summary) = native_summary(m.role, text) {
                        flush(&mut parts, &mut input);
                        super::compact::push_summary(summary, &mut input);
                        continue;
                    }
                }
                let text = match block {
                    ContentBlock::Text { text } => Some(text.clone()),
                    ContentBlock::Data { value } => Some(data_text(value)),
                    _ => None,
                };
                if let Some(text) = text {
                    if m.role == Role::System {
                        instructions.push(text);
                    } else {
                        parts.push(json!({"type": text_type, "text": text}));
                    }
                    continue;
                }
                flush(&mut parts, &mut input);
                match block {
                    ContentBlock::ToolUse {
                        id,
                        name,
                        input: args,
                        raw_input,
                    } => input.push(json!({
                        "type": "function_call",
                        "call_id": id,
                        "name": name,
                        "arguments": arguments(args, raw_input),
                    })),
                    ContentBlock::ToolResult {
                        tool_use_id,
                        content,
                        is_error,
                    } => input.push(json!({
                        "type": "function_call_output",
                        "call_id": tool_use_id,
                        "output": if *is_error { format!("Error: {content}") } else { content.clone() },
                    })),
                    _ => {}
                }
            }
            flush(&mut parts, &mut input);
        }
        let mut body = json!({
            "model": request.model,
            "input": input,
            "store": false,
        });
        if !instructions.is_empty() {
            body["instructions"] = json!(instructions.join("\n"));
        }
        if !request.tools.is_empty() {
            body["tools"] = Value::Array(
                request
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "function",
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.input_schema,
                        })
                    })
                    .collect(),
            );
        }
        if let Some(n) = request.max_output_tokens {
            body["max_output_tokens"] = json!(n);
        }
        body
    }

    /// The response in `body`, an answer of the API.
    pub fn parse_response(body: &Value) -> Result<ModelResponse, ModelError> {
        let output = body
            .get("output")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed("no output", body))?;
        let mut blocks = Vec::new();
        for item in output {
            let kind = item.get("type").and_then(Value::as_str).unwrap_or_default();
            match kind {
                "message" => {
                    for part in item
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let text = part
                            .get("text")
                            .or_else(|| part.get("refusal"))
                            .and_then(Value::as_str);
                        if let Some(text) = text.filter(|t| !t.is_empty()) {
                            blocks.push(ResponseBlock::Text {
                                text: text.to_string(),
                            });
                        }
                    }
                }
                "function_call" => blocks.push(tool_use(
                    item.get("call_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    item.get("name").and_then(Value::as_str).unwrap_or_default(),
                    item.get("arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}"),
                )),
                other => blocks.push(ResponseBlock::Other {
                    kind: other.to_string(),
                    value: item.clone(),
                }),
            }
        }
        let usage = body.get("usage").unwrap_or(&Value::Null);
        let stop = body
            .pointer("/incomplete_details/reason")
            .or_else(|| body.get("status"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(ModelResponse {
            blocks,
            usage: Usage {
                input_tokens: usage.get("input_tokens").and_then(Value::as_u64),
                output_tokens: usage.get("output_tokens").and_then(Value::as_u64),
                cache_read_tokens: usage
                    .pointer("/input_tokens_details/cached_tokens")
                    .and_then(Value::as_u64),
                cache_write_tokens: None,
            },
            stop_reason: stop,
            model: body
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

/// The summary in a summary message whose summary was made by
/// [`super::OpenAiCompaction`].
fn native_summary(role: Role, text: &str) -> Option<&str> {
    if role != Role::User || !text.starts_with("[Summary of the conversation so far") {
        return None;
    }
    let (_, summary) = text.split_once("\n\n")?;
    super::compaction_items(summary).map(|_| summary)
}

#[async_trait::async_trait]
impl ModelClient for OpenAiResponses {
    fn provider_name(&self) -> Option<&str> {
        Some("openai")
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let body = OpenAiResponses::request_body(request);
        let answer = self.http.post("/responses", &body).await?;
        OpenAiResponses::parse_response(&answer)
    }

    /// Streams with `stream: true`, to `response.completed` (or
    /// `response.incomplete`), whose response is the answer whole.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        on_delta: OnDelta<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = OpenAiResponses::request_body(request);
        body["stream"] = json!(true);
        let mut answer = ResponseStream::default();
        let streamed = self
            .http
            .post_stream("/responses", &body, &mut |_, data| {
                answer.event(data, on_delta)
            })
            .await?;
        match streamed {
            Streamed::Whole(body) => OpenAiResponses::parse_response(&body),
            Streamed::Events => OpenAiResponses::parse_response(&answer.response),
        }
    }
}

/// A Responses answer as its stream's events tell it: pieces as
/// [`Delta`]s, and the response whole from the event that ends the stream
/// (the same object a call without streaming gets).
#[derive(Debug, Default)]
struct ResponseStream {
    response: Value,
    /// A function call's position among the answer's calls, by output index.
    calls: Vec<(u64, usize)>,
}

impl ResponseStream {
    fn event(&mut self, data: &str, on_delta: OnDelta<'_>) -> Result<Flow, ModelError> {
        let v = event_json(data)?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default();
        match s("type") {
            "response.output_text.delta" | "response.refusal.delta" => on_delta(Delta::Text {
                text: s("delta").to_string(),
            }),
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                on_delta(Delta::Thinking {
                    text: s("delta").to_string(),
                })
            }
            "response.output_item.added" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    let at = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
                    let index = self.calls.len();
                    self.calls.push((at, index));
                    let t = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_string);
                    on_delta(Delta::ToolCall {
                        index,
                        id: t("call_id"),
                        name: t("name"),
                        arguments: String::new(),
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                let at = v.get("output_index").and_then(Value::as_u64).unwrap_or(0);
                if let Some(&(_, index)) = self.calls.iter().find(|(o, _)| *o == at) {
                    on_delta(Delta::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments: s("delta").to_string(),
                    });
                }
            }
            "response.completed" | "response.incomplete" => {
                self.response = v
                    .get("response")
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| malformed("the last event without its response", &v))?;
                return Ok(Flow::Done);
            }
            "response.failed" => {
                let code = v
                    .pointer("/response/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let body = v.pointer("/response").unwrap_or(&v).to_string();
                return Err(stream_error(code, &body));
            }
            "error" => {
                let code = ["code", "type"]
                    .iter()
                    .find_map(|k| v.get(*k).and_then(Value::as_str))
                    .unwrap_or_default();
                return Err(stream_error(code, data));
            }
            _ => {}
        }
        Ok(Flow::More)
    }
}
