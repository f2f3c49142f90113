//! Provider-neutral messages, model requests and responses.
//!
//! The message array a step sends is serialised once with `serde_json` and those
//! exact bytes are hashed (G3). Field order is fixed by these struct definitions
//! and JSON objects inside tool inputs are key-sorted (serde_json's default map),
//! so the same rows always give the same bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt; always the first message.
    System,
    /// The user, tool results, and the summary of compacted turns.
    User,
    /// The model.
    Assistant,
}

/// One block of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call the model made.
    ToolUse {
        /// The call's id, unique within its step.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments, as the model sent them.
        input: Value,
        /// The arguments as the exact JSON text the provider sent (OpenAI's
        /// argument string), where it sent text: an adapter sends these bytes
        /// back rather than re-serialising `input`. Absent from the stored
        /// bytes when None.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_input: Option<String>,
    },
    /// The result of a tool call.
    ToolResult {
        /// The `id` of the matching [`ContentBlock::ToolUse`].
        tool_use_id: String,
        /// The result text (JSON results are rendered as JSON text).
        content: String,
        /// True when the result is an error the model should see as such.
        is_error: bool,
    },
    /// Structured data the model returned (rendered back as it came).
    Data {
        /// The value.
        value: Value,
    },
    /// The model's reasoning, sent back as it came (Anthropic's extended
    /// thinking must precede the tool calls it led to, signature and all).
    Thinking {
        /// The reasoning text (possibly a provider's summary of it).
        thinking: String,
        /// The provider's signature over it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning the provider returned encrypted, sent back as it came.
    RedactedThinking {
        /// The opaque data.
        data: String,
    },
}

/// One message of the array sent to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The speaker.
    pub role: Role,
    /// The content blocks, in order.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A message with one text block.
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            content: vec![ContentBlock::Text { text: text.into() }],
        }
    }
}

/// A tool the model may call, as described to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its input.
    pub input_schema: Value,
}

/// What a [`crate::ModelClient`] is asked.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// The model name (the session's model, or the summariser's).
    pub model: String,
    /// The message array, system prompt first. For a step, exactly the array whose
    /// serialised bytes were hashed. Shared with the runner's kept context: a
    /// step's request costs no copy of the array (a client that keeps the
    /// request past its call makes the next step copy it once).
    pub messages: std::sync::Arc<Vec<Message>>,
    /// The tools offered.
    pub tools: Vec<ToolSpec>,
    /// An upper bound on output tokens, where the caller has one.
    pub max_output_tokens: Option<u32>,
}

/// One block of a model's response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call. `input` should be a JSON object; a client that cannot parse
    /// the provider's argument string passes it as a JSON string, and the model
    /// then sees an error result saying the arguments were malformed.
    ToolUse {
        /// The call id, unique within the response.
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments.
        input: Value,
        /// The arguments as the exact JSON text the provider sent, where it
        /// sent text (OpenAI): kept so they are sent back byte for byte.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw_input: Option<String>,
    },
    /// Structured output.
    Data {
        /// The value.
        value: Value,
    },
    /// The model's reasoning (Anthropic extended thinking), stored and sent
    /// back in place: a tool-using turn must return it before its calls.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// The provider's signature, which must come back unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning the provider returned encrypted; sent back unchanged.
    RedactedThinking {
        /// The opaque data.
        data: String,
    },
    /// A block of a type abridge does not know (a provider's new feature). It is
    /// stored with the response, so nothing is lost, but not sent back to the model.
    Other {
        /// The provider's block type.
        kind: String,
        /// The block as the provider sent it.
        value: Value,
    },
}

/// Token usage as the provider reported it; each figure is optional.
///
/// `input_tokens` is the whole prompt, cached or not (an adapter adds up a
/// provider's separate figures, as Anthropic reports them): it is the
/// context's measure. The cache figures are parts of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input (prompt) tokens, cached ones included.
    pub input_tokens: Option<u64>,
    /// Output (completion) tokens.
    pub output_tokens: Option<u64>,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
}

