//! A picture of a session: one self-contained HTML page (inline SVG and CSS,
//! no script, nothing fetched) drawn from the store, for `abridge report`.
//!
//! The session page shows the context measure of every step over the whole
//! session (provider-reported or estimated, marked), with turn numbers on the
//! axis; the thresholds and the window as labelled lines, said for what they
//! are (a threshold is a trigger checked before a turn's steps, not a
//! ceiling: a turn's tool results can carry a step past it; the window is the
//! ceiling); each compaction as a mark at the first step that read it,
//! labelled with the context as plotted just before and at that step (the
//! folded span and its summary said apart, as such); the steps that waited
//! for a summary; the compactions in a table (boundary, trigger, summariser
//! model, attempts, span and summary tokens, time taken, the step that first
//! read it by turn and step, the summary and the facts it carried); and
//! totals (turns, steps, tool calls by effect mode, input tokens not sent
//! thanks to the summaries, defined on the page, the share of input served
//! from the provider's cache). The store page has the store's totals, a
//! timeline of its sessions (their turns' span, compactions, failed turns),
//! and a row per session with a small chart of its context, linking to each
//! one's page.
//!
//! The output is well-formed XML as well as HTML (every element closed, every
//! attribute quoted), and every figure drawn carries its value in a `data-`
//! attribute, so a test can check it against the store. Colours come from CSS
//! variables with a dark scheme (`prefers-color-scheme`); no meaning is carried
//! by colour alone: lines are labelled and dashed differently, estimated
//! points are hollow, waits are triangles with a text legend.

use abridge::error::Result;
use abridge::ids::SessionId;
use abridge::inspect::{self, SessionSummary};
use abridge::store::Connection;
use abridge::store::{CompactionRow, CompactionStatus, StepRow};
use std::collections::HashMap;
use std::fmt::Write;

/// The host's settings, drawn as lines: each over what the store recorded.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    /// The hard threshold, in tokens (the host's `compact_at`); None: the
    /// one the store recorded with the session's newest compaction.
    pub threshold: Option<u64>,
    /// The soft (background) threshold, in tokens; None: the recorded one.
    pub soft_threshold: Option<u64>,
    /// The model's context window, in tokens; None: the built-in table's, if
    /// it knows the session's model.
    pub window: Option<u64>,
}

/// One executed step, as drawn.
struct Point {
    turn: i64,
    step: i64,
    step_id: i64,
    tokens: i64,
    estimated: bool,
    waited_ms: Option<i64>,
    compaction_id: Option<i64>,
}

/// `s` escaped for text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Not allowed in XML 1.0 (nor useful in HTML).
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\t' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// `1234567` as `1,234,567`.
fn num(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

const STYLE: &str = r#"
:root { --bg: #ffffff; --fg: #1b1f24; --muted: #57606a; --grid: #d0d7de; --line: #0b5cad;
        --hard: #b3261e; --soft: #8a5a00; --window: #1b1f24; --mark: #6639ba; --wait: #b3261e;
        --panel: #f6f8fa; color-scheme: light dark; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0d1117; --fg: #e6edf3; --muted: #9da7b3; --grid: #30363d; --line: #58a6ff;
          --hard: #ff7b72; --soft: #e3b341; --window: #e6edf3; --mark: #d2a8ff; --wait: #ff7b72;
          --panel: #161b22; }
}
body { background: var(--bg); color: var(--fg); font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif;
       max-width: 1100px; margin: 0 auto; padding: 1rem 1.25rem 3rem; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.muted { color: var(--muted); }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--grid); vertical-align: top; }
td.n, th.n { text-align: right; }
.totals { display: grid; grid-template-columns: repeat(auto-fill, minmax(11rem, 1fr)); gap: .5rem; }
.totals div { background: var(--panel); padding: .5rem .75rem; border-radius: 6px; }
.totals b { display: block; font-size: 1.2rem; }
figure { margin: 1rem 0; } svg { width: 100%; height: auto; display: block; }
svg text { fill: var(--fg); font-size: 12px; }
svg .axis { stroke: var(--muted); } svg .grid { stroke: var(--grid); }
svg .measure { fill: none; stroke: var(--line); stroke-width: 1.5; }
svg .point { fill: var(--line); stroke: var(--line); } svg .point.estimated { fill: var(--bg); }
svg .hard { stroke: var(--hard); stroke-width: 1.5; stroke-dasharray: 8 4; }
svg .soft { stroke: var(--soft); stroke-width: 1.5; stroke-dasharray: 2 3; }
svg .window { stroke: var(--window); stroke-width: 1; }
svg .compaction line { stroke: var(--mark); stroke-width: 1.5; }
svg .compaction text { fill: var(--mark); paint-order: stroke; stroke: var(--bg); stroke-width: 4px; }
svg .level text { paint-order: stroke; stroke: var(--bg); stroke-width: 4px; }
svg .wait { fill: var(--wait); stroke: var(--wait); }
svg .mark { stroke: var(--mark); stroke-width: 2; }
svg.spark { width: 160px; height: 28px; display: inline; }
details { margin: .25rem 0; } pre { white-space: pre-wrap; background: var(--panel); padding: .5rem; border-radius: 6px; }
a { color: var(--line); }
"#;

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\" xmlns=\"http://www.w3.org/1999/xhtml\">\n<head>\n\
         <meta charset=\"utf-8\"/>\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n\
         <meta name=\"color-scheme\" content=\"light dark\"/>\n<title>{}</title>\n<style>{STYLE}</style>\n\
         </head>\n<body>\n{body}</body>\n</html>\n",
        esc(title)
    )
}

