//! OpenAI's own compaction (`POST /responses/compact`) as a summariser.

use super::http::{Http, HttpOptions};
use super::{malformed, ApiKey};
use crate::compaction::{Summariser, SummaryRequest, SummaryResponse};
use crate::message::Usage;
use crate::model::ModelError;
use serde_json::{json, Value};

/// How a summary made by [`OpenAiCompaction`] begins: the provider's output
/// items follow as a JSON array (then, where the pinned-facts guard added
/// them, the facts as text).
pub const OPENAI_COMPACTION_MARKER: &str = "[openai compaction items]\n";

/// A [`Summariser`] that has OpenAI compact the span on its side
/// (`/responses/compact`) and returns its output items (an opaque, encrypted
/// `compaction` item, and any items it keeps) as the summary.
///
/// abridge claims the row exactly once and stores the items as the row's
/// summary, behind [`OPENAI_COMPACTION_MARKER`]; every step that reads it
/// sends them back byte for byte. Only [`super::OpenAiResponses`] sends
/// them as items (other adapters would send the JSON as text): pair it with
/// that client. The items must fit `max_summary_chars` (a larger answer is
/// a failed attempt, never a cut one); pinned facts are added after them as
/// text, which the Responses client sends as a user message.
#[derive(Debug, Clone)]
pub struct OpenAiCompaction {
    http: Http,
    model: String,
}

impl OpenAiCompaction {
    /// Compacts with `model` at `options.base_url`.
    pub fn new(
        options: HttpOptions,
        key: Option<ApiKey>,
        model: impl Into<String>,
    ) -> crate::Result<OpenAiCompaction> {
        Ok(OpenAiCompaction {
            http: Http::bearer(&options, key.as_ref())?,
            model: model.into(),
        })
    }

    /// OpenAI with the key in `OPENAI_API_KEY`, at `OPENAI_BASE_URL` when set.
    pub fn from_env(model: impl Into<String>) -> crate::Result<OpenAiCompaction> {
        let (options, key) = super::openai_env()?;
        OpenAiCompaction::new(options, Some(key), model)
    }

    /// The JSON body sent for `request`: the previous summary's items (or
    /// its text) and the span's transcript as input, the rules as
    /// instructions.
    pub fn request_body(&self, request: &SummaryRequest) -> Value {
        let mut input = Vec::new();
        if let Some(prev) = &request.previous {
            push_summary(prev, &mut input);
        }
        if !request.transcript.is_empty() {
            input.push(user_text(&format!(
                "## The turns to compact\n\n{}",
                request.transcript
            )));
        }
        json!({
            "model": self.model,
            "input": input,
            "instructions": request.rules,
        })
    }
}

fn user_text(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The items of a summary made by [`OpenAiCompaction`], and the text after
/// them; None for any other summary.
pub fn compaction_items(summary: &str) -> Option<(Vec<Value>, &str)> {
    let rest = summary.strip_prefix(OPENAI_COMPACTION_MARKER)?;
    let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Vec<Value>>();
    let items = stream.next()?.ok()?;
    let after = rest[stream.byte_offset()..].trim();
    Some((items, after))
}

/// Appends a summary as Responses input: its items, then any text after
/// them; a summary of another kind as text.
pub(super) fn push_summary(summary: &str, input: &mut Vec<Value>) {
    match compaction_items(summary) {
        Some((items, after)) => {
            input.extend(items);
            if !after.is_empty() {
                input.push(user_text(after));
            }
        }
        None => input.push(user_text(summary)),
    }
}

#[async_trait::async_trait]
impl Summariser for OpenAiCompaction {
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        // Asked to rewrite a summary with nothing new (the pinned-facts
        // guard): opaque items cannot be rewritten; the facts are added
        // after them as text.
        if request.transcript.is_empty() {
            if let Some(prev) = request
                .previous
                .as_ref()
                .filter(|p| compaction_items(p).is_some())
            {
                return Ok(SummaryResponse {
                    text: prev.clone(),
                    usage: Usage::default(),
                });
            }
        }
        let body = self.request_body(request);
        let answer = self.http.post("/responses/compact", &body).await?;
        let items = answer
            .get("output")
            .and_then(Value::as_array)
            .filter(|items| !items.is_empty())
            .ok_or_else(|| malformed("no output items", &answer))?;
        let text = format!(
            "{OPENAI_COMPACTION_MARKER}{}",
            serde_json::to_string(items).expect("JSON values serialise")
        );
        let chars = text.chars().count();
        if chars > request.max_chars {
            return Err(ModelError::Permanent(format!(
                "the compaction items are {chars} characters, more than the summary's limit of {} \
                 (raise max_summary_chars)",
                request.max_chars
            )));
        }
        let usage = answer.get("usage").unwrap_or(&Value::Null);
        Ok(SummaryResponse {
            text,
            usage: Usage::new(
                usage.get("input_tokens").and_then(Value::as_u64),
                usage.get("output_tokens").and_then(Value::as_u64),
            ),
        })
    }

    fn model(&self) -> Option<String> {
        Some(self.model.clone())
    }
}
