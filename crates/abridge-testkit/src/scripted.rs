//! Pieces the workloads' scripted models share: what the last message
//! says, and the two answers they give (a sentence, or one tool call).

use abridge::{ModelRequest, ModelResponse, ResponseBlock, Usage};
use serde_json::Value;

/// The last message's content as JSON text (what a scripted model reads to
/// choose its answer).
pub fn last_content(req: &ModelRequest) -> String {
    req.messages
        .last()
        .map(|m| serde_json::to_string(&m.content).unwrap_or_default())
        .unwrap_or_default()
}

/// An answer in one sentence.
pub fn text(t: impl Into<String>) -> ModelResponse {
    ModelResponse {
        blocks: vec![ResponseBlock::Text { text: t.into() }],
        usage: Usage::default(),
        ..Default::default()
    }
}

/// An answer that calls `name` once with `input`.
pub fn tool_use(id: impl Into<String>, name: &str, input: Value) -> ModelResponse {
    ModelResponse {
        blocks: vec![ResponseBlock::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
            raw_input: None,
        }],
        usage: Usage::default(),
        ..Default::default()
    }
}

/// The digits right after `marker` in `text`, if any ("batch 12" → "12").
pub fn number_after<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    text.split(marker)
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .filter(|n| !n.is_empty())
}
