//! What a manual compaction would do, computed without writing: the plan
//! (boundary, the row already there), the tokens it would replace and the
//! expected size of the summary ([`preview`], `abridge compact --dry-run`).

use super::config::CompactionConfig;
use super::offline::extract;
use super::summarise::{transcript_entries, SummaryRequest};
use super::{clean_summary, message_tokens};
use crate::error::{Error, Result};
use crate::ids::{CompactionId, SessionId};
use crate::pins::Pin;
use crate::render::SummaryView;
use crate::store::{self, CompactionRow, CompactionStatus};

/// Where a manual compaction would go.
pub(super) struct ManualPlan {
    pub(super) boundary: i64,
    pub(super) existing: Option<CompactionRow>,
    pub(super) latest: Option<CompactionRow>,
}

/// What a manual compaction would do ([`preview`]); nothing is
/// written to make it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompactionPreview {
    /// The session.
    pub session_id: SessionId,
    /// Turns up to this one would be folded.
    pub boundary: i64,
    /// The first turn folded (the ones before are in the previous summary).
    pub folds_from_turn: i64,
    /// The previous compaction folded in, if any.
    pub previous_compaction: Option<CompactionId>,
    /// Tokens of what the summary would replace (previous summary and turns).
    pub tokens_before: u64,
    /// Expected tokens of the summary (the offline summariser's, with the
    /// guard's block).
    pub expected_tokens_after: u64,
    /// The cap on the summariser's text, chars.
    pub summary_cap_chars: usize,
    /// The live pins it would carry (G8).
    pub pins: Vec<Pin>,
    /// The completed compaction already at this boundary (then nothing
    /// would happen, and the figures are that row's).
    pub already_compacted: Option<CompactionId>,
}

/// The boundary a manual compaction of the session would use now (every
/// turn, less the kept recent ones), with the row already there, if any.
pub(super) fn manual_plan(
    config: &CompactionConfig,
    c: &crate::store::Connection,
    session_id: SessionId,
) -> Result<ManualPlan> {
    let session = store::get_session(c, session_id)?;
    let keep_recent = config.recent_tokens(
        config
            .compact_at
            .tokens(config.context_window(&session.model)),
    );
    let turns = store::list_turns(c, session_id)?;
    if let Some(r) = turns
        .iter()
        .find(|t| t.status == crate::store::TurnStatus::Running)
    {
        return Err(Error::TurnRunning {
            session_id,
            running_idx: r.idx,
        });
    }
    let last = turns.last().map_or(-1, |t| t.idx);
    let latest = store::latest_completed(c, session_id, i64::MAX)?;
    let by_count = last - config.keep_last_turns as i64;
    let folds = |b: i64| b >= 0 && latest.as_ref().is_none_or(|l| l.up_to_turn_index <= b);
    let mut b = by_count;
    if keep_recent > 0 && b >= 0 {
        let after = latest.as_ref().map_or(-1, |l| l.up_to_turn_index);
        b = store::recent_window_boundary(c, session_id, last + 1, after, b, keep_recent)?;
        // Asked for, a compaction folds what it can: when the whole rest
        // fits the verbatim tail, the tail gives way to the turns kept by
        // count (an automatic one waits until the tail is full instead).
        if !folds(b) {
            b = by_count;
        }
    }
    if !folds(b) {
        return Err(Error::NothingToCompact { session_id });
    }
    Ok(ManualPlan {
        boundary: b,
        existing: store::compaction_at(c, session_id, b)?,
        latest,
    })
}

