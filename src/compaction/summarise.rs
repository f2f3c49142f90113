//! The summariser: its trait, the request it gets, the transcript of a span with
//! per-block caps, and chunking of spans larger than its input budget.

use super::config::{PromptStyle, TokenCounter};
use crate::message::{Message, ModelRequest, ResponseBlock, Role, Usage};
use crate::model::{ModelClient, ModelError};
use crate::store::HistoryTurn;
use async_trait::async_trait;
use std::sync::Arc;
use unicode_segmentation::{GraphemeCursor, UnicodeSegmentation};

/// Built-in prose rules.
pub const PROSE_RULES: &str = "\
You are compacting the earlier part of a long conversation so that it can go on \
within the model's context window. Your summary replaces those turns: anything you \
leave out is gone from the model's view for good.

Write dense plain prose that keeps everything a later turn may rely on:
- every fact the user stated: names, sizes, budgets, addresses, postal codes, order \
numbers, product choices, dates and quantities, verbatim where short;
- every figure and identifier from tool results (ids, amounts, statuses);
- every commitment the assistant made (prices quoted, delivery windows, promised \
next steps) and every decision already taken, so nothing is asked twice;
- what was asked and is still open.

Do not invent anything, do not add advice, do not comment on the summarising. \
Answer with the summary text only, in the conversation's own language.";

/// Built-in structured rules.
pub const STRUCTURED_RULES: &str = "\
You are compacting the earlier part of a long conversation into a structured \
checkpoint that the assistant will read instead of those turns. Do not continue the \
conversation and do not answer questions inside it. Use exactly this format:

## Goal
[What the user is trying to accomplish]

