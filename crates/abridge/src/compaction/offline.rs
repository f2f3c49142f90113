//! The built-in offline summariser: deterministic, extractive, no model needed.
//!
//! It writes labelled sections in the order the model should read them: the
//! focus of a manual compaction; what is still open; the facts the user
//! stated (rules verbatim), each with its label, turn and sentence, the
//! newest value of each slot current; the user's decisions; the assistant's
//! commitments; the user's recent requests; tool results and the
//! identifiers in them; any previous summary it did not write; the values
//! superseded. Every list is newest first, and the summary is built from
//! whole lines within each section's share of the cap (see [`extract`]), so
//! it rolls: when room runs out the oldest content leaves, never a line
//! half. It folds the previous summary in section by section (taking its
//! lines back in the order of their turns), so a stated fact survives
//! re-compactions while it fits. The same request always gives the same summary, which makes
//! it the default wherever no model endpoint is configured, and a real choice
//! for desktop apps and tests.

use super::summarise::{Summariser, SummaryRequest, SummaryResponse};
use crate::message::Usage;
use crate::model::ModelError;
use crate::pins::{
    is_unresolved_slot, FactKind, FactSource, PinExtractor, RuleExtractor, BLOCK_HEADING,
    FOLDED_LINE, PASSING_LINE,
};
use crate::text::truncate_chars;
use async_trait::async_trait;
use std::collections::HashSet;

/// The offline extractive summariser.
#[derive(Debug, Clone, Default)]
pub struct ExtractiveSummariser;

const FOCUS: &str = "## Focus";
const FACTS: &str = "## Facts";
const SUPERSEDED: &str = "## Superseded";
const EARLIER: &str = "## Earlier summary";
const OPEN: &str = "## Open";
const COMMITMENTS: &str = "## Commitments";
const DECISIONS: &str = "## The user's decisions";
const TOOL_RESULTS: &str = "## Tool results";
/// Summaries written by earlier builds listed the identifiers on one line,
/// oldest first.
const TOOL_IDS_OLDEST_FIRST: &str = "## Identifiers from tools";
const TOOL_IDS: &str = "## Identifiers from tools, newest first";
const REQUESTS: &str = "## Recent requests";
use super::user_words::USER_WORDS_HEADING;

/// Most entries kept per list section (the newest).
const MAX_FACTS: usize = 80;
const MAX_SUPERSEDED: usize = 12;
const MAX_FOCUS: usize = 8;
const MAX_COMMITMENTS: usize = 8;
const MAX_DECISIONS: usize = 8;
const MAX_TOOL_RESULTS: usize = 8;
const MAX_TOOL_IDS: usize = 120;
const MAX_REQUESTS: usize = 6;

/// One labelled fact as a summary line.
#[derive(Debug, Clone, PartialEq)]
struct FactLine {
    turn: i64,
    label: String,
    slotted: bool,
    value: String,
    replaces: Option<String>,
    sentence: String,
}

impl FactLine {
    fn render(&self) -> String {
        let mut s = format!("- [turn {}] {}: {}", self.turn, self.label, self.value);
        if let Some(old) = &self.replaces {
            s.push_str(&format!(" (replaces {old})"));
        }
        if !self.sentence.is_empty() && self.sentence != self.value {
            s.push_str(&format!(" | \"{}\"", self.sentence));
        }
        s
    }
}

