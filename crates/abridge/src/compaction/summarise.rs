//! The summariser: its trait, the request it gets, the transcript of a span with
//! per-block caps, and chunking of spans larger than its input budget.

use super::config::{PromptStyle, TokenCounter};
use crate::message::{Message, ModelRequest, ResponseBlock, Role, Usage};
use crate::model::{ModelClient, ModelError};
use crate::store::HistoryTurn;
pub use crate::text::{cap_block, truncate_chars};
use async_trait::async_trait;
use std::sync::Arc;

/// What every built-in prompt says about the transcript's markers, the
/// pinned facts and superseded values.
const COMMON_RULES: &str = "\
Rules that always hold:
- Keep identifiers, names, figures, dates, paths, URLs, e-mail addresses, error messages and \
key names exactly as written (\"1,250 EUR\" stays \"1,250 EUR\").
- When a value was changed (a new budget, another size, a new address), keep only the newest \
one as current and mark the older one as superseded; never present both as current.
- Constraints and rules the user stated (never, always, only, must, at most...) are copied \
verbatim, not paraphrased.
- \"[… N chars omitted …]\" inside a transcript entry marks text cut for display, not \
something the conversation said; do not mention it.
- Lines under \"## Pinned facts\" are facts that must survive: keep every one of them.
- Do not invent anything, do not add advice, do not continue the conversation or answer \
questions in it, do not comment on the summarising. Answer with the summary only, in the \
conversation's own language.";

/// Built-in prose rules: the first summary of a session.
pub const PROSE_RULES: &str = "\
You are compacting the earlier part of a long conversation so that it can go on within the \
model's context window. Your summary replaces those turns: anything you leave out is gone \
from the model's view for good.

Write dense plain prose, most critical first:
1. Critical identifiers and figures: every id, amount, date, name, address, path and key the \
conversation relies on, with what each one is.
2. The user's goal and every constraint or preference they stated (verbatim).
3. What is done, what is in progress, decisions taken and why (so nothing is asked twice), \
files and artifacts touched, errors met and how they were fixed, commitments the assistant \
made (prices quoted, delivery windows, promised next steps).
4. The current work and the next step, and what is still open.
";

/// Built-in prose rules: folding new turns into an existing summary.
pub const PROSE_UPDATE_RULES: &str = "\
You are updating the summary of a long conversation with the turns that came after it, so \
that it can go on within the model's context window. The new summary replaces both the old \
summary and those turns: anything you leave out is gone from the model's view for good.

Start from the summary so far and keep every fact in it, unless a newer turn changed it \
(then keep the newest value and mark the old one superseded). Move items that the new turns \
finished from in progress to done. Then add what the new turns brought, in dense plain prose, \
most critical first: identifiers and figures with what each one is; the goal and the user's \
constraints (verbatim); progress, decisions, files and artifacts, errors and fixes, \
commitments; the current work, the next step and what is still open.
";

/// Built-in structured rules: the first checkpoint of a session.
pub const STRUCTURED_RULES: &str = "\
You are compacting the earlier part of a long conversation into a structured checkpoint that \
the assistant will read instead of those turns. Use exactly this format, most critical first:

## Critical Context
- [Every id, amount, date, name, address, path and key needed to continue, each with what it \
is; \"(none)\" if none]

## Goal
[What the user is trying to accomplish]

## Constraints & Preferences
- [Each constraint or preference the user stated, verbatim, or \"(none)\"]

## Progress
### Done
- [x] [Completed work]
### In Progress
- [ ] [Current work]
### Blocked
- [Blockers, if any]

## Key Decisions
- **[Decision]**: [Rationale]

## Files & Artifacts
- [Files, documents, orders or other artifacts read, created or changed]

## Errors & Fixes
- [Error met]: [how it was fixed, or \"open\"]

## Current Work
[What was being done when the span ends]

## Next Steps
1. [What should happen next]

Keep each section short.
";

/// Built-in structured rules: updating an existing checkpoint.
pub const STRUCTURED_UPDATE_RULES: &str = "\
You are updating a structured checkpoint of a long conversation with the turns that came \
after it; the assistant will read the new checkpoint instead of both. Keep the checkpoint's \
format and every section (Critical Context; Goal; Constraints & Preferences; Progress with \
Done / In Progress / Blocked; Key Decisions; Files & Artifacts; Errors & Fixes; Current Work; \
Next Steps).

Keep every fact of the checkpoint so far unless a newer turn changed it (then keep the newest \
value in Critical Context and mark the old one superseded). Move items the new turns finished \
from In Progress to Done; add new decisions, files, errors and fixes; rewrite Current Work and \
Next Steps for where the conversation now stands. Keep each section short.
";

/// The rules for a style: its first variant, or (`update`) the one that folds
/// new turns into an existing summary; each followed by the rules every
/// built-in prompt shares. A custom prompt is used as it is for both.
pub fn rules_for(style: &PromptStyle, update: bool) -> std::borrow::Cow<'static, str> {
    let base = match (style, update) {
        (PromptStyle::Prose, false) => PROSE_RULES,
        (PromptStyle::Prose, true) => PROSE_UPDATE_RULES,
        (PromptStyle::Structured, false) => STRUCTURED_RULES,
        (PromptStyle::Structured, true) => STRUCTURED_UPDATE_RULES,
        (PromptStyle::Custom(p), _) => return std::borrow::Cow::Owned(p.clone()),
    };
    std::borrow::Cow::Owned(format!("{base}\n{COMMON_RULES}"))
}

/// One summariser call.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRequest {
    /// The rules (built-in style or the host's prompt), with the focus appended.
    pub rules: String,
    /// The running summary to fold in (the previous compaction's, or the one
    /// built from earlier chunks of this span).
    pub previous: Option<String>,
    /// The new span as a transcript, one entry per line group.
    pub transcript: String,
    /// A manual compaction's focus (also in `rules`): what to keep first.
    pub focus: Option<String>,
    /// Upper bound on the answer's length, chars.
    pub max_chars: usize,
}

impl SummaryRequest {
    /// The request as one user message body (what a model-backed summariser sends
    /// after the rules).
    pub fn body(&self) -> String {
        let mut out = String::new();
        if let Some(prev) = &self.previous {
            out.push_str(
                "## The summary so far (fold it into the new one: its facts must survive)\n\n",
            );
            out.push_str(prev);
            out.push_str("\n\n");
        }
        out.push_str("## The turns to compact\n\n");
        out.push_str(&self.transcript);
        out.push_str(&format!(
            "\n\nWrite the new summary now, at most {} characters.",
            self.max_chars
        ));
        out
    }
}

/// A summariser's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryResponse {
    /// The summary text.
    pub text: String,
    /// Usage, as reported.
    pub usage: Usage,
}

/// Writes summaries. May be called again for the same compaction after a crash
/// (the call is at-least-once; the completed row is exactly-once).
///
/// # Implementing it
/// Write `summarise` as an `async fn` under `#[abridge::async_trait]` (rustdoc
/// shows the boxed future that attribute expands it to):
///
/// ```
/// use abridge::compaction::{Summariser, SummaryRequest, SummaryResponse};
/// use abridge::ModelError;
///
/// /// Keeps the first 200 characters of the transcript.
/// struct Head;
///
/// #[abridge::async_trait]
/// impl Summariser for Head {
///     async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
///         Ok(SummaryResponse {
///             text: request.transcript.chars().take(200).collect(),
///             usage: Default::default(),
///         })
///     }
/// }
/// ```
#[async_trait]
pub trait Summariser: Send + Sync {
    /// Summarises one request.
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError>;

    /// The model name recorded on the row.
    fn model(&self) -> Option<String> {
        None
    }

    /// How many summaries this summariser makes well at once: the size of
    /// a compactor's pool of background workers unless
    /// [`Background::workers`](crate::compaction::Background::workers) sets
    /// it. Default [`DEFAULT_SUMMARY_WORKERS`]. A summariser behind a
    /// provider's tight rate limit says less.
    fn parallelism(&self) -> usize {
        DEFAULT_SUMMARY_WORKERS
    }
}

/// The default pool of background workers. Even the built-in offline
/// summariser, whose own work is CPU, spends most of a summary's time
/// waiting (for the store's reads and its write lock, for a turn on a busy
/// runtime): with as many workers as CPUs, 1,000 demo sessions waited 7x
/// longer for their summaries than with 16 (docs/benchmarks.md).
pub const DEFAULT_SUMMARY_WORKERS: usize = 16;

/// A summariser over a [`ModelClient`], with its own model name (a cheaper
/// summary model is allowed).
pub struct ModelSummariser {
    client: Arc<dyn ModelClient>,
    model: String,
    max_output_tokens: Option<u32>,
}

impl ModelSummariser {
    /// Summarises with `model` through `client`.
    pub fn new(client: Arc<dyn ModelClient>, model: impl Into<String>) -> ModelSummariser {
        ModelSummariser {
            client,
            model: model.into(),
            max_output_tokens: Some(2_048),
        }
    }
}

#[async_trait]
impl Summariser for ModelSummariser {
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        let req = ModelRequest {
            model: self.model.clone(),
            messages: std::sync::Arc::new(vec![
                Message::text(Role::System, request.rules.clone()),
                Message::text(Role::User, request.body()),
            ]),
            tools: Vec::new(),
            max_output_tokens: self.max_output_tokens,
        };
        let resp = self.client.complete(&req).await?;
        let text = resp
            .blocks
            .iter()
            .filter_map(|b| match b {
                ResponseBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        Ok(SummaryResponse {
            text,
            usage: resp.usage,
        })
    }

    fn model(&self) -> Option<String> {
        Some(self.model.clone())
    }
}

/// The span as transcript entries, in order: each user input, assistant text,
/// tool call with its arguments, and tool result, each capped.
pub fn transcript_entries(span: &[HistoryTurn], text_cap: usize, tool_cap: usize) -> Vec<String> {
    let mut out = Vec::new();
    for turn in span {
        let t = turn.idx;
        out.push(format!(
            "[turn {t}] user: {}",
            cap_block(&turn.input, text_cap)
        ));
        for step in &turn.steps {
            let Ok(resp) = serde_json::from_str::<crate::message::ModelResponse>(&step.response)
            else {
                continue;
            };
            let mut names = std::collections::HashMap::new();
            for block in &resp.blocks {
                match block {
                    ResponseBlock::Text { text } if !text.trim().is_empty() => out.push(format!(
                        "[turn {t}] assistant: {}",
                        cap_block(text, text_cap)
                    )),
                    ResponseBlock::ToolUse {
                        id, name, input, ..
                    } => {
                        names.insert(id.as_str(), name.as_str());
                        out.push(format!(
                            "[turn {t}] tool call {name}({})",
                            cap_block(&input.to_string(), text_cap)
                        ));
                    }
                    ResponseBlock::Data { value } => out.push(format!(
                        "[turn {t}] assistant data: {}",
                        cap_block(&value.to_string(), text_cap)
                    )),
                    _ => {}
                }
            }
            for (id, result, is_error) in &step.results {
                let name = names.get(id.as_str()).copied().unwrap_or("?");
                let kind = if *is_error {
                    "tool error"
                } else {
                    "tool result"
                };
                out.push(format!(
                    "[turn {t}] {kind} {name}: {}",
                    cap_block(result, tool_cap)
                ));
            }
        }
    }
    out
}

/// Splits entries into chunks that each fit `budget` tokens. An entry larger
/// than the budget on its own is capped to fit, so every chunk fits.
pub fn chunk_entries(entries: Vec<String>, budget: u64, counter: &dyn TokenCounter) -> Vec<String> {
    let budget = budget.max(16);
    let mut chunks = Vec::new();
    let mut cur = String::new();
    let mut cur_tokens = 0u64;
    for mut e in entries {
        let mut n = counter.count(&e) + 1;
        if n > budget {
            // Shrink until it fits; chars/4-like counters converge in a few rounds.
            let mut cap = e.chars().count();
            while n > budget && cap > 16 {
                cap = cap * budget as usize / n as usize;
                cap = cap.saturating_sub(cap / 10).max(16);
                e = cap_block(&e, cap);
                n = counter.count(&e) + 1;
            }
        }
        if cur_tokens + n > budget && !cur.is_empty() {
            chunks.push(std::mem::take(&mut cur));
            cur_tokens = 0;
        }
        if !cur.is_empty() {
            cur.push('\n');
        }
        cur.push_str(&e);
        cur_tokens += n;
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fit_the_budget_even_for_one_huge_entry() {
        let c = super::super::config::CharsPerFour;
        let entries = vec!["x".repeat(40_000), "small".into(), "y".repeat(3_000)];
        let chunks = chunk_entries(entries, 500, &c);
        for ch in &chunks {
            assert!(c.count(ch) <= 500, "{}", c.count(ch));
        }
        assert!(chunks.len() >= 2);
    }
}