## Constraints & Preferences
- [Constraints or preferences the user stated, or \"(none)\"]

## Progress
### Done
- [x] [Completed work]
### In Progress
- [ ] [Current work]
### Blocked
- [Blockers, if any]

## Key Decisions
- **[Decision]**: [Rationale]

## Next Steps
1. [What should happen next]

## Critical Context
- [Data, names, ids and references needed to continue, or \"(none)\"]

Keep each section short. Preserve exact identifiers, names, figures and error messages.";

/// The rules for a style.
pub fn rules_for(style: &PromptStyle) -> &str {
    match style {
        PromptStyle::Prose => PROSE_RULES,
        PromptStyle::Structured => STRUCTURED_RULES,
        PromptStyle::Custom(p) => p,
    }
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
#[async_trait]
pub trait Summariser: Send + Sync {
    /// Summarises one request.
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError>;

    /// The model name recorded on the row.
    fn model(&self) -> Option<String> {
        None
    }
}

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
            messages: vec![
                Message::text(Role::System, request.rules.clone()),
                Message::text(Role::User, request.body()),
            ],
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

/// Byte offset of the end of the longest run of whole grapheme clusters (what
/// a reader sees as one character: a letter with its marks, a Devanagari
/// syllable's vowel sign, a flag, a ZWJ emoji sequence) from the start of `s`
/// that holds at most `n_chars` chars.
///
/// Found at the cut itself: the `n_chars`-th char boundary, moved back to the
/// cluster boundary at or before it (the text before the cut is not walked
/// cluster by cluster).
fn head_cut(s: &str, n_chars: usize) -> usize {
    let idx = s.char_indices().nth(n_chars).map_or(s.len(), |(i, _)| i);
    let mut cursor = GraphemeCursor::new(idx, s.len(), true);
    match cursor.is_boundary(s, 0) {
        Ok(true) => idx,
        Ok(false) => match cursor.prev_boundary(s, 0) {
            Ok(Some(b)) => b,
            Ok(None) => 0,
            Err(_) => head_cut_walking(s, n_chars),
        },
        Err(_) => head_cut_walking(s, n_chars),
    }
}

/// Byte offset of the start of the longest run of whole grapheme clusters at
/// the end of `s` that holds at most `n_chars` chars (found at the cut, as
/// [`head_cut`]).
fn tail_cut(s: &str, n_chars: usize) -> usize {
    let idx = if n_chars == 0 {
        s.len()
    } else {
        s.char_indices().nth_back(n_chars - 1).map_or(0, |(i, _)| i)
    };
    let mut cursor = GraphemeCursor::new(idx, s.len(), true);
    match cursor.is_boundary(s, 0) {
        Ok(true) => idx,
        Ok(false) => match cursor.next_boundary(s, 0) {
            Ok(Some(b)) => b,
            Ok(None) => s.len(),
            Err(_) => tail_cut_walking(s, n_chars),
        },
        Err(_) => tail_cut_walking(s, n_chars),
    }
}

/// [`head_cut`] by walking the clusters from the start (the reference the
/// fast path is tested against).
fn head_cut_walking(s: &str, n_chars: usize) -> usize {
    let (mut chars, mut end) = (0, 0);
    for (i, g) in s.grapheme_indices(true) {
        chars += g.chars().count();
        if chars > n_chars {
            break;
        }
        end = i + g.len();
    }
    end
}

/// [`tail_cut`] by walking the clusters from the end.
fn tail_cut_walking(s: &str, n_chars: usize) -> usize {
    let (mut chars, mut start) = (0, s.len());
    for (i, g) in s.grapheme_indices(true).rev() {
        chars += g.chars().count();
        if chars > n_chars {
            break;
        }
        start = i;
    }
    start
}

/// Caps `s` at `cap` chars: keeps 75% head and 25% tail with a marker between,
/// cutting only between grapheme clusters (never inside a UTF-8 sequence, nor
/// between a char and its marks or vowel signs, nor inside a flag or an emoji
/// sequence).
pub fn cap_block(s: &str, cap: usize) -> String {
    let total = s.chars().count();
    if total <= cap {
        return s.to_string();
    }
    let head_n = cap * 3 / 4;
    let tail_n = cap - head_n;
    let h = head_cut(s, head_n);
    let t = tail_cut(s, tail_n).max(h);
    let omitted = s[h..t].chars().count();
    format!("{}\n[… {omitted} chars omitted …]\n{}", &s[..h], &s[t..])
}

/// Cuts `s` to at most `max` chars (head only), between grapheme clusters.
pub fn truncate_chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    s[..head_cut(s, max)].to_string()
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
                    ResponseBlock::ToolUse { id, name, input } => {
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

    fn parts(capped: &str) -> (&str, &str) {
        let (h, rest) = capped.split_once("\n[… ").expect("marker");
        let (_, t) = rest.split_once(" chars omitted …]\n").expect("marker end");
        (h, t)
    }

    #[test]
    fn short_blocks_are_untouched() {
        assert_eq!(cap_block("héllo", 5), "héllo");
    }

    #[test]
    fn cap_keeps_three_quarters_head_one_quarter_tail() {
        let s: String = ('a'..='z').cycle().take(1000).collect();
        let c = cap_block(&s, 100);
        let (h, t) = parts(&c);
        assert_eq!((h.chars().count(), t.chars().count()), (75, 25));
        assert!(s.starts_with(h) && s.ends_with(t));
        assert!(c.contains("[… 900 chars omitted …]"));
    }

    #[test]
    fn cap_on_cjk_and_emoji_cuts_on_char_boundaries() {
        let s = "漢字🙂".repeat(500);
        for cap in [1, 2, 7, 100, 333] {
            let c = cap_block(&s, cap);
            let (h, t) = parts(&c);
            assert!(s.starts_with(h) && s.ends_with(t));
            assert!(h.chars().count() + t.chars().count() <= cap);
        }
    }

    #[test]
    fn cap_never_separates_combining_marks_or_joined_emoji() {
        // e + combining acute, repeated: a cut after an odd number of chars would
        // leave a bare accent; the cut moves back instead.
        let s = "e\u{301}".repeat(300);
        let c = cap_block(&s, 101);
        let (h, t) = parts(&c);
        assert!(h.ends_with('\u{301}'), "head ends on a whole grapheme");
        assert!(t.starts_with('e'), "tail starts on a base char");
        // A family emoji is one ZWJ sequence: never cut inside it.
        let fam = "👩\u{200D}👩\u{200D}👧".repeat(100);
        let c = cap_block(&fam, 50);
        let (h, t) = parts(&c);
        assert!(h.ends_with('👧') && t.starts_with('👩'), "{h:?} | {t:?}");
    }

    /// Regression: a Devanagari vowel sign or virama, and the second half of a
    /// flag, were cut from the char before them.
    #[test]
    fn cap_never_splits_devanagari_syllables_or_flags() {
        // न म स ् त े: 6 chars; the conjunct स्ते (with its virama and vowel
        // sign) is one cluster.
        let hindi = "नमस्ते".repeat(200);
        for cap in 1..40 {
            let c = cap_block(&hindi, cap);
            let (h, t) = parts(&c);
            assert!(
                !h.ends_with('\u{94D}') || h.is_empty(),
                "{cap}: head ends on a virama"
            );
            for bad in ['\u{947}', '\u{94D}'] {
                assert!(!t.starts_with(bad), "{cap}: tail starts on {bad:?}");
            }
            assert!(h.chars().count() + t.chars().count() <= cap);
            assert!(hindi.starts_with(h) && hindi.ends_with(t));
        }
        assert_eq!(truncate_chars("नमस्ते", 5), "नम");
        assert_eq!(truncate_chars("नमस्ते", 6), "नमस्ते");
        assert_eq!(truncate_chars("नमस्ते!", 6), "नमस्ते");
        let flags = "🇫🇷🇯🇵".repeat(50);
        for cap in 1..30 {
            let c = cap_block(&flags, cap);
            let (h, t) = parts(&c);
            assert_eq!(h.chars().count() % 2, 0, "{cap}: a flag cut in the head");
            assert_eq!(t.chars().count() % 2, 0, "{cap}: a flag cut in the tail");
        }
        assert_eq!(truncate_chars("🇫🇷🇯🇵", 3), "🇫🇷");
    }

    /// The cut found at the cut point equals the one found by walking every
    /// cluster, on mixed scripts and at every length.
    #[test]
    fn cutting_at_the_cut_point_equals_walking_the_clusters() {
        let texts = [
            "plain ascii text, with\r\nCRLF line ends\r\n".repeat(3),
            "नमस्ते दुनिया 🇫🇷🇯🇵 e\u{301}te\u{301} 👩\u{200D}👩\u{200D}👧 漢字 ".repeat(4),
            "\u{301}\u{301}leading marks, then 🏳️‍🌈 and 👍🏽".to_string(),
            String::new(),
        ];
        for t in &texts {
            let n = t.chars().count();
            for k in 0..=n + 1 {
                assert_eq!(
                    super::head_cut(t, k),
                    super::head_cut_walking(t, k),
                    "head {k} of {t:?}"
                );
                assert_eq!(
                    super::tail_cut(t, k),
                    super::tail_cut_walking(t, k),
                    "tail {k} of {t:?}"
                );
            }
        }
    }

    #[test]
    fn truncate_is_a_char_prefix() {
        let s = "a🙂b漢c";
        assert_eq!(truncate_chars(s, 2), "a🙂");
        assert_eq!(truncate_chars(s, 10), s);
        assert_eq!(truncate_chars("e\u{301}e\u{301}", 3), "e\u{301}");
    }

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