/// The page of one session (by id or external id, as `inspect` takes it).
pub fn session_page(conn: &Connection, key: &str, opts: &ReportOptions) -> Result<String> {
    let detail = inspect::session_detail(conn, key)?;
    let session = &detail.summary.session;
    let counts = &detail.summary.counts;
    let window = opts
        .window
        .or_else(|| abridge::compaction::builtin_context_window(&session.model));
    let mut points = Vec::new();
    for t in &detail.turns {
        for s in inspect::steps(conn, t.turn.id)? {
            if let Some(p) = point(t.turn.idx, &s) {
                points.push(p);
            }
        }
    }
    let effects = effect_counts(conn, session.id)?;
    let saved = tokens_not_sent(&points, &detail.compactions);

    let mut b = String::new();
    let _ = writeln!(
        b,
        "<header><h1>Session {}</h1><p class=\"muted\">model {}, {} turns</p></header>",
        esc(&session.external_id),
        esc(&session.model),
        counts.turns
    );
    // Totals.
    b.push_str(
        "<section aria-labelledby=\"totals\"><h2 id=\"totals\">Totals</h2><div class=\"totals\">\n",
    );
    let mut total = |name: &str, label: &str, value: String| {
        let _ = writeln!(
            b,
            "<div data-total=\"{name}\"><b>{}</b>{}</div>",
            esc(&value),
            esc(label)
        );
    };
    total("turns", "turns", num(counts.turns));
    total("turns_failed", "turns failed", num(counts.turns_failed));
    total("steps", "steps", num(counts.steps));
    total("tool_calls", "tool calls", num(counts.tool_calls));
    for (mode, n) in &effects {
        total(
            &format!("tool_calls_{mode}"),
            &format!("{} tool calls", mode.replace('_', "-")),
            num(*n),
        );
    }
    total(
        "compactions",
        "compactions completed",
        num(counts.compactions_completed),
    );
    total(
        "tokens_saved",
        "input tokens not sent, thanks to the summaries",
        num(saved),
    );
    total(
        "cached_share",
        "of input served from the provider's cache",
        counts
            .cached_input_share()
            .map_or("not reported".into(), |r| format!("{:.1}%", r * 100.0)),
    );
    b.push_str(
        "</div><p class=\"muted\">Input tokens not sent: for every step that read a summary, the \
         tokens of the turns it folded less the summary's own, added up over the session's \
         steps (what the model would have been sent without compaction, as estimated when the \
         summary was made, less what it was sent).</p></section>\n",
    );
    // The chart.
    b.push_str("<section aria-labelledby=\"context\"><h2 id=\"context\">Context per step</h2>\n");
    let readers = first_readers(&points);
    b.push_str(&chart(
        &points,
        &readers,
        &detail.compactions,
        &levels(opts, &detail.compactions),
        window,
    ));
    b.push_str("</section>\n");
    // Compactions.
    b.push_str(&compaction_table(
        conn,
        session.id,
        &detail.compactions,
        &points,
        &readers,
    )?);
    // Calls that waited for a decision or a result, and how long.
    if !detail.approvals.is_empty() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let idx = |tid| {
            detail
                .turns
                .iter()
                .find(|t| t.turn.id == tid)
                .map_or(-1, |t| t.turn.idx)
        };
        let waiting = detail
            .approvals
            .iter()
            .filter(|a| a.status == abridge::store::ApprovalStatus::Pending)
            .count();
        let _ = writeln!(
            b,
            "<section aria-labelledby=\"decisions\"><h2 id=\"decisions\">Waiting for a decision</h2>\
             <p data-total=\"calls_waiting\">{} of {} calls wait now{}</p>",
            waiting,
            detail.approvals.len(),
            if waiting > 0 { ": their turn is parked" } else { "" }
        );
        b.push_str("<table><thead><tr><th class=\"n\">call</th><th class=\"n\">turn</th><th>tool</th><th>outcome</th><th>by</th><th class=\"n\">waited</th></tr></thead><tbody>\n");
        for a in &detail.approvals {
            let _ = writeln!(
                b,
                "<tr data-call=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
                a.id,
                a.id,
                idx(a.turn_id),
                esc(&a.tool_name),
                a.status,
                if a.input.is_some() { ", arguments edited" } else { "" },
                esc(a.decided_by.as_deref().unwrap_or("-")),
                esc(&abridge::text::human_duration_ms(a.waited_ms(now)))
            );
        }
        b.push_str("</tbody></table></section>\n");
    }
    // Where it comes from, and the sessions that hang off it.
    if session.parent.is_some() || !detail.children.is_empty() {
        b.push_str("<section aria-labelledby=\"tree\"><h2 id=\"tree\">Parent and children</h2>\n");
        if let (Some(p), Some(name)) = (&session.parent, &detail.parent_external_id) {
            let _ = writeln!(
                b,
                "<p data-parent=\"{}\">{}</p>",
                esc(name),
                esc(&match p.kind {
                    abridge::store::ParentKind::Fork => format!(
                        "A fork of {name} at turn {}: turns 0-{} are that session's, read where they are.",
                        p.turn, p.turn
                    ),
                    _ => format!(
                        "Delegated by {name}: runs tool call {} of its turn {}.",
                        p.call.as_deref().unwrap_or("-"),
                        p.turn
                    ),
                })
            );
        }
        if !detail.children.is_empty() {
            b.push_str("<table><thead><tr><th>session</th><th>relation</th><th class=\"n\">turn</th><th>call</th></tr></thead><tbody>\n");
            for c in &detail.children {
                if let Some(p) = &c.parent {
                    let _ = writeln!(
                        b,
                        "<tr data-child=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                        esc(&c.external_id),
                        esc(&c.external_id),
                        match p.kind {
                            abridge::store::ParentKind::Fork => "fork",
                            _ => "delegated child",
                        },
                        p.turn,
                        esc(p.call.as_deref().unwrap_or("-"))
                    );
                }
            }
            b.push_str("</tbody></table>\n");
        }
        b.push_str("</section>\n");
    }
    // The steps, as a table (the chart's data, for screen readers too).
    b.push_str("<section aria-labelledby=\"steps\"><h2 id=\"steps\">Steps</h2><details><summary>Every step's measure</summary>\n");
    b.push_str("<table><thead><tr><th class=\"n\">turn</th><th class=\"n\">step</th><th class=\"n\">context tokens</th><th>measure</th><th class=\"n\">waited for a summary (ms)</th></tr></thead><tbody>\n");
    for p in &points {
        let _ = writeln!(
            b,
            "<tr data-step-id=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            p.step_id,
            p.turn,
            p.step,
            num(p.tokens),
            if p.estimated { "estimated" } else { "reported" },
            p.waited_ms.map_or("-".into(), num)
        );
    }
    b.push_str("</tbody></table></details></section>\n");
    Ok(page(
        &format!("abridge: session {}", session.external_id),
        &b,
    ))
}