impl Usage {
    /// Input and output tokens, with no cache figures.
    pub fn new(input_tokens: Option<u64>, output_tokens: Option<u64>) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        }
    }
}

/// A model's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The blocks, in order.
    pub blocks: Vec<ResponseBlock>,
    /// Reported usage.
    #[serde(default)]
    pub usage: Usage,
    /// Why the model stopped, in the provider's words (`end_turn`,
    /// `tool_use`, `max_tokens`, `stop`, `length`, ...), where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The model that answered, as the provider named it (it may name a
    /// dated version of the model asked for), where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl ModelResponse {
    /// The tool calls, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.blocks.iter().filter_map(|b| match b {
            ResponseBlock::ToolUse {
                id, name, input, ..
            } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }

    /// The text blocks joined with newlines.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .blocks
            .iter()
            .filter_map(|b| match b {
                ResponseBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        parts.join("\n")
    }

    /// True when the response has nothing a conversation can continue from.
    pub fn is_empty(&self) -> bool {
        self.blocks.iter().all(|b| match b {
            ResponseBlock::Text { text } => text.trim().is_empty(),
            ResponseBlock::Other { .. }
            | ResponseBlock::Thinking { .. }
            | ResponseBlock::RedactedThinking { .. } => true,
            _ => false,
        })
    }
}

/// The deepest JSON value (arrays and objects inside each other) abridge keeps
/// in a tool call's arguments, a data block or a tool's result. serde_json
/// reads at most 128 levels back, and a stored value sits a few levels inside
/// the response and message arrays: this bound keeps everything stored
/// readable, and nothing deeper is ever walked recursively.
pub const MAX_JSON_DEPTH: usize = 64;

/// Nesting depth of `v` (a scalar is 0, `[]` is 1), found without recursion;
/// stops counting past `limit`.
pub fn json_depth(v: &serde_json::Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        let d = d + 1;
        deepest = deepest.max(d);
        if deepest > limit {
            return deepest;
        }
        stack.extend(children.map(|c| (c, d)));
    }
    deepest
}

/// Drops a JSON value of any depth without recursion (a derived drop of a
/// value nested 100,000 levels overflows the stack).
pub fn drop_deep(v: Value) {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Array(a) => stack.extend(a),
            Value::Object(m) => stack.extend(m.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// Replaces a value nested deeper than [`MAX_JSON_DEPTH`] with a string saying
/// so (dropping the deep value without recursion). Returns true when it did.
pub(crate) fn cap_depth(v: &mut Value, what: &str) -> bool {
    if json_depth(v, MAX_JSON_DEPTH) <= MAX_JSON_DEPTH {
        return false;
    }
    let deep = std::mem::replace(
        v,
        Value::String(format!(
            "{what} nested deeper than {MAX_JSON_DEPTH} levels were not kept"
        )),
    );
    drop_deep(deep);
    true
}

impl ModelResponse {
    /// Makes the response storable and readable back: every JSON value in it
    /// nested deeper than [`MAX_JSON_DEPTH`] becomes a string saying so, so a
    /// tool call with such arguments gets an error result the model sees.
    /// Returns how many values were replaced.
    pub fn cap_depth(&mut self) -> usize {
        let mut n = 0;
        for block in &mut self.blocks {
            let capped = match block {
                ResponseBlock::ToolUse { input, .. } => cap_depth(input, "arguments"),
                ResponseBlock::Data { value } => cap_depth(value, "data"),
                ResponseBlock::Other { value, .. } => cap_depth(value, "a block"),
                ResponseBlock::Text { .. }
                | ResponseBlock::Thinking { .. }
                | ResponseBlock::RedactedThinking { .. } => false,
            };
            n += capped as usize;
        }
        n
    }
}

/// Serialises a message array to the exact bytes a step hashes.
pub fn to_bytes(messages: &[Message]) -> Vec<u8> {
    // Serialising these types cannot fail: every map key is a string.
    serde_json::to_vec(messages).expect("messages serialise")
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of a digest.
pub(crate) fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(digest.len() * 2);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}
