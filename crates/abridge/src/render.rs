//! The message renderer: a pure function from stored rows to the message array.
//!
//! No I/O and no clock: the same rows always give the same messages, and so the
//! same bytes and hash (G3). The store guarantees the rows a step read never
//! change afterwards (completed steps, finished invocations and completed
//! compactions are never updated), so rebuilding a step at any later time
//! reproduces what it sent.

use crate::error::Result;
use crate::message::{ContentBlock, Message, ModelResponse, ResponseBlock, Role};
use crate::store::{HistoryStep, HistoryTurn};

/// The text a tool result is sent as when it was left out to fit the context
/// window (context overflow inside one turn). Part of the stored format: it
/// names the call and the result's size; the result itself stays in the store.
pub fn elided_result_text(tool_use_id: &str, chars: usize) -> String {
    format!(
        "[result of tool call {tool_use_id} left out to fit the context window: \
         {chars} characters, kept in the store]"
    )
}

/// Replaces the tool results of `turn`'s steps with index below `elided_steps`
/// by [`elided_result_text`] (their error flag kept). What a step that
/// recorded `elided_steps` sent, for the turn it ran in.
pub fn elide_results(turn: &mut HistoryTurn, elided_steps: i64) {
    for step in turn.steps.iter_mut().filter(|s| s.idx < elided_steps) {
        for (id, result, _) in &mut step.results {
            *result = elided_result_text(id, result.chars().count());
        }
    }
}
use std::collections::HashMap;

pub use crate::render_format::RenderFormat;

impl RenderFormat {
    fn parse_response(self, json: &str) -> Result<ModelResponse> {
        let mut response: ModelResponse = serde_json::from_str(json)?;
        if self == RenderFormat::V1 {
            for block in &mut response.blocks {
                match block {
                    ResponseBlock::ToolUse { input: v, .. }
                    | ResponseBlock::Data { value: v }
                    | ResponseBlock::Other { value: v, .. } => crate::legacy::lossy_floats(v),
                    ResponseBlock::Text { .. }
                    | ResponseBlock::Thinking { .. }
                    | ResponseBlock::RedactedThinking { .. } => {}
                }
            }
        }
        Ok(response)
    }
}

/// The compaction summary a step reads, as rendered.
#[derive(Debug, Clone, Copy)]
pub struct SummaryView<'a> {
    /// The summary replaces turns `0..=up_to_turn_index`.
    pub up_to_turn_index: i64,
    /// The summary text.
    pub summary: &'a str,
}

/// The text of the summary message. Part of the stored format: changing it
/// would change the bytes of every step that read a compaction.
pub fn summary_text(view: SummaryView<'_>) -> String {
    format!(
        "[Summary of the conversation so far (turns 0 to {}), replacing those turns]\n\n{}",
        view.up_to_turn_index, view.summary
    )
}

/// The message that stands for the compacted turns, as every step that reads
/// the compaction sends it.
pub fn summary_message(view: SummaryView<'_>) -> Message {
    Message::text(Role::User, summary_text(view))
}

/// Builds the message array: the system prompt, the summary (if any), then each
/// turn's input, its steps' assistant blocks and their tool results in the order
/// the step produced them.
///
/// Blocks of unknown type ([`ResponseBlock::Other`]) stay in the store but are
/// not sent back; reasoning blocks ([`ResponseBlock::Thinking`],
/// [`ResponseBlock::RedactedThinking`]) are sent back in their place. A tool call with no recorded result (impossible for a completed
/// step) is rendered as an error result, so no tool call is ever orphaned.
pub fn build_messages(
    system_prompt: &str,
    summary: Option<SummaryView<'_>>,
    turns: &[HistoryTurn],
    format: RenderFormat,
) -> Result<Vec<Message>> {
    let mut out = Vec::with_capacity(2 + turns.len() * 3);
    out.push(Message::text(Role::System, system_prompt));
    if let Some(view) = summary {
        out.push(summary_message(view));
    }
    for turn in turns {
        render_turn(turn, &mut out, format)?;
    }
    Ok(out)
}

/// Appends one turn's messages: its input, then each completed step's assistant
/// blocks and tool results. `build_messages` is the system prompt, the summary,
/// and this for every turn, in order.
pub fn render_turn(turn: &HistoryTurn, out: &mut Vec<Message>, format: RenderFormat) -> Result<()> {
    out.push(Message::text(Role::User, turn.input.clone()));
    render_steps(&turn.steps, out, format)
}

/// Appends completed steps' messages: what `render_turn` adds after the input.
pub(crate) fn render_steps(
    steps: &[HistoryStep],
    out: &mut Vec<Message>,
    format: RenderFormat,
) -> Result<()> {
    for step in steps {
        let response = format.parse_response(&step.response)?;
        render_step(&response, &step.results, out);
    }
    Ok(())
}

fn render_step(
    response: &ModelResponse,
    results: &[(String, String, bool)],
    out: &mut Vec<Message>,
) {
    let mut content = Vec::with_capacity(response.blocks.len());
    let mut calls = Vec::new();
    for block in &response.blocks {
        match block {
            ResponseBlock::Text { text } => content.push(ContentBlock::Text { text: text.clone() }),
            ResponseBlock::ToolUse {
                id,
                name,
                input,
                raw_input,
            } => {
                calls.push(id.as_str());
                content.push(ContentBlock::ToolUse {
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    raw_input: raw_input.clone(),
                });
            }
            ResponseBlock::Data { value } => content.push(ContentBlock::Data {
                value: value.clone(),
            }),
            ResponseBlock::Thinking {
                thinking,
                signature,
            } => content.push(ContentBlock::Thinking {
                thinking: thinking.clone(),
                signature: signature.clone(),
            }),
            ResponseBlock::RedactedThinking { data } => {
                content.push(ContentBlock::RedactedThinking { data: data.clone() })
            }
            ResponseBlock::Other { .. } => {}
        }
    }
    if !content.is_empty() {
        out.push(Message {
            role: Role::Assistant,
            content,
        });
    }
    if calls.is_empty() {
        return;
    }
    let by_id: HashMap<&str, (&str, bool)> = results
        .iter()
        .map(|(id, r, e)| (id.as_str(), (r.as_str(), *e)))
        .collect();
    let blocks = calls
        .into_iter()
        .map(|id| {
            let (content, is_error) = by_id
                .get(id)
                .copied()
                .unwrap_or(("no result was recorded for this tool call", true));
            ContentBlock::ToolResult {
                tool_use_id: id.to_string(),
                content: content.to_string(),
                is_error,
            }
        })
        .collect();
    out.push(Message {
        role: Role::User,
        content: blocks,
    });
}