/// What a manual compaction of the session would do now, without writing
/// anything: the turns it would fold, the tokens before and the expected
/// tokens after, and the pinned facts it would carry. Read-only; runs on
/// any connection (a read-only one too).
///
/// The expected size is the built-in offline summariser's summary with
/// the user's own words and the guard's block, a deterministic estimate: a model summariser's
/// answer is at most [`CompactionConfig::summary_chars`] plus the block.
pub fn preview(
    config: &CompactionConfig,
    c: &crate::store::Connection,
    session_id: SessionId,
    focus: Option<&str>,
) -> Result<CompactionPreview> {
    let plan = manual_plan(config, c, session_id)?;
    let session = store::get_session(c, session_id)?;
    if let Some(row) = plan
        .existing
        .as_ref()
        .filter(|r| r.status == CompactionStatus::Completed)
    {
        return Ok(CompactionPreview {
            session_id,
            boundary: plan.boundary,
            folds_from_turn: plan.latest.as_ref().map_or(0, |l| l.up_to_turn_index + 1),
            previous_compaction: plan.latest.as_ref().map(|l| l.id),
            tokens_before: row.tokens_before.unwrap_or(0).max(0) as u64,
            expected_tokens_after: row.tokens_after.unwrap_or(0).max(0) as u64,
            summary_cap_chars: config.summary_chars(&session.model),
            pins: store::live_pins(
                c,
                session_id,
                plan.boundary,
                row.pins_window
                    .map_or(config.pins_window, |w| usize::try_from(w).unwrap_or(0)),
            )?,
            already_compacted: Some(row.id),
        });
    }
    let prev = match &plan.latest {
        Some(l) => Some(store::get_compaction(c, l.id)?),
        None => None,
    };
    let after = prev.as_ref().map_or(-1, |p| p.up_to_turn_index);
    let turns = store::load_history(c, session_id, after, plan.boundary, i64::MAX)?;
    let folded = carried_pins(
        c,
        session_id,
        plan.boundary,
        config.pins_window,
        config.pins_share_chars(&session.model),
    )?;
    let pins = folded.pins;
    let tokens_before = replaced_tokens(config, prev.as_ref(), &turns)?;
    // The user's own words, as the guard would write them.
    let carried = super::user_words::carry(
        prev.as_ref().and_then(|p| p.summary.as_deref()),
        &turns,
        config
            .user_words_chars(&session.model)
            .filter(|_| config.guard_pins),
    );
    let previous = carried.previous;
    let words = super::user_words::render(carried.lines.as_deref().unwrap_or_default());
    let cap = if config.guard_pins {
        config.summary_chars_beside(
            &session.model,
            crate::pins::block_bound_chars(&pins, config.pins_budget_chars) + words.chars().count(),
        )
    } else {
        config.summary_chars(&session.model)
    };
    let cfg = config;
    let request = SummaryRequest {
        rules: String::new(),
        previous,
        transcript: transcript_entries(&turns, cfg.text_cap, cfg.tool_result_cap).join("\n"),
        max_chars: cap,
        focus: focus.map(str::to_string),
    };
    let mut text = clean_summary(&extract(&request), cap);
    let (block, _) =
        crate::pins::render_block(&crate::pins::missing(&pins, &text), cfg.pins_budget_chars);
    if !words.is_empty() {
        text.push_str("\n\n");
        text.push_str(&words);
    }
    let block = crate::pins::with_folded_line(block, folded.folded);
    if !block.is_empty() {
        text.push_str("\n\n");
        text.push_str(&block);
    }
    let expected = message_tokens(
        &*cfg.token_counter,
        &[crate::render::summary_message(SummaryView {
            up_to_turn_index: plan.boundary,
            summary: &text,
        })],
    );
    Ok(CompactionPreview {
        session_id,
        boundary: plan.boundary,
        folds_from_turn: after + 1,
        previous_compaction: prev.as_ref().map(|p| p.id),
        tokens_before,
        expected_tokens_after: expected,
        summary_cap_chars: cap,
        pins,
        already_compacted: None,
    })
}

/// The live pins a compaction at `boundary` carries: those at `window`
/// ([`CompactionConfig::pins_window`]), folded to the pinned facts' share
/// ([`CompactionConfig::pins_share_chars`], [`crate::pins::fold_to_share`]).
pub(crate) fn carried_pins(
    c: &crate::store::Connection,
    session_id: SessionId,
    boundary: i64,
    window: usize,
    share_chars: Option<usize>,
) -> Result<crate::pins::Folded> {
    let live = store::live_pins(c, session_id, boundary, window)?;
    Ok(crate::pins::fold_to_share(live, window, share_chars))
}

/// G7's "before", on one measure: the tokens of what the summary replaces
/// (the previous summary's message and the span's messages), rendered as a
/// step sends them and counted by the counter the summary is counted with.
pub(super) fn replaced_tokens(
    config: &CompactionConfig,
    prev: Option<&CompactionRow>,
    span: &[crate::store::HistoryTurn],
) -> Result<u64> {
    let span_msgs =
        crate::render::build_messages("", None, span, crate::render::RenderFormat::CURRENT)?;
    let mut replaced = Vec::with_capacity(span_msgs.len());
    if let Some(p) = prev {
        replaced.push(crate::render::summary_message(SummaryView {
            up_to_turn_index: p.up_to_turn_index,
            summary: p.summary.as_deref().unwrap_or(""),
        }));
    }
    replaced.extend_from_slice(&span_msgs[1..]);
    Ok(message_tokens(&*config.token_counter, &replaced))
}