/// Reads a fact line as [`FactLine::render`] writes it:
/// `- [turn N] label: value`, then ` (replaces old)` and ` | "sentence"`
/// when present. Exactly what the pattern
/// `^- \[turn (-?\d+)\] ([^:]+): (.*?)(?: \(replaces (.*?)\))?(?: \| "(.*)")?$`
/// captures (the tests hold it as the definition), without a regex: a
/// compaction reads every fact line of the previous summary, and the
/// pattern's captures were most of that read's time.
///
/// The value is the shortest that leaves a tail the optional parts match
/// whole; the replaced value the shortest that leaves a sentence part or
/// nothing. `.` matches no newline: a newline after the label is no fact.
fn parse_fact(line: &str) -> Option<FactLine> {
    const REPLACES: &str = " (replaces ";
    const SENTENCE: &str = " | \"";
    const CLOSE_THEN_SENTENCE: &str = ") | \"";
    let rest = line.strip_prefix("- [turn ")?;
    let digits = rest.strip_prefix('-').unwrap_or(rest);
    let n = digits.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return None;
    }
    let number_len = rest.len() - digits.len() + n;
    let turn = rest[..number_len].parse().ok()?;
    let rest = rest[number_len..].strip_prefix("] ")?;
    let colon = rest.find(':')?;
    if colon == 0 {
        return None;
    }
    let label = &rest[..colon];
    let s = rest[colon..].strip_prefix(": ")?;
    if s.contains('\n') {
        return None;
    }
    let b = s.as_bytes();
    let len = b.len();
    // The tail `s[q..]` is a sentence part: ` | "…"`, its quote the last byte.
    let sentence_at =
        |q: usize| s[q..].starts_with(SENTENCE) && len - q > SENTENCE.len() && b[len - 1] == b'"';
    // The last `) | "` whose quote is not the line's last byte: a replaced
    // value can end before a sentence part only where one begins.
    let last_close_then_sentence = if b.last() == Some(&b'"') {
        s[..len - 1].rfind(CLOSE_THEN_SENTENCE)
    } else {
        None
    };
    // With no optional part, the value is the whole tail.
    let mut parts = (len, None, None);
    for p in 0..len {
        if b[p] != b' ' {
            continue;
        }
        if s[p..].starts_with(REPLACES) {
            let from = p + REPLACES.len();
            // The shortest replaced value: the first `)` after which comes a
            // sentence part, or the line's last byte.
            let before_sentence = last_close_then_sentence
                .filter(|&l| l >= from)
                .and_then(|_| {
                    s[from..]
                        .match_indices(CLOSE_THEN_SENTENCE)
                        .map(|(i, _)| from + i)
                        .find(|&q| sentence_at(q + 1))
                });
            let at_end = (b[len - 1] == b')' && len > from).then_some(len - 1);
            // (The line ends with a quote for the one, a parenthesis for the
            // other: never both.)
            if let Some(q) = before_sentence.or(at_end) {
                let sentence = (q + 1 < len).then(|| &s[q + 1 + SENTENCE.len()..len - 1]);
                parts = (p, Some(&s[from..q]), sentence);
                break;
            }
        }
        if sentence_at(p) {
            parts = (p, None, Some(&s[p + SENTENCE.len()..len - 1]));
            break;
        }
    }
    let (end, replaces, sentence) = parts;
    Some(FactLine {
        turn,
        slotted: FactKind::parse(label).is_none(),
        label: label.to_string(),
        value: s[..end].to_string(),
        replaces: replaces.map(str::to_string),
        sentence: sentence.map_or(String::new(), str::to_string),
    })
}

/// The summary being built.
#[derive(Debug, Default)]
struct Sections {
    facts: Vec<FactLine>,
    superseded: Vec<String>,
    earlier: Vec<String>,
    open: Vec<String>,
    commitments: Vec<String>,
    decisions: Vec<String>,
    tool_results: Vec<String>,
    tool_ids: Vec<String>,
    requests: Vec<String>,
    /// Values in `facts`, and `tool_ids`: a value is listed once (found in
    /// constant time, so a summary of thousands of facts is built in one pass).
    fact_values: HashSet<String>,
    tool_id_set: HashSet<String>,
}

impl Sections {
    /// Adds a fact: a new value of a slot replaces the current one (listed
    /// as superseded); a value already carried is not repeated.
    fn add_fact(&mut self, f: FactLine) {
        if f.slotted {
            if let Some(i) = self
                .facts
                .iter()
                .rposition(|x| x.slotted && x.label == f.label)
            {
                if self.facts[i].value == f.value {
                    return;
                }
                let old = self.facts.remove(i);
                self.fact_values.remove(&old.value);
                self.superseded.push(format!(
                    "- [turn {}] {}: {} (superseded at turn {})",
                    old.turn, old.label, old.value, f.turn
                ));
                let mut f = f;
                f.replaces = Some(old.value);
                self.fact_values.insert(f.value.clone());
                self.facts.push(f);
                return;
            }
        } else if self.fact_values.contains(&f.value) {
            return;
        }
        self.fact_values.insert(f.value.clone());
        self.facts.push(f);
    }

    fn add_tool_id(&mut self, v: &str) {
        if self.tool_id_set.insert(v.to_string()) {
            self.tool_ids.push(v.to_string());
        }
    }

