//! `abridge inspect`: the sessions of a store, or one session's turns and compactions.

use crate::common::{print_json, Failure};
use abridge::inspect;
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id.
    pub session: Option<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args { db, session, json } = args;
    match session {
        None => {
            let all = crate::common::read_only(&db, inspect::sessions)?;
            if json {
                print_json(&all);
            } else {
                print_sessions(&all);
            }
        }
        Some(key) => {
            let d = crate::common::read_only(&db, |c| inspect::session_detail(c, &key))
                .map_err(|e| Failure::session(&key, e))?;
            if json {
                print_json(&d);
            } else {
                print_session(&d);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `s` padded with spaces to `width` columns of a terminal (wide characters
/// take two columns, combining marks none).
fn pad(s: &str, width: usize) -> String {
    let w = unicode_width::UnicodeWidthStr::width(s);
    format!("{s}{}", " ".repeat(width.saturating_sub(w)))
}

fn print_sessions(all: &[inspect::SessionSummary]) {
    println!(
        "{:>4}  {} {} {:>6} {:>6} {:>6} {:>11} {:>9} {:>7}",
        "id",
        pad("external id", 20),
        pad("model", 20),
        "turns",
        "steps",
        "tools",
        "compactions",
        "context",
        "cached"
    );
    for s in all {
        println!(
            "{:>4}  {} {} {:>6} {:>6} {:>6} {:>11} {:>9} {:>7}",
            s.session.id,
            pad(&s.session.external_id, 20),
            pad(&s.session.model, 20),
            s.counts.turns,
            s.counts.steps,
            s.counts.tool_calls,
            s.counts.compactions_completed,
            s.counts
                .context_tokens
                .map_or("-".into(), |t| t.to_string()),
            cached(&s.counts)
        );
    }
}

/// The share of input tokens read from the provider's prompt cache, or `-`.
fn cached(c: &abridge::store::SessionCounts) -> String {
    c.cached_input_share()
        .map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
}

fn print_session(d: &inspect::SessionDetail) {
    let s = &d.summary.session;
    println!("session {} (id {}), model {}", s.external_id, s.id, s.model);
    if let (Some(p), Some(name)) = (&s.parent, &d.parent_external_id) {
        match p.kind {
            abridge::store::ParentKind::Fork => println!(
                "fork of {name} (id {}) at turn {}: turns 0-{} are its, read where they are{}",
                p.session_id,
                p.turn,
                p.turn,
                s.base_compaction
                    .map(|c| format!("; reads its compaction {c} until one of its own"))
                    .unwrap_or_default()
            ),
            _ => println!(
                "delegated by {name} (id {}): runs tool call {} of its turn {}",
                p.session_id,
                p.call.as_deref().unwrap_or("-"),
                p.turn
            ),
        }
    }
    if !d.children.is_empty() {
        println!("children:");
        for c in &d.children {
            if let Some(p) = &c.parent {
                match p.kind {
                    abridge::store::ParentKind::Fork => {
                        println!("  fork {} (id {}) at turn {}", c.external_id, c.id, p.turn)
                    }
                    _ => println!(
                        "  delegated {} (id {}) for call {} of turn {}",
                        c.external_id,
                        c.id,
                        p.call.as_deref().unwrap_or("-"),
                        p.turn
                    ),
                }
            }
        }
    }
    let counts = &d.summary.counts;
    if let (Some(input), Some(read), Some(write)) = (
        counts.cache_input_tokens,
        counts.cache_read_tokens,
        counts.cache_write_tokens,
    ) {
        println!(
            "prompt cache: {} of {input} input tokens read from the cache ({read}), {write} written",
            cached(counts)
        );
    }
    println!("\nturns:");
    println!(
        "  {:>4}  {} {:<13}  input",
        "turn",
        pad("status", 9),
        "step ids"
    );
    for t in &d.turns {
        let ids = match t.step_ids.as_slice() {
            [] => "-".to_string(),
            [one] => one.to_string(),
            [first, .., last] if last.0 - first.0 + 1 == t.step_ids.len() as i64 => {
                format!("{first}-{last}")
            }
            many => many
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        let parked = d
            .approvals
            .iter()
            .any(|a| a.turn_id == t.turn.id && a.status == abridge::store::ApprovalStatus::Pending);
        let status = match parked {
            true => "parked".to_string(),
            false => t.turn.status.to_string(),
        };
        println!(
            "  {:>4}  {} {:<13}  {}",
            t.turn.idx,
            pad(&status, 9),
            ids,
            abridge::compaction::truncate_chars(&t.turn.input.replace('\n', " "), 60)
        );
    }
    println!("\ncompactions:");
    let mut previous: Option<(i64, bool)> = None;
    let mut before: Option<&str> = None;
    for c in &d.compactions {
        // (As verify counts them: not after a summary made in the background,
        // read late with the turns that ran while it was made.)
        let close = c.status == abridge::store::CompactionStatus::Completed
            && c.trigger == "auto"
            && previous.is_some_and(|(p, bg)| !bg && c.up_to_turn_index - p <= 1);
        if c.status == abridge::store::CompactionStatus::Completed {
            previous = Some((c.up_to_turn_index, c.background));
        }
        let trigger = if c.background {
            "background"
        } else {
            c.trigger.as_str()
        };
        let new = c.summary.as_deref().map(|s| first_new_line(s, before));
        if c.status == abridge::store::CompactionStatus::Completed {
            before = c.summary.as_deref();
        }
        println!(
            "  up to turn {:>4}  {} attempts {} trigger {} tokens {} -> {} pins {}  {}",
            c.up_to_turn_index,
            pad(&c.status.to_string(), 9),
            c.attempts,
            pad(trigger, 10),
            c.tokens_before.map_or("-".into(), |t| t.to_string()),
            c.tokens_after.map_or("-".into(), |t| t.to_string()),
            c.pins_live.map_or("-".into(), |t| t.to_string()),
            new.map_or(String::new(), |n| abridge::compaction::truncate_chars(
                &n, 60
            ))
        );
        if close {
            println!("    ^ one turn after the previous compaction: the summary left no room");
        }
        if c.status == abridge::store::CompactionStatus::Completed
            && c.pins_live.is_some()
            && c.pins_window == Some(0)
        {
            println!(
                "    ^ the pins live for good filled their share: no fact mentioned in passing \
                 was carried (a higher threshold or pins_max_share gives them room)"
            );
        }
    }
    println!("\npinned facts (live):");
    for p in &d.live_pins {
        println!(
            "  {}",
            abridge::compaction::truncate_chars(p.line(true).trim_start_matches("- "), 100)
        );
    }
    if !d.approvals.is_empty() {
        // The turn a call belongs to, by index.
        let idx = |tid| {
            d.turns
                .iter()
                .find(|t| t.turn.id == tid)
                .map_or(-1, |t| t.turn.idx)
        };
        let now = now_ms();
        println!("\ntool calls that waited for a decision or a result:");
        for a in &d.approvals {
            let waited = abridge::text::human_duration_ms(a.waited_ms(now));
            let by = match a.decided_by.as_deref() {
                Some(b) if b.starts_with("always allowed") => format!(", {b}"),
                Some(b) => format!(" by {b}"),
                None => String::new(),
            };
            let edited = if a.input.is_some() {
                ", arguments edited"
            } else {
                ""
            };
            let verb = match a.status {
                abridge::store::ApprovalStatus::Pending => "waiting for",
                _ => "waited",
            };
            println!(
                "  call {:>4}  turn {:>4}  {:<18} {:<10} {verb} {waited}{by}{edited}",
                a.id,
                idx(a.turn_id),
                a.tool_name,
                a.status.to_string(),
            );
        }
    }
    if !d.redactions.is_empty() {
        println!("\nredactions:");
        for r in &d.redactions {
            println!(
                "  {:>3}  at {} ms  {} sha256 {}…  {} occurrences, {} steps rebuild with the marker, {} turns fenced",
                r.id,
                r.at,
                r.pattern_kind,
                &r.pattern_sha256[..r.pattern_sha256.len().min(12)],
                r.occurrences,
                r.steps_rebuilt,
                r.turns_fenced
            );
        }
    }
}

/// What a summary says that the one before it did not: its first line (not
/// a heading) absent from `before`, marked `new:`; every summary begins with
/// the oldest facts, so its head alone is the same row after row.
fn first_new_line(summary: &str, before: Option<&str>) -> String {
    let old: std::collections::HashSet<&str> =
        before.map_or_else(Default::default, |b| b.lines().map(str::trim).collect());
    summary
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !old.contains(l))
        .map_or("(no line the previous summary lacks)".into(), |l| {
            format!("new: {}", l.trim_start_matches("- "))
        })
}

/// Now, ms since the epoch (how long a waiting call has waited).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