fn point(turn: i64, s: &StepRow) -> Option<Point> {
    Some(Point {
        turn,
        step: s.idx,
        step_id: s.id.0,
        tokens: s.context_tokens?,
        estimated: s.estimated,
        waited_ms: s.summary_wait_ms,
        compaction_id: s.compaction_id.map(|c| c.0),
    })
}

/// Input tokens not sent thanks to the summaries: for every step that read a
/// completed compaction, the tokens of the span it folded less the summary's.
fn tokens_not_sent(points: &[Point], compactions: &[CompactionRow]) -> i64 {
    let by_id: HashMap<i64, &CompactionRow> = compactions.iter().map(|c| (c.id.0, c)).collect();
    points
        .iter()
        .filter_map(|p| by_id.get(&p.compaction_id?))
        .filter(|c| c.status == CompactionStatus::Completed)
        .filter_map(|c| Some((c.tokens_before? - c.tokens_after?).max(0)))
        .sum()
}

/// A horizontal line of the chart: its class, label and tokens, and whether
/// it is a default rather than a value the host gave.
struct Level {
    class: &'static str,
    label: String,
    tokens: u64,
}

/// The thresholds drawn: those given on the command line, else those the
/// store recorded when the session's newest compaction was claimed (schema
/// version 8); for an older store whose compactions ran in the background,
/// the engine's default share of the hard one (said as such).
fn levels(opts: &ReportOptions, compactions: &[CompactionRow]) -> Vec<Level> {
    let recorded = compactions
        .iter()
        .rev()
        .find(|c| c.threshold_tokens.is_some());
    let as_tokens = |t: i64| u64::try_from(t).ok();
    let hard = opts.threshold.or_else(|| {
        recorded
            .and_then(|c| c.threshold_tokens)
            .and_then(as_tokens)
    });
    let mut out = Vec::new();
    if let Some(t) = hard {
        out.push(Level {
            class: "hard",
            label: "threshold".into(),
            tokens: t,
        });
    }
    let soft = opts.soft_threshold.or_else(|| {
        recorded
            .and_then(|c| c.soft_threshold_tokens)
            .and_then(as_tokens)
    });
    if let Some(t) = soft {
        out.push(Level {
            class: "soft",
            label: "soft threshold".into(),
            tokens: t,
        });
    } else if let (Some(h), true) = (hard, compactions.iter().any(|c| c.background)) {
        let background = abridge::compaction::Background::default();
        out.push(Level {
            class: "soft",
            label: format!(
                "soft threshold (default {:.0}%)",
                background.soft_share * 100.0
            ),
            tokens: background.soft_tokens(h),
        });
    }
    out
}

