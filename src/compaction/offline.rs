//! The built-in offline summariser: deterministic, extractive, no model needed.
//!
//! It keeps, from the span: every number and identifier, the user's stated facts,
//! each tool call's name and the head of its result, the assistant's
//! commitments, and what is still open; and it folds the previous summary in
//! section by section, so a fact from the first turn survives every
//! re-compaction. The same request always gives the same summary, which makes it
//! the default wherever no model endpoint is configured, and a real choice for
//! desktop apps and tests.

use super::summarise::{truncate_chars, Summariser, SummaryRequest, SummaryResponse};
use crate::message::Usage;
use crate::model::ModelError;
use async_trait::async_trait;

const SECTIONS: [&str; 5] = [
    "Figures and ids",
    "User facts",
    "Tool results",
    "Commitments",
    "Open",
];
/// Most entries kept per section (newest kept); ids are kept oldest first.
const PER_SECTION: [usize; 5] = [200, 12, 8, 8, 6];

/// The offline extractive summariser.
#[derive(Debug, Clone, Default)]
pub struct ExtractiveSummariser;

fn is_id_like(w: &str) -> bool {
    // Times of day and timestamps are noise next to order numbers and amounts.
    w.chars().any(|c| c.is_ascii_digit())
        && w.chars().count() >= 2
        && w.len() <= 40
        && !w.contains(':')
}

/// The words of `s`: split on whitespace and punctuation, except a comma
/// between two digits (a thousands separator: "1,250" is one figure).
fn words(s: &str) -> impl Iterator<Item = &str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut prev: Option<char> = None;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        let separator = c == ','
            && prev.is_some_and(|p| p.is_ascii_digit())
            && next.is_some_and(|n| n.is_ascii_digit());
        let split = !separator
            && (c.is_whitespace()
                || matches!(c, ',' | ';' | '"' | '(' | ')' | '{' | '}' | '[' | ']'));
        if split {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
        prev = Some(c);
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(|w| w.trim_matches(|c: char| matches!(c, '.' | ':' | '!' | '?' | '\'')))
        .filter(|w| !w.is_empty())
}

fn parse_previous(prev: &str) -> [Vec<String>; 5] {
    let mut out: [Vec<String>; 5] = Default::default();
    let mut cur: Option<usize> = None;
    for line in prev.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            cur = SECTIONS.iter().position(|s| *s == h.trim());
            continue;
        }
        let Some(i) = cur else { continue };
        if i == 0 {
            out[0].extend(
                line.split(", ")
                    .filter(|w| !w.is_empty())
                    .map(str::to_string),
            );
        } else if let Some(item) = line.strip_prefix("- ") {
            out[i].push(item.to_string());
        }
    }
    out
}

fn commitment(text: &str) -> bool {
    let l = text.to_lowercase();
    [
        "i will",
        "i'll",
        "we will",
        "we'll",
        "i have placed",
        "confirmed",
        "quoted",
        "promise",
        "scheduled",
    ]
    .iter()
    .any(|k| l.contains(k))
}