    fn parse_previous(prev: &str) -> Sections {
        let mut s = Sections::default();
        let mut cur: Option<&str> = None;
        let known = [
            FOCUS,
            FACTS,
            BLOCK_HEADING,
            SUPERSEDED,
            EARLIER,
            OPEN,
            COMMITMENTS,
            DECISIONS,
            TOOL_RESULTS,
            TOOL_IDS,
            TOOL_IDS_OLDEST_FIRST,
            REQUESTS,
            USER_WORDS_HEADING,
        ];
        let mut newest_first_ids: Vec<String> = Vec::new();
        let mut facts: Vec<FactLine> = Vec::new();
        for line in prev.lines() {
            if line.starts_with("## ") {
                if let Some(k) = known.iter().find(|k| line.trim_end() == **k) {
                    cur = Some(k);
                    continue;
                }
                // A heading abridge did not write: the previous summary came
                // from elsewhere; kept whole.
                cur = None;
            }
            match cur {
                Some(FACTS) | Some(BLOCK_HEADING) => match parse_fact(line) {
                    Some(f) => facts.push(f),
                    None => match line
                        .strip_prefix(PASSING_LINE)
                        .and_then(|l| l.split_once(": "))
                    {
                        // Values the guard carried from tool results.
                        Some((_, values)) => {
                            for v in values.split(", ").filter(|v| !v.is_empty()) {
                                s.add_tool_id(v);
                            }
                        }
                        // The guard's note of what it folded.
                        None if line.starts_with(FOLDED_LINE) => {}
                        None if !line.trim().is_empty() => s.earlier.push(line.to_string()),
                        None => {}
                    },
                },
                // Carried by the guard, not summarised again.
                Some(USER_WORDS_HEADING) => {}
                Some(SUPERSEDED) => push_item(&mut s.superseded, line),
                Some(EARLIER) => s.earlier.push(line.to_string()),
                // The previous focus and open list belong to the previous
                // span; the facts the focus showed (not repeated under
                // Facts) are kept.
                Some(FOCUS) => {
                    if let Some(f) = parse_fact(line)
                        .filter(|f| FactKind::parse(&f.label).is_some() || !f.sentence.is_empty())
                    {
                        facts.push(f);
                    }
                }
                Some(OPEN) => {}
                Some(COMMITMENTS) => push_item(&mut s.commitments, line),
                Some(DECISIONS) => push_item(&mut s.decisions, line),
                Some(TOOL_RESULTS) => push_item(&mut s.tool_results, line),
                Some(TOOL_IDS_OLDEST_FIRST) => {
                    for v in line.split(", ").filter(|w| !w.trim().is_empty()) {
                        s.add_tool_id(v);
                    }
                }
                Some(TOOL_IDS) => newest_first_ids.extend(
                    line.split(", ")
                        .filter(|w| !w.trim().is_empty())
                        .map(str::to_string),
                ),
                Some(REQUESTS) => push_item(&mut s.requests, line),
                _ => s.earlier.push(line.to_string()),
            }
        }
        for v in newest_first_ids.iter().rev() {
            s.add_tool_id(v);
        }
        // Facts are written newest first: folded in the order they were
        // stated, so a slot's newest value stays current (stable within a
        // turn: the block's lines follow the summary's).
        facts.sort_by_key(|f| f.turn);
        for f in facts {
            s.add_fact(f);
        }
        // Lists are written newest first (by earlier builds, oldest
        // first): kept in the order of their turns, whichever it was.
        let by_turn = |l: &String| {
            l.strip_prefix("- [turn ")
                .and_then(|r| r.split(']').next())
                .and_then(|n| n.parse::<i64>().ok())
                .unwrap_or(i64::MIN)
        };
        for list in [
            &mut s.superseded,
            &mut s.commitments,
            &mut s.decisions,
            &mut s.tool_results,
            &mut s.requests,
        ] {
            list.sort_by_key(by_turn);
        }
        while s.earlier.first().is_some_and(|l| l.trim().is_empty()) {
            s.earlier.remove(0);
        }
        while s.earlier.last().is_some_and(|l| l.trim().is_empty()) {
            s.earlier.pop();
        }
        s
    }
}