/// Tool calls of a session by effect mode.
fn effect_counts(conn: &Connection, session: SessionId) -> Result<Vec<(String, i64)>> {
    let mut q = conn.prepare(
        "SELECT i.effect, count(*) FROM tool_invocations i JOIN steps s ON i.step_id = s.id \
         JOIN turns t ON s.turn_id = t.id WHERE t.session_id = ?1 GROUP BY i.effect ORDER BY i.effect",
    )?;
    let rows = q.query_map([session], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// For each compaction read, the index (in `points`) of the first step that
/// read it.
fn first_readers(points: &[Point]) -> HashMap<i64, usize> {
    let mut readers = HashMap::new();
    for (i, p) in points.iter().enumerate() {
        if let Some(c) = p.compaction_id {
            readers.entry(c).or_insert(i);
        }
    }
    readers
}

fn chart(
    points: &[Point],
    readers: &HashMap<i64, usize>,
    compactions: &[CompactionRow],
    levels: &[Level],
    window: Option<u64>,
) -> String {
    // Compaction labels stand in the band above the plot.
    let (w, h) = (960.0_f64, 500.0_f64);
    let (left, right, top, bottom) = (70.0, 150.0, 120.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max_tokens = points
        .iter()
        .map(|p| p.tokens as f64)
        .chain(levels.iter().map(|l| l.tokens as f64))
        // The window is drawn only when it is within reach of the measure.
        .chain(
            window
                .map(|x| x as f64)
                .filter(|x| points.iter().any(|p| p.tokens as f64 * 4.0 >= *x)),
        )
        .fold(1.0_f64, f64::max)
        * 1.08;
    let n = points.len().max(2) as f64;
    let x = |i: usize| left + pw * (i as f64) / (n - 1.0);
    let y = |t: f64| top + ph - ph * t / max_tokens;
    let reported = points.iter().filter(|p| !p.estimated).count();
    let waited = points.iter().filter(|p| p.waited_ms.is_some()).count();
    let marked: Vec<(&CompactionRow, usize)> = compactions
        .iter()
        .filter_map(|c| readers.get(&c.id.0).map(|i| (c, *i)))
        .collect();
    let mut s = String::new();
    let _ = write!(
        s,
        "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" role=\"img\" \
         aria-labelledby=\"chart-title chart-desc\">\n<title id=\"chart-title\">Context tokens per step</title>\n\
         <desc id=\"chart-desc\">{} steps, {} with provider-reported tokens and {} estimated; peak {} tokens; \
         {} compactions marked at the first step that read each; {} steps waited for a summary.</desc>\n",
        points.len(),
        reported,
        points.len() - reported,
        num(points.iter().map(|p| p.tokens).max().unwrap_or(0)),
        marked.len(),
        waited
    );
    // Axes and grid, at round steps.
    let step = nice_step(max_tokens / 4.0);
    let ticks = (0..)
        .map(|k| k as f64 * step)
        .take_while(|t| *t <= max_tokens);
    for t in ticks {
        let yy = y(t);
        let _ = writeln!(
            s,
            "<line class=\"grid\" x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left + pw,
            left - 6.0,
            yy + 4.0,
            num(t.round() as i64)
        );
    }
    let _ = writeln!(
        s,
        "<line class=\"axis\" x1=\"{left}\" x2=\"{left}\" y1=\"{top}\" y2=\"{}\"/>\
         <line class=\"axis\" x1=\"{left}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">turn (each dot a step, in order)</text>\
         <text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">context tokens</text>",
        top + ph,
        left + pw,
        top + ph,
        top + ph,
        left + pw / 2.0,
        h - 6.0,
        top + ph / 2.0,
        top + ph / 2.0
    );
    // Turns on the axis: a tick at each turn's first step, labelled for at
    // most a dozen of them.
    let firsts: Vec<(usize, i64)> = points
        .iter()
        .enumerate()
        .filter(|(i, p)| *i == 0 || points[i - 1].turn != p.turn)
        .map(|(i, p)| (i, p.turn))
        .collect();
    let every = firsts.len().div_ceil(12).max(1);
    for (k, (i, turn)) in firsts.iter().enumerate() {
        let xx = x(*i);
        let label = if k % every == 0 {
            format!(
                "<text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{turn}</text>",
                top + ph + 30.0
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "<g class=\"tick\" data-turn=\"{turn}\"><line class=\"axis\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" \
             y1=\"{}\" y2=\"{}\"/>{label}</g>",
            top + ph,
            top + ph + 4.0
        );
    }
    // The window and the thresholds, labelled at the right.
    let window_level = window.filter(|v| (*v as f64) <= max_tokens).map(|v| Level {
        class: "window",
        label: "window (the ceiling)".into(),
        tokens: v,
    });
    for l in window_level.iter().chain(levels) {
        let yy = y(l.tokens as f64);
        let _ = writeln!(
            s,
            "<g class=\"level\" data-level=\"{}\" data-tokens=\"{}\"><line class=\"{}\" x1=\"{left}\" x2=\"{}\" \
             y1=\"{yy:.1}\" y2=\"{yy:.1}\"/><text x=\"{}\" y=\"{:.1}\">{} {}</text></g>",
            l.class,
            l.tokens,
            l.class,
            left + pw,
            left + pw + 6.0,
            yy + 4.0,
            esc(&l.label),
            num(l.tokens as i64)
        );
    }
    // The measure.
    let path: Vec<String> = points
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{:.1},{:.1}", x(i), y(p.tokens as f64)))
        .collect();
    if !path.is_empty() {
        let _ = writeln!(
            s,
            "<polyline class=\"measure\" points=\"{}\"/>",
            path.join(" ")
        );
    }
    for (i, p) in points.iter().enumerate() {
        let _ = writeln!(
            s,
            "<circle class=\"point{}\" data-step-id=\"{}\" data-tokens=\"{}\" data-estimated=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\">\
             <title>turn {}, step {}: {} tokens ({})</title></circle>",
            if p.estimated { " estimated" } else { "" },
            p.step_id,
            p.tokens,
            p.estimated,
            x(i),
            y(p.tokens as f64),
            p.turn,
            p.step,
            num(p.tokens),
            if p.estimated { "estimated" } else { "reported" }
        );
        if let Some(ms) = p.waited_ms {
            let (cx, cy) = (x(i), top + ph + 12.0);
            let _ = writeln!(
                s,
                "<path class=\"wait\" data-step-id=\"{}\" data-waited-ms=\"{ms}\" d=\"M{:.1},{:.1} l5,8 l-10,0 z\">\
                 <title>step {} waited {} ms for a summary</title></path>",
                p.step_id,
                cx,
                cy - 8.0,
                p.step_id,
                num(ms)
            );
        }
    }
    // Compactions, each at the first step that read it, labelled with the
    // context as plotted just before that step and at it.
    for (n, (c, i)) in marked.iter().enumerate() {
        let xx = x(*i);
        let reader = &points[*i];
        let before = i.checked_sub(1).map(|k| points[k].tokens);
        let label = format!(
            "C{} {}→{}",
            n + 1,
            before.map_or("?".into(), num),
            num(reader.tokens)
        );
        let _ = writeln!(
            s,
            "<g class=\"compaction\" data-compaction-id=\"{}\" data-step-id=\"{}\" data-context-before=\"{}\" \
             data-context-after=\"{}\" data-tokens-before=\"{}\" data-tokens-after=\"{}\">\
             <line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{top}\" y2=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" transform=\"rotate(-90 {:.1} {:.1})\">{}</text>\
             <title>compaction up to turn {} ({}), first read at turn {} step {}: the context went from {} \
             to {} tokens; the turns it folded were {} tokens, its summary {}</title></g>",
            c.id.0,
            reader.step_id,
            before.map_or(String::new(), |t| t.to_string()),
            reader.tokens,
            c.tokens_before.map_or(String::new(), |t| t.to_string()),
            c.tokens_after.map_or(String::new(), |t| t.to_string()),
            top + ph,
            xx + 4.0,
            top - 4.0,
            xx + 4.0,
            top - 4.0,
            esc(&label),
            c.up_to_turn_index,
            esc(&trigger(c)),
            reader.turn,
            reader.step,
            before.map_or("?".into(), num),
            num(reader.tokens),
            c.tokens_before.map_or("?".into(), num),
            c.tokens_after.map_or("?".into(), num)
        );
    }
    s.push_str("</svg>\n<figcaption class=\"muted\">Line: each step's context measure, the x axis \
        numbered by turn; filled dots reported by the provider, hollow dots estimated. Dashed: the \
        threshold; dotted: the soft threshold at which a summary starts in the background. Both are \
        triggers checked before a turn's steps, not ceilings: a turn whose tool results are long can \
        carry its later steps above them, and the next turn is compacted. Solid: the model's window, \
        the one ceiling. Vertical marks: a compaction, at the first step that read it, labelled with \
        the context just before that step → at it (the turns it folded and its summary are in the \
        table). Triangles under the axis: steps that waited for a summary.</figcaption></figure>\n");
    s
}

/// The smallest of 1, 2, 2.5 and 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= raw)
        .unwrap_or(10.0 * mag)
}

fn trigger(c: &CompactionRow) -> String {
    if c.background {
        "background".into()
    } else {
        c.trigger.clone()
    }
}

fn compaction_table(
    conn: &Connection,
    session: SessionId,
    compactions: &[CompactionRow],
    points: &[Point],
    readers: &HashMap<i64, usize>,
) -> Result<String> {
    let mut s = String::from(
        "<section aria-labelledby=\"compactions\"><h2 id=\"compactions\">Compactions</h2>\n",
    );
    if compactions.is_empty() {
        s.push_str("<p>None.</p></section>\n");
        return Ok(s);
    }
    s.push_str(
        "<table><thead><tr><th class=\"n\">up to turn</th><th>status</th><th>trigger</th><th>summariser</th>\
         <th class=\"n\">attempts</th><th class=\"n\">folded turns (tokens)</th><th class=\"n\">summary (tokens)</th>\
         <th class=\"n\">time (ms)</th><th>first read at</th></tr></thead><tbody>\n",
    );
    for c in compactions {
        let reader = readers.get(&c.id.0).map(|i| &points[*i]);
        let _ = writeln!(
            s,
            "<tr data-compaction-id=\"{}\"><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            c.id.0,
            c.up_to_turn_index,
            esc(&c.status.to_string()),
            esc(&trigger(c)),
            esc(c.model.as_deref().unwrap_or("-")),
            c.attempts,
            c.tokens_before.map_or("-".into(), num),
            c.tokens_after.map_or("-".into(), num),
            c.completed_at
                .map_or("-".into(), |done| num(done - c.created_at)),
            reader.map_or("not read yet".into(), |r| format!("turn {}, step {}", r.turn, r.step))
        );
    }
    s.push_str("</tbody></table>\n");
    for c in compactions {
        let Some(summary) = &c.summary else { continue };
        let window = c
            .pins_window
            .map_or(abridge::pins::DEFAULT_PINS_WINDOW, |w| w.max(0) as usize);
        let pins = if c.pins_live.is_some() {
            inspect::live_pins(conn, session, c.up_to_turn_index, window)?
        } else {
            Vec::new()
        };
        let _ = write!(
            s,
            "<details data-summary-of=\"{}\"><summary>Summary up to turn {} ({} characters, {} facts carried)</summary>\n<pre>{}</pre>\n",
            c.id.0,
            c.up_to_turn_index,
            num(summary.chars().count() as i64),
            pins.len(),
            esc(summary)
        );
        if !pins.is_empty() {
            s.push_str("<ul>");
            for p in &pins {
                let _ = write!(s, "<li>{}</li>", esc(p.line(true).trim_start_matches("- ")));
            }
            s.push_str("</ul>\n");
        }
        s.push_str("</details>\n");
    }
    s.push_str("</section>\n");
    Ok(s)
}

/// What the store page draws of one session.
struct SessionLine {
    summary: SessionSummary,
    /// Each executed step's context measure, in order.
    measures: Vec<i64>,
    /// When its first turn began and its last one ended (or began).
    span: Option<(i64, i64)>,
    /// When each completed compaction completed.
    compacted_at: Vec<i64>,
    /// When each failed turn began.
    failed_at: Vec<i64>,
    /// Steps that waited for a summary, and the milliseconds in all.
    waits: (i64, i64),
}

fn session_line(conn: &Connection, summary: SessionSummary) -> Result<SessionLine> {
    let key = format!("id:{}", summary.session.id);
    let detail = inspect::session_detail(conn, &key)?;
    let mut measures = Vec::new();
    let mut waits = (0, 0);
    for t in &detail.turns {
        for s in inspect::steps(conn, t.turn.id)? {
            measures.extend(s.context_tokens);
            if let Some(ms) = s.summary_wait_ms {
                waits = (waits.0 + 1, waits.1 + ms);
            }
        }
    }
    let start = detail.turns.iter().map(|t| t.turn.created_at).min();
    let end = detail
        .turns
        .iter()
        .map(|t| t.turn.finished_at.unwrap_or(t.turn.created_at))
        .max();
    Ok(SessionLine {
        measures,
        span: start.zip(end),
        compacted_at: detail
            .compactions
            .iter()
            .filter(|c| c.status == CompactionStatus::Completed)
            .filter_map(|c| c.completed_at)
            .collect(),
        failed_at: detail
            .turns
            .iter()
            .filter(|t| t.turn.status == abridge::store::TurnStatus::Failed)
            .map(|t| t.turn.created_at)
            .collect(),
        waits,
        summary,
    })
}

/// A small chart of a session's context per step (no axes: its peak is in
/// the table beside it).
fn sparkline(measures: &[i64]) -> String {
    let (w, h) = (160.0_f64, 28.0_f64);
    let max = measures.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = measures.len().max(2) as f64;
    let points: Vec<String> = measures
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "{:.1},{:.1}",
                w * i as f64 / (n - 1.0),
                h - 2.0 - (h - 4.0) * *t as f64 / max
            )
        })
        .collect();
    format!(
        "<svg class=\"spark\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" \
         role=\"img\" aria-label=\"context per step, {} steps, peak {} tokens\" data-steps=\"{}\">\
         <polyline class=\"measure\" points=\"{}\"/></svg>",
        measures.len(),
        num(max as i64),
        measures.len(),
        points.join(" ")
    )
}