/// Builds the summary text from a request (pure).
pub fn extract(request: &SummaryRequest) -> String {
    let mut sec = request
        .previous
        .as_deref()
        .map(parse_previous)
        .unwrap_or_default();
    let mut open_now: Vec<String> = Vec::new();
    for line in request.transcript.lines() {
        let Some((tag, body)) = line.split_once("] ") else {
            continue;
        };
        let tag = format!("{tag}]");
        for w in words(body) {
            if is_id_like(w) && !sec[0].iter().any(|x| x == w) {
                sec[0].push(w.to_string());
            }
        }
        let head = |s: &str, n| truncate_chars(s.trim(), n);
        if let Some(t) = body.strip_prefix("user: ") {
            sec[1].push(format!("{tag} {}", head(t, 160)));
            if t.trim_end().ends_with('?') {
                open_now.push(format!("{tag} {}", head(t, 120)));
            }
        } else if let Some(t) = body.strip_prefix("tool result ") {
            sec[2].push(format!("{tag} {}", head(t, 100)));
        } else if let Some(t) = body.strip_prefix("tool error ") {
            sec[2].push(format!("{tag} error {}", head(t, 120)));
        } else if let Some(t) = body.strip_prefix("assistant: ") {
            if commitment(t) {
                sec[3].push(format!("{tag} {}", head(t, 160)));
            }
            if t.trim_end().ends_with('?') {
                open_now.push(format!("{tag} asked: {}", head(t, 120)));
            }
        }
    }
    // What is open is what the newest span left open; earlier open items either
    // got answered or are carried in the user facts.
    if !open_now.is_empty() {
        sec[4] = open_now;
    }
    for (i, list) in sec.iter_mut().enumerate() {
        let keep = PER_SECTION[i];
        if list.len() > keep {
            if i == 0 {
                list.truncate(keep);
            } else {
                list.drain(..list.len() - keep);
            }
        }
    }
    let mut out = String::new();
    for (i, name) in SECTIONS.iter().enumerate() {
        if sec[i].is_empty() {
            continue;
        }
        out.push_str("## ");
        out.push_str(name);
        out.push('\n');
        if i == 0 {
            out.push_str(&sec[0].join(", "));
            out.push('\n');
        } else {
            for item in &sec[i] {
                out.push_str("- ");
                out.push_str(item);
                out.push('\n');
            }
        }
    }
    truncate_chars(out.trim_end(), request.max_chars)
}

#[async_trait]
impl Summariser for ExtractiveSummariser {
    async fn summarise(&self, request: &SummaryRequest) -> Result<SummaryResponse, ModelError> {
        Ok(SummaryResponse {
            text: extract(request),
            usage: Usage::default(),
        })
    }

    fn model(&self) -> Option<String> {
        Some("abridge-extractive".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(previous: Option<&str>, transcript: &str) -> SummaryRequest {
        SummaryRequest {
            rules: String::new(),
            previous: previous.map(str::to_string),
            transcript: transcript.into(),
            max_chars: 6_000,
        }
    }

    #[test]
    fn keeps_ids_facts_results_commitments_and_open_questions() {
        let s = extract(&req(
            None,
            "[turn 0] user: My order is ORD-123 and postal code 90210.\n\
             [turn 0] tool call lookup_order({\"order_id\":\"ORD-123\"})\n\
             [turn 0] tool result lookup_order: {\"status\":\"shipped\"}\n\
             [turn 0] assistant: I will refund 12.50 EUR by Friday.\n\
             [turn 1] user: Can you also check the invoice?",
        ));
        for want in [
            "ORD-123",
            "90210",
            "12.50",
            "shipped",
            "I will refund",
            "check the invoice?",
        ] {
            assert!(s.contains(want), "missing {want}: {s}");
        }
    }

    /// Regression: "1,250" was split at its thousands separator and only
    /// "250" kept.
    #[test]
    fn a_figure_with_thousands_separators_is_kept_whole() {
        let got: Vec<&str> = words("budget 1,250 or €12,500.50, then 3, 4 (5,6)").collect();
        assert_eq!(
            got,
            [
                "budget",
                "1,250",
                "or",
                "€12,500.50",
                "then",
                "3",
                "4",
                "5,6"
            ]
        );
        let s = extract(&req(None, "[turn 0] user: my budget is 1,250 EUR\n"));
        assert!(s.contains("1,250"), "{s}");
    }

    #[test]
    fn folds_the_previous_summary_so_old_ids_survive() {
        let first = extract(&req(None, "[turn 1] user: my card is ZX-99817"));
        let mut prev = first;
        for t in 2..8 {
            prev = extract(&req(
                Some(&prev),
                &format!("[turn {t}] user: order ORD-{t}00 please"),
            ));
        }
        assert!(prev.contains("ZX-99817"), "{prev}");
        assert!(prev.contains("ORD-700"));
    }

    #[test]
    fn is_deterministic_and_bounded() {
        let t = (0..500)
            .map(|i| format!("[turn {i}] user: item SKU-{i} costs {i}.99"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut r = req(None, &t);
        r.max_chars = 800;
        let a = extract(&r);
        assert_eq!(a, extract(&r));
        assert!(a.chars().count() <= 800);
    }
}