fn push_item(list: &mut Vec<String>, line: &str) {
    if line.starts_with("- ") {
        list.push(line.to_string());
    }
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

/// A decision the user takes ("let's go with...", "I'll take the...").
fn decision(text: &str) -> bool {
    let l = text.to_lowercase();
    [
        "let's go with",
        "lets go with",
        "go ahead with",
        "go ahead and",
        "i'll take",
        "i will take",
        "i decided",
        "i've decided",
        "we decided",
        "we've decided",
        "we'll go with",
        "i'll go with",
        "i choose",
        "i chose",
        "approved",
    ]
    .iter()
    .any(|k| l.contains(k))
}

/// A transcript entry: `[turn N] kind: body`, possibly over several lines.
struct Entry<'a> {
    turn: i64,
    tag: &'a str,
    body: String,
}

fn entries(transcript: &str) -> Vec<Entry<'_>> {
    let mut out: Vec<Entry<'_>> = Vec::new();
    for line in transcript.lines() {
        let head = line
            .strip_prefix("[turn ")
            .and_then(|r| r.split_once("] "))
            .and_then(|(n, rest)| Some((n.parse::<i64>().ok()?, rest)));
        match head {
            Some((turn, rest)) => out.push(Entry {
                turn,
                tag: &line[..line.len() - rest.len() - 1],
                body: rest.to_string(),
            }),
            None => {
                if let Some(e) = out.last_mut() {
                    e.body.push('\n');
                    e.body.push_str(line);
                }
            }
        }
    }
    out
}

/// Lowercased focus terms (words of four letters or more).
fn focus_terms(focus: &str) -> Vec<String> {
    focus
        .split(|c: char| !c.is_alphanumeric() && c != '-' && c != '_')
        .filter(|w| w.chars().count() >= 4)
        .map(str::to_lowercase)
        .collect()
}

fn one_line(s: &str, n: usize) -> String {
    truncate_chars(&s.split_whitespace().collect::<Vec<_>>().join(" "), n)
}

fn keep_newest(list: &mut Vec<String>, n: usize) {
    if list.len() > n {
        list.drain(..list.len() - n);
    }
}