/// A time in ms since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn when(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The sessions on one time axis: each a bar from its first turn to its
/// last, compactions as ticks, failed turns as crosses.
fn timeline(lines: &[SessionLine]) -> String {
    let spans: Vec<(i64, i64)> = lines.iter().filter_map(|l| l.span).collect();
    let (Some(t0), Some(t1)) = (
        spans.iter().map(|s| s.0).min(),
        spans.iter().map(|s| s.1).max(),
    ) else {
        return "<p>No turns yet.</p>\n".into();
    };
    let (left, right, row) = (180.0_f64, 20.0_f64, 22.0_f64);
    let w = 960.0_f64;
    let h = 40.0 + row * lines.len() as f64;
    let pw = w - left - right;
    let x = |t: i64| left + pw * ((t - t0) as f64 / (t1 - t0).max(1) as f64);
    let mut s = format!(
        "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" role=\"img\" \
         aria-labelledby=\"timeline-title\"><title id=\"timeline-title\">Sessions over time, from {} to {}</title>\n",
        esc(&when(t0)),
        esc(&when(t1))
    );
    for (k, l) in lines.iter().enumerate() {
        let yy = 20.0 + row * k as f64;
        let _ = write!(
            s,
            "<g class=\"session\" data-session-id=\"{}\" data-compactions=\"{}\" data-failed=\"{}\">\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            l.summary.session.id,
            l.compacted_at.len(),
            l.failed_at.len(),
            left - 8.0,
            yy + 4.0,
            esc(&l.summary.session.external_id)
        );
        if let Some((a, b)) = l.span {
            let _ = write!(
                s,
                "<line class=\"measure\" x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke-width=\"6\"/>",
                x(a),
                x(b).max(x(a) + 2.0)
            );
        }
        for t in &l.compacted_at {
            let xx = x(*t);
            let _ = write!(
                s,
                "<line class=\"mark\" x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>",
                yy - 8.0,
                yy + 8.0
            );
        }
        for t in &l.failed_at {
            let xx = x(*t);
            let _ = write!(
                s,
                "<path class=\"wait\" d=\"M{:.1},{:.1} l8,8 m0,-8 l-8,8\" stroke-width=\"2\"/>",
                xx - 4.0,
                yy - 4.0
            );
        }
        s.push_str("</g>\n");
    }
    let span =
        humantime::format_duration(std::time::Duration::from_millis((t1 - t0).max(0) as u64));
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"{:.1}\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} in all</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
        h - 4.0,
        esc(&when(t0)),
        left + pw / 2.0,
        h - 4.0,
        esc(&span.to_string()),
        w - right,
        h - 4.0,
        esc(&when(t1))
    );
    s.push_str(
        "</svg><figcaption class=\"muted\">Each bar: a session, from its first turn's start to its \
         last turn's end. Vertical ticks: compactions, when each completed. Crosses: failed turns, \
         when each began.</figcaption></figure>\n",
    );
    s
}