/// Builds the summary text from a request (pure).
pub fn extract(request: &SummaryRequest) -> String {
    let mut sec = request
        .previous
        .as_deref()
        .map(Sections::parse_previous)
        .unwrap_or_default();
    let entries = entries(&request.transcript);
    let mut open_now: Vec<String> = Vec::new();
    let last_turn = entries.iter().map(|e| e.turn).max();
    let mut answered_in: Vec<i64> = Vec::new();
    for e in &entries {
        if let Some(t) = e.body.strip_prefix("user: ") {
            for mut f in RuleExtractor.extract(t, FactSource::User) {
                if let Some(marker) = f.slot.take_if(|s| is_unresolved_slot(s)) {
                    let recent = sec
                        .facts
                        .iter()
                        .rev()
                        .filter(|x| x.slotted)
                        .map(|x| (x.label.as_str(), x.value.as_str()));
                    f.slot = crate::pins::resolve_slot(&marker, &f.value, recent);
                }
                sec.add_fact(FactLine {
                    turn: e.turn,
                    label: f.label().to_string(),
                    slotted: f.slot.is_some(),
                    sentence: if f.kind == FactKind::Rule {
                        String::new()
                    } else {
                        f.sentence.clone()
                    },
                    value: f.value,
                    replaces: None,
                });
            }
            if decision(t) {
                sec.decisions.push(format!(
                    "- {} the user decided: {}",
                    e.tag,
                    one_line(t, 160)
                ));
            }
            sec.requests
                .push(format!("- {} {}", e.tag, one_line(t, 160)));
        } else if let Some(t) = e
            .body
            .strip_prefix("tool result ")
            .or_else(|| e.body.strip_prefix("tool error "))
        {
            let error = e.body.starts_with("tool error ");
            for f in RuleExtractor.extract(t, FactSource::Tool) {
                sec.add_tool_id(&f.value);
            }
            let kind = if error { "error " } else { "" };
            sec.tool_results
                .push(format!("- {} {kind}{}", e.tag, one_line(t, 120)));
        } else if let Some(t) = e.body.strip_prefix("assistant: ") {
            answered_in.push(e.turn);
            if commitment(t) {
                sec.commitments
                    .push(format!("- {} {}", e.tag, one_line(t, 160)));
            }
        }
    }
    // What is open is what the span's last turn left open: a question the
    // assistant asked at its end, or a user question with no answer.
    if let Some(last) = last_turn {
        let in_last: Vec<&Entry<'_>> = entries.iter().filter(|e| e.turn == last).collect();
        if let Some(a) = in_last
            .iter()
            .rev()
            .find_map(|e| e.body.strip_prefix("assistant: "))
        {
            if a.trim_end().ends_with('?') {
                open_now.push(format!(
                    "- [turn {last}] the assistant asked: {}",
                    one_line(a, 160)
                ));
            }
        }
        for e in &in_last {
            if let Some(u) = e.body.strip_prefix("user: ") {
                if u.trim_end().ends_with('?') && !answered_in.contains(&last) {
                    open_now.push(format!("- [turn {last}] unanswered: {}", one_line(u, 160)));
                }
            }
        }
    }
    sec.open = open_now;
    let focus: Vec<String> = match request.focus.as_deref().map(focus_terms) {
        Some(terms) if !terms.is_empty() => {
            let touches = |s: &str| {
                let l = s.to_lowercase();
                terms.iter().any(|t| l.contains(t.as_str()))
            };
            let mut lines: Vec<String> = sec
                .facts
                .iter()
                .map(FactLine::render)
                .chain(
                    entries
                        .iter()
                        .map(|e| format!("- {} {}", e.tag, one_line(&e.body, 200))),
                )
                .filter(|l| touches(l))
                .collect();
            lines.dedup();
            keep_newest(&mut lines, MAX_FOCUS);
            lines
        }
        _ => Vec::new(),
    };
    if sec.facts.len() > MAX_FACTS {
        // The oldest facts that fill no slot and state no rule go first
        // (the guard carries the pinned ones); stated values and rules stay.
        let mut over = sec.facts.len() - MAX_FACTS;
        sec.facts.retain(|f| {
            let drop = over > 0 && !f.slotted && f.label != "rule";
            if drop {
                over -= 1;
            }
            !drop
        });
        sec.fact_values = sec.facts.iter().map(|f| f.value.clone()).collect();
    }
    keep_newest(&mut sec.superseded, MAX_SUPERSEDED);
    keep_newest(&mut sec.commitments, MAX_COMMITMENTS);
    keep_newest(&mut sec.decisions, MAX_DECISIONS);
    keep_newest(&mut sec.tool_results, MAX_TOOL_RESULTS);
    keep_newest(&mut sec.tool_ids, MAX_TOOL_IDS);
    keep_newest(&mut sec.requests, MAX_REQUESTS);

    let newest_first = |l: &[String]| l.iter().rev().cloned().collect::<Vec<_>>();
    // Facts newest first; those of one turn in the order they were stated.
    let mut facts: Vec<&FactLine> = sec.facts.iter().collect();
    facts.sort_by_key(|f| std::cmp::Reverse(f.turn));
    // A fact the focus already shows is not repeated.
    let facts: Vec<String> = facts
        .into_iter()
        .map(FactLine::render)
        .filter(|l| !focus.contains(l))
        .collect();
    let ids: Vec<String> = sec
        .tool_ids
        .iter()
        .rev()
        .cloned()
        .collect::<Vec<_>>()
        .chunks(12)
        .map(|c| c.join(", "))
        .collect();
    // In the order the model reads them, each with the share of the cap it
    // is sure of; what a section leaves unused goes to the next ones.
    let sections: [(&str, Vec<String>, usize); 10] = [
        (FOCUS, focus, 10),
        (OPEN, sec.open.clone(), 10),
        (FACTS, facts, 30),
        (DECISIONS, newest_first(&sec.decisions), 5),
        (COMMITMENTS, newest_first(&sec.commitments), 10),
        (REQUESTS, newest_first(&sec.requests), 10),
        (TOOL_RESULTS, newest_first(&sec.tool_results), 10),
        (TOOL_IDS, ids, 5),
        (EARLIER, sec.earlier.clone(), 5),
        (SUPERSEDED, newest_first(&sec.superseded), 5),
    ];
    fit(&sections, request.max_chars)
}