/// The store's page: its totals, a timeline of its sessions, and every
/// session (turns, steps, tool calls, compactions, failed turns, waits,
/// context now, cached share, a small chart of its context), each linking to
/// `link(session)`.
pub fn store_page(conn: &Connection, link: &dyn Fn(&SessionSummary) -> String) -> Result<String> {
    let lines = inspect::sessions(conn)?
        .into_iter()
        .map(|s| session_line(conn, s))
        .collect::<Result<Vec<_>>>()?;
    let sum = |f: &dyn Fn(&SessionLine) -> i64| lines.iter().map(f).sum::<i64>();
    let mut b = String::new();
    let _ = writeln!(
        b,
        "<header><h1>abridge store</h1><p class=\"muted\">{} sessions</p></header>",
        lines.len()
    );
    b.push_str(
        "<section aria-labelledby=\"totals\"><h2 id=\"totals\">Totals</h2><div class=\"totals\">\n",
    );
    let waits = (sum(&|l| l.waits.0), sum(&|l| l.waits.1));
    for (name, label, value) in [
        ("sessions", "sessions", num(lines.len() as i64)),
        ("turns", "turns", num(sum(&|l| l.summary.counts.turns))),
        (
            "turns_failed",
            "turns failed",
            num(sum(&|l| l.summary.counts.turns_failed)),
        ),
        ("steps", "steps", num(sum(&|l| l.summary.counts.steps))),
        (
            "tool_calls",
            "tool calls",
            num(sum(&|l| l.summary.counts.tool_calls)),
        ),
        (
            "compactions",
            "compactions completed",
            num(sum(&|l| l.summary.counts.compactions_completed)),
        ),
        (
            "waits",
            "steps waited for a summary",
            format!("{} ({} ms)", num(waits.0), num(waits.1)),
        ),
    ] {
        let _ = writeln!(
            b,
            "<div data-total=\"{name}\"><b>{}</b>{}</div>",
            esc(&value),
            esc(label)
        );
    }
    b.push_str("</div></section>\n");
    b.push_str("<section aria-labelledby=\"timeline\"><h2 id=\"timeline\">Timeline</h2>\n");
    b.push_str(&timeline(&lines));
    b.push_str("</section>\n");
    b.push_str(
        "<section aria-labelledby=\"sessions\"><h2 id=\"sessions\">Sessions</h2>\n<table><thead><tr>\
         <th>session</th><th>model</th><th class=\"n\">turns</th><th class=\"n\">failed turns</th>\
         <th class=\"n\">steps</th><th class=\"n\">tool calls</th><th class=\"n\">compactions</th>\
         <th class=\"n\">waits (ms)</th><th class=\"n\">context now</th><th class=\"n\">cached input</th>\
         <th>context per step</th><th>first turn</th></tr></thead><tbody>",
    );
    for l in &lines {
        let (s, c) = (&l.summary, &l.summary.counts);
        let _ = writeln!(
            b,
            "<tr data-session-id=\"{}\"><td><a href=\"{}\">{}</a></td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{} ({})</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            s.session.id,
            esc(&link(s)),
            esc(&s.session.external_id),
            esc(&s.session.model),
            num(c.turns),
            num(c.turns_failed),
            num(c.steps),
            num(c.tool_calls),
            num(c.compactions_completed),
            num(l.waits.0),
            num(l.waits.1),
            c.context_tokens.map_or("-".into(), num),
            c.cached_input_share()
                .map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
            sparkline(&l.measures),
            l.span.map_or("-".into(), |(a, _)| esc(&when(a)))
        );
    }
    b.push_str("</tbody></table></section>\n");
    Ok(page("abridge: store", &b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html_and_xml() {
        assert_eq!(
            esc("<a href=\"x\">&'\u{1}"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;\u{FFFD}"
        );
        assert_eq!(num(1234567), "1,234,567");
        assert_eq!(num(-1000), "-1,000");
        assert_eq!(num(999), "999");
        assert_eq!(nice_step(1240.0), 2000.0);
        assert_eq!(nice_step(1000.0), 1000.0);
        assert_eq!(nice_step(2100.0), 2500.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(when(0), "1970-01-01T00:00:00Z");
        assert_eq!(when(1_796_154_460_516), "2026-12-01T19:47:40Z");
    }
}