/// The summary within `max_chars`, whole lines only: each section first
/// takes its lines, newest first, up to its share (percent) of the cap,
/// then what is left goes to the sections in order. A line that does not
/// fit is left out whole (never cut), and a heading only stands over lines.
fn fit(sections: &[(&str, Vec<String>, usize)], max_chars: usize) -> String {
    let len = |l: &str| l.chars().count() + 1;
    let mut taken: Vec<Vec<bool>> = sections.iter().map(|s| vec![false; s.1.len()]).collect();
    let mut headed = vec![false; sections.len()];
    let mut total = 0usize;
    let mut take = |i: usize, quota: Option<usize>| {
        let (name, lines, _) = &sections[i];
        let mut used = 0usize;
        for (j, line) in lines.iter().enumerate() {
            if taken[i][j] {
                used += len(line);
                continue;
            }
            let head = if headed[i] { 0 } else { len(name) };
            let cost = head + len(line);
            if total + cost > max_chars || quota.is_some_and(|q| used + cost > q) {
                if quota.is_some() {
                    break;
                }
                continue;
            }
            taken[i][j] = true;
            headed[i] = true;
            used += cost;
            total += cost;
        }
    };
    for (i, (_, _, share)) in sections.iter().enumerate() {
        take(i, Some(max_chars * share / 100));
    }
    for i in 0..sections.len() {
        take(i, None);
    }
    let mut out = String::new();
    for (i, (name, lines, _)) in sections.iter().enumerate() {
        if !headed[i] {
            continue;
        }
        out.push_str(name);
        out.push('\n');
        for (j, line) in lines.iter().enumerate() {
            if taken[i][j] {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.trim_end().to_string()
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

    /// The fact line's definition: what [`parse_fact`] reads, as a pattern.
    fn parse_fact_by_pattern(line: &str) -> Option<FactLine> {
        static FACT_LINE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
            regex::Regex::new(
                r#"^- \[turn (-?\d+)\] ([^:]+): (.*?)(?: \(replaces (.*?)\))?(?: \| "(.*)")?$"#,
            )
            .unwrap()
        });
        let c = FACT_LINE.captures(line)?;
        let label = c[2].to_string();
        Some(FactLine {
            turn: c[1].parse().ok()?,
            slotted: FactKind::parse(&label).is_none(),
            label,
            value: c[3].to_string(),
            replaces: c.get(4).map(|m| m.as_str().to_string()),
            sentence: c.get(5).map_or(String::new(), |m| m.as_str().to_string()),
        })
    }

    /// `parse_fact` reads every line as the pattern does: the lines
    /// [`FactLine::render`] writes, and 300,000 lines made of the pieces
    /// the pattern turns on (its literals, their halves, colons, quotes,
    /// parentheses, newlines, other scripts' digits and letters) in every
    /// order.
    #[test]
    fn a_fact_line_is_read_as_its_pattern_defines() {
        let rendered = [
            FactLine {
                turn: 3,
                label: "budget".into(),
                slotted: true,
                value: "1,250 EUR".into(),
                replaces: Some("900 EUR (approx)".into()),
                sentence: "my budget is 1,250 EUR | \"really\"".into(),
            },
            FactLine {
                turn: -1,
                label: "rule".into(),
                slotted: false,
                value: "never call after 6 (replaces nothing)".into(),
                replaces: None,
                sentence: String::new(),
            },
        ];
        for f in &rendered {
            let line = f.render();
            assert_eq!(parse_fact(&line), parse_fact_by_pattern(&line), "{line:?}");
            assert!(parse_fact(&line).is_some(), "{line:?}");
        }
        let pieces = [
            "- [turn ",
            "12",
            "-",
            "] ",
            "budget",
            "rule",
            ":",
            ": ",
            " ",
            " (replaces ",
            " (replaces",
            "(",
            ")",
            ") | \"",
            " | \"",
            " |",
            "\"",
            "x",
            "é",
            "\n",
            "\r",
            "١",
            "]",
            "[turn 4]",
            "- ",
            "deadline for the shelves",
            "",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let mut matched = 0;
        for i in 0..300_000 {
            // Most lines open as a fact line does, so the tail is what varies.
            let mut line = String::new();
            if i % 4 != 0 {
                line.push_str(["- [turn 7] ", "- [turn -30] ", "- [turn 0] label"][next(3)]);
            }
            for _ in 0..next(12) {
                line.push_str(pieces[next(pieces.len())]);
            }
            let (got, want) = (parse_fact(&line), parse_fact_by_pattern(&line));
            matched += usize::from(want.is_some());
            assert_eq!(got, want, "{line:?}");
        }
        // Both outcomes were tried, many times each.
        assert!((30_000..270_000).contains(&matched), "{matched}");
    }

    fn req(previous: Option<&str>, transcript: &str) -> SummaryRequest {
        SummaryRequest {
            rules: String::new(),
            previous: previous.map(str::to_string),
            transcript: transcript.into(),
            max_chars: 6_000,
            focus: None,
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
             [turn 1] user: Can you also check the invoice?\n\
             [turn 1] assistant: Which invoice do you mean?",
        ));
        for want in [
            "ORD-123",
            "90210",
            "12.50",
            "shipped",
            "I will refund",
            "Which invoice do you mean?",
        ] {
            assert!(s.contains(want), "missing {want}: {s}");
        }
    }

    /// Regression: "1,250" was split at its thousands separator and only
    /// "250" kept.
    #[test]
    fn a_figure_with_thousands_separators_is_kept_whole() {
        let s = extract(&req(None, "[turn 0] user: my budget is 1,250 EUR\n"));
        assert!(s.contains("budget: 1,250 EUR"), "{s}");
    }

    #[test]
    fn facts_are_labelled_with_their_turn_and_sentence() {
        let s = extract(&req(
            None,
            "[turn 3] user: My name is Ana Lima. Please never call before 9am.",
        ));
        assert!(
            s.contains("- [turn 3] name: Ana Lima | \"My name is Ana Lima.\""),
            "{s}"
        );
        assert!(
            s.contains("- [turn 3] rule: Please never call before 9am."),
            "{s}"
        );
    }

    #[test]
    fn the_newest_value_of_a_slot_is_current_and_older_ones_marked() {
        let mut prev = extract(&req(None, "[turn 1] user: my size is M"));
        prev = extract(&req(Some(&prev), "[turn 4] user: change the size to L"));
        prev = extract(&req(Some(&prev), "[turn 9] user: actually, my size is XL"));
        let facts = prev.split(SUPERSEDED).next().unwrap();
        assert!(facts.contains("size: XL (replaces L)"), "{prev}");
        assert!(!facts.contains("size: M"), "{prev}");
        assert!(
            prev.contains("- [turn 1] size: M (superseded at turn 4)"),
            "{prev}"
        );
        assert!(
            prev.contains("- [turn 4] size: L (superseded at turn 9)"),
            "{prev}"
        );
    }

    #[test]
    fn folds_the_previous_summary_so_old_facts_survive() {
        let first = extract(&req(
            None,
            "[turn 1] user: my card is ZX-99817 and my e-mail is ana@example.org",
        ));
        let mut prev = first;
        for t in 2..30 {
            prev = extract(&req(
                Some(&prev),
                &format!("[turn {t}] user: order ORD-{t}00 please\n[turn {t}] tool result find: {{\"txn\":\"txn_{t}a\"}}"),
            ));
        }
        assert!(prev.contains("ZX-99817"), "{prev}");
        assert!(prev.contains("ana@example.org"), "{prev}");
        assert!(prev.contains("ORD-2900"), "{prev}");
        assert!(
            prev.contains("txn_29a"),
            "the newest tool ids are kept: {prev}"
        );
    }

    #[test]
    fn a_summary_written_elsewhere_is_kept_whole() {
        let model = "The user, Ana, wants a refund for order 4471.\n\n## Decisions\n- refund approved by Bob";
        let s = extract(&req(
            Some(model),
            "[turn 7] user: thanks, and my budget is 300 EUR",
        ));
        assert!(s.contains(model), "{s}");
        assert!(s.contains("budget: 300 EUR"), "{s}");
        // And again: it stays whole, not nested.
        let again = extract(&req(Some(&s), "[turn 8] user: ok"));
        assert!(again.contains(model), "{again}");
        assert_eq!(again.matches(EARLIER).count(), 1, "{again}");
    }

    #[test]
    fn an_answered_question_is_not_open() {
        let s = extract(&req(
            None,
            "[turn 2] user: Where is my parcel?\n[turn 2] assistant: It arrives tomorrow.",
        ));
        assert!(!s.contains(OPEN), "{s}");
    }

    #[test]
    fn the_focus_comes_first() {
        let mut r = req(
            None,
            "[turn 0] user: my invoice is INV-9\n[turn 1] user: the parcel is late\n[turn 2] user: hello",
        );
        r.focus = Some("the parcel".into());
        let s = extract(&r);
        assert!(
            s.starts_with("## Focus\n- [turn 1] user: the parcel is late"),
            "{s}"
        );
    }

    /// A fact the focus shows is not repeated under Facts, and the next
    /// summary still has it.
    #[test]
    fn a_fact_shown_in_the_focus_is_kept_by_the_next_summary() {
        let mut r = req(
            None,
            "[turn 0] user: My invoice is INV-9.\n[turn 1] user: hello",
        );
        r.focus = Some("invoice".into());
        let s = extract(&r);
        assert_eq!(s.matches("INV-9 |").count(), 1, "{s}");
        let next = extract(&req(Some(&s), "[turn 2] user: ok"));
        assert!(next.contains("invoice: INV-9"), "{next}");
    }

    #[test]
    fn multi_line_entries_are_read_whole() {
        let s = extract(&req(
            None,
            "[turn 0] user: first line\nsecond line: my zip code is 75001\n[turn 1] user: ok",
        ));
        assert!(s.contains("postcode: 75001"), "{s}");
    }

    /// Item by item, 400 turns folded 25 at a time at a small cap: the
    /// newest facts, the last request, the last commitment and decision
    /// and what is open stay; the oldest content leaves (the summary rolls
    /// instead of freezing at its first turns); no line is ever cut.
    #[test]
    fn a_long_session_rolls_newest_first_and_never_cuts_a_line() {
        let mut prev: Option<String> = None;
        let turn = |t: i64| {
            let fact = match t % 4 {
                0 => format!("My colleague Person{t} Okafor will sign for order ORD-{t}00."),
                1 => format!("Please change my budget to {t}0 EUR."),
                2 => format!("Let's go with option {t} for the lamp."),
                _ => format!("Is parcel {t} late?"),
            };
            format!(
                "[turn {t}] user: {fact}\n[turn {t}] assistant: I will check parcel {t} and \
                 report back tomorrow{}",
                if t % 4 == 3 { "." } else { ", shall I?" }
            )
        };
        let cap = 2_500;
        let mut oldest_seen = Vec::new();
        for span in 0..16 {
            let t: Vec<String> = (span * 25..span * 25 + 25).map(turn).collect();
            let mut r = req(prev.as_deref(), &t.join("\n"));
            r.max_chars = cap;
            let s = extract(&r);
            assert!(s.chars().count() <= cap, "{}", s.chars().count());
            for line in s.lines() {
                assert!(
                    line.starts_with("## ") || line.starts_with("- "),
                    "a cut or stray line: {line:?}"
                );
                if line.starts_with("- [turn") && line.contains(": ") && line.contains("| \"") {
                    assert!(line.ends_with('"'), "a fact line cut: {line:?}");
                }
            }
            let last = span * 25 + 24;
            let newest = |k: i64| (last - 3..=last).find(|t| t % 4 == k).unwrap();
            assert!(s.contains(&format!("ORD-{}00", newest(0))), "{s}");
            assert!(s.contains(&format!("budget: {}0 EUR", newest(1))), "{s}");
            assert!(
                s.contains(&format!(
                    "the user decided: Let's go with option {}",
                    newest(2)
                )),
                "{s}"
            );
            assert!(
                s.contains(&format!("] Is parcel {0} late?", newest(3))),
                "{s}"
            );
            if last % 4 != 3 {
                assert!(
                    s.contains(&format!("- [turn {last}] the assistant asked")),
                    "{s}"
                );
            }
            let oldest = s
                .lines()
                .filter_map(|l| l.strip_prefix("- [turn "))
                .filter_map(|l| l.split(']').next()?.parse::<i64>().ok())
                .min()
                .unwrap();
            oldest_seen.push(oldest);
            prev = Some(s);
        }
        // Rolls: what it holds moves with the session.
        assert!(
            oldest_seen[15] > oldest_seen[4] && oldest_seen[15] > 200,
            "{oldest_seen:?}"
        );
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
