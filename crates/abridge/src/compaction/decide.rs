//! What must happen before a step, decided: a pure function of the facts it
//! asks for and the policy. The heart of G1, G4 and G7 (one row per boundary,
//! never a draft read, the context shrinks): [`decide`] reads no store, no
//! clock and no lease itself. Its caller supplies the [`Facts`] (the
//! compactor's reads the store; the tests below a table), each asked for only
//! when the decision needs it, so a step below the threshold pays for the
//! reads it makes and no more.

use super::config::{Background, BackgroundWorker, FailurePolicy};
use super::planner;
use crate::error::{Error, Result};
use crate::ids::CompactionId;
use crate::store::{CompactionRow, CompactionStatus};

/// What [`decide`] found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Nothing to do: the step reads this completed row (or none).
    Read(Option<CompactionRow>),
    /// Claim (or finish) the row at `boundary`: the step waits for it.
    Claim {
        boundary: i64,
        measure: Option<i64>,
        latest: Option<CompactionRow>,
    },
    /// The step reads `read`; the row at `boundary` is claimed (or an
    /// abandoned one finished) in the background. `soft`: the soft
    /// threshold a new row is claimed under (the session's pace may have
    /// brought it down), recorded on the row; None for a row already there.
    Background {
        boundary: i64,
        measure: Option<i64>,
        soft: Option<i64>,
        read: Option<CompactionRow>,
    },
}

impl Decision {
    fn claim(boundary: i64, measure: Option<i64>, latest: Option<CompactionRow>) -> Decision {
        Decision::Claim {
            boundary,
            measure,
            latest,
        }
    }
}

/// The policy a decision applies, for one step of one turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// The step's turn.
    pub turn_idx: i64,
    /// Turns kept verbatim before the step's turn.
    pub keep_last_turns: u32,
    /// The boundary moves back while the most recent turns fit this many
    /// tokens (0: off; see [`Facts::recent_window_boundary`]).
    pub keep_recent_tokens: u64,
    /// Background compaction (None: off).
    pub background: Option<Background>,
    /// What a failed row at the boundary means.
    pub on_failure: FailurePolicy,
    /// The compaction the turn's earlier steps read: Some(None) for none,
    /// None for a turn's first step (it reads the newest).
    pub prior: Option<Option<CompactionId>>,
    /// Deliberately wrong ([`crate::fault::Sabotage::read_drafts`]): read a
    /// draft another live runner holds instead of the row before it.
    pub read_drafts: bool,
}

/// What a decision may ask of the store and the leases. Each is asked at
/// most once per decision, and only when the decision needs it.
pub(crate) trait Facts {
    /// The newest completed compaction a step of this turn may read.
    fn latest_completed(&mut self) -> Result<Option<CompactionRow>>;
    /// A compaction by id (the one the turn's earlier steps read).
    fn compaction(&mut self, id: CompactionId) -> Result<CompactionRow>;
    /// `boundary` moved back while the turns after `after` and up to it fit
    /// the policy's `keep_recent_tokens` (-1 or less: nothing to compact).
    fn recent_window_boundary(&mut self, after: i64, boundary: i64) -> Result<i64>;
    /// The hard threshold in tokens for this session's model (None: none).
    fn threshold_tokens(&mut self) -> Option<u64>;
    /// The newest measure of the context, and the compaction it was
    /// measured on.
    fn latest_measure(&mut self) -> Result<Option<(i64, Option<CompactionId>)>>;
    /// The row at `boundary`, whatever its status.
    fn compaction_at(&mut self, boundary: i64) -> Result<Option<CompactionRow>>;
    /// The session's newest pending row.
    fn newest_pending(&mut self) -> Result<Option<CompactionRow>>;
    /// Whether a live other (not this compactor, not provably gone) holds
    /// the row's lease.
    fn held_by_live_other(&mut self, row: &CompactionRow) -> bool;
    /// The session's pace: (largest growth of one recent turn, newest
    /// background summary's ms, recent turns' mean ms). Asked for only
    /// between half the hard threshold and the soft one.
    fn pace(&mut self) -> Result<(Option<i64>, Option<i64>, Option<i64>)> {
        Ok((None, None, None))
    }
}

/// What must happen before the step: read a completed row, claim (or
/// finish) one and wait for it, or claim one in the background.
pub(crate) fn decide(p: &Policy, f: &mut impl Facts) -> Result<Decision> {
    let latest = f.latest_completed()?;
    let latest_id = latest.as_ref().map(|l| l.id);
    let base = match p.prior {
        Some(id) if id != latest_id => match id {
            Some(id) => Some(f.compaction(id)?),
            None => None,
        },
        _ => latest.clone(),
    };
    let Some(b) = planner::boundary(p.turn_idx, p.keep_last_turns) else {
        return Ok(Decision::Read(base));
    };
    let b = if p.keep_recent_tokens > 0 {
        let after = latest.as_ref().map_or(-1, |l| l.up_to_turn_index);
        f.recent_window_boundary(after, b)?
    } else {
        b
    };
    if b < 0 {
        return Ok(Decision::Read(base));
    }
    // The newest measure, when it was taken on the compaction this step
    // reads: one taken before a summary it now reads completed (in the
    // background) says nothing of the context after it, and decides
    // nothing; the step's own measure will.
    let base_id = base.as_ref().map(|r| r.id);
    let mut measure = Measure { base_id, got: None };
    if latest.as_ref().is_some_and(|l| l.up_to_turn_index >= b) {
        if base_id == latest_id {
            return Ok(Decision::Read(base));
        }
        // Completed in the background since this turn began.
        let hard = measure.over_hard(f)?.is_some_and(|(over, _)| over);
        return Ok(Decision::Read(if hard { latest } else { base }));
    }
    match f.compaction_at(b)? {
        // Failed earlier in this turn (or before a crash): the policy
        // decides, and the boundary is not tried again automatically.
        Some(row) if row.status == CompactionStatus::Failed => {
            on_failed(p.on_failure, row, base).map(Decision::Read)
        }
        Some(row) if row.status == CompactionStatus::Completed => Ok(Decision::Read(Some(row))),
        // Pending: finished, whatever the measure says now (never
        // re-decided): in the background below the hard threshold, by this
        // step at or over it.
        Some(row) => {
            let Some(bg) = p.background else {
                return Ok(Decision::claim(b, None, base));
            };
            if measure.over_hard(f)?.is_none_or(|(over, _)| over) {
                return Ok(Decision::claim(b, None, base));
            }
            if held_or_elsewhere(f, &row, bg) {
                if p.read_drafts {
                    // Deliberately wrong (Sabotage::read_drafts): read the draft.
                    return Ok(Decision::Read(Some(row)));
                }
                Ok(Decision::Read(base))
            } else {
                Ok(Decision::Background {
                    boundary: b,
                    measure: None,
                    soft: None,
                    read: base,
                })
            }
        }
        None => {
            let Some(limit) = f.threshold_tokens() else {
                return Ok(Decision::Read(base));
            };
            let m = measure.get(f)?;
            if planner::should_compact(m, limit) {
                // A background summary already on its way (an earlier
                // boundary) is waited for, not overtaken by a second
                // summariser call: the step reads it, and the next step
                // measures the context after it.
                if p.background.is_some() {
                    if let Some(pending) = f.newest_pending()? {
                        return Ok(Decision::claim(pending.up_to_turn_index, None, base));
                    }
                }
                return Ok(Decision::claim(b, m, base));
            }
            let Some(bg) = p.background else {
                return Ok(Decision::Read(base));
            };
            let mut soft = bg.soft_tokens(limit);
            // Between half the hard threshold and the soft one, the session's
            // pace may bring the soft threshold down (Background::adaptive).
            let mut lowered_for = None;
            if bg.adaptive
                && planner::should_compact(m, limit / 2)
                && !planner::should_compact(m, soft)
            {
                let (growth, summary_ms, turn_ms) = f.pace()?;
                soft = bg.adaptive_soft_tokens(limit, growth, summary_ms, turn_ms);
                lowered_for = growth;
            }
            if !planner::should_compact(m, soft) {
                return Ok(Decision::Read(base));
            }
            // A summary one turn after the last one buys no room (the turns
            // are large for the threshold): the hard threshold decides,
            // rather than a summariser call every turn.
            if latest.as_ref().is_some_and(|l| b - l.up_to_turn_index <= 1) {
                return Ok(Decision::Read(base));
            }
            // Under a soft threshold the pace brought down for a large turn,
            // a summary would fold what the context grew by since the one it
            // reads (at most: the measure counts the system prompt and the
            // tail too). Less than that large turn buys less room than the
            // turn it keeps room for, and leaves the context where the next
            // turn claims again: a summariser call every other turn for a
            // few turns' growth. The claim waits for a later turn (or the
            // hard threshold).
            if let (Some(growth), Some(m), Some(after)) =
                (lowered_for, m, base.as_ref().and_then(|r| r.tokens_after))
            {
                if m.saturating_sub(after) < growth {
                    return Ok(Decision::Read(base));
                }
            }
            // One background summary of a session at a time: one still
            // pending at an earlier boundary is let finish (taken over when
            // abandoned), not overtaken by a second summariser call.
            let (boundary, m, soft) = match f.newest_pending()? {
                None => (b, m, Some(i64::try_from(soft).unwrap_or(i64::MAX))),
                Some(pending) if held_or_elsewhere(f, &pending, bg) => {
                    return Ok(Decision::Read(base))
                }
                Some(pending) => (pending.up_to_turn_index, None, None),
            };
            Ok(Decision::Background {
                boundary,
                measure: m,
                soft,
                read: base,
            })
        }
    }
}

/// The newest measure, asked for once, counted only when it was taken on
/// the compaction the step reads.
struct Measure {
    base_id: Option<CompactionId>,
    got: Option<Option<i64>>,
}

impl Measure {
    fn get(&mut self, f: &mut impl Facts) -> Result<Option<i64>> {
        if let Some(m) = self.got {
            return Ok(m);
        }
        let m = match f.latest_measure()? {
            Some((tokens, read)) if read == self.base_id => Some(tokens),
            _ => None,
        };
        self.got = Some(m);
        Ok(m)
    }

    /// Over the hard threshold, and the measure (None: no threshold for
    /// this model).
    fn over_hard(&mut self, f: &mut impl Facts) -> Result<Option<(bool, Option<i64>)>> {
        let Some(limit) = f.threshold_tokens() else {
            return Ok(None);
        };
        let m = self.get(f)?;
        Ok(Some((planner::should_compact(m, limit), m)))
    }
}

/// A pending row another process serves, or a live other holds: not this
/// step's to take over.
fn held_or_elsewhere(f: &mut impl Facts, row: &CompactionRow, bg: Background) -> bool {
    bg.worker == BackgroundWorker::Elsewhere || f.held_by_live_other(row)
}

/// A failed row at the boundary, by the failure policy: read what was read
/// before, or fail the turn.
fn on_failed(
    policy: FailurePolicy,
    row: CompactionRow,
    latest: Option<CompactionRow>,
) -> Result<Option<CompactionRow>> {
    match policy {
        FailurePolicy::ProceedUncompacted => Ok(latest),
        FailurePolicy::FailTurn => Err(Error::CompactionFailed {
            compaction_id: row.id,
            session_id: row.session_id,
            boundary: row.up_to_turn_index,
            message: row.error.unwrap_or_default(),
        }),
    }
}

/// The decision as a table: each row of docs/design.md's "ensure(), in
/// order" and "Background compaction", with the facts it is given and what
/// it must decide. No store, no clock, no lease.
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn row(id: i64, boundary: i64, status: CompactionStatus) -> CompactionRow {
        CompactionRow {
            id: id.into(),
            session_id: 1.into(),
            up_to_turn_index: boundary,
            up_to_turn_id: (100 + boundary).into(),
            previous_id: None,
            status,
            summary: (status == CompactionStatus::Completed).then(|| format!("summary {id}")),
            summary_sha256: None,
            trigger: "auto".into(),
            focus: None,
            attempts: 1,
            lease_owner: None,
            lease_expires_at: None,
            model: None,
            prompt_sha256: None,
            trigger_tokens: None,
            tokens_before: None,
            tokens_after: None,
            input_tokens: None,
            output_tokens: None,
            summary_calls: 1,
            error: (status == CompactionStatus::Failed).then(|| "it broke".to_string()),
            created_at: 0,
            completed_at: None,
            pins_live: None,
            pins_added: None,
            pins_window: None,
            background: false,
            threshold_tokens: None,
            soft_threshold_tokens: None,
        }
    }
    use CompactionStatus::{Completed, Failed, Pending};

    /// The facts of one case, and which were asked for.
    #[derive(Default)]
    struct Table {
        latest: Option<CompactionRow>,
        by_id: Vec<CompactionRow>,
        /// `recent_window_boundary`'s answer (None: not expected to be asked).
        recent: Option<i64>,
        threshold: Option<u64>,
        /// (tokens, measured on) of the newest step.
        measure: Option<(i64, Option<i64>)>,
        at: HashMap<i64, CompactionRow>,
        pending: Option<CompactionRow>,
        held: bool,
        /// The session's pace: (largest growth of a recent turn, summary
        /// ms, turn ms).
        pace: (Option<i64>, Option<i64>, Option<i64>),
        asked: Vec<&'static str>,
    }

    impl Facts for Table {
        fn latest_completed(&mut self) -> Result<Option<CompactionRow>> {
            self.asked.push("latest");
            Ok(self.latest.clone())
        }
        fn compaction(&mut self, id: CompactionId) -> Result<CompactionRow> {
            self.asked.push("compaction");
            Ok(self.by_id.iter().find(|r| r.id == id).cloned().unwrap())
        }
        fn recent_window_boundary(&mut self, _after: i64, _b: i64) -> Result<i64> {
            self.asked.push("recent");
            Ok(self.recent.expect("recent_window_boundary asked"))
        }
        fn threshold_tokens(&mut self) -> Option<u64> {
            self.asked.push("threshold");
            self.threshold
        }
        fn latest_measure(&mut self) -> Result<Option<(i64, Option<CompactionId>)>> {
            self.asked.push("measure");
            Ok(self.measure.map(|(t, on)| (t, on.map(CompactionId::from))))
        }
        fn compaction_at(&mut self, boundary: i64) -> Result<Option<CompactionRow>> {
            self.asked.push("at");
            Ok(self.at.get(&boundary).cloned())
        }
        fn newest_pending(&mut self) -> Result<Option<CompactionRow>> {
            self.asked.push("pending");
            Ok(self.pending.clone())
        }
        fn held_by_live_other(&mut self, _row: &CompactionRow) -> bool {
            self.asked.push("held");
            self.held
        }
        fn pace(&mut self) -> Result<(Option<i64>, Option<i64>, Option<i64>)> {
            self.asked.push("pace");
            Ok(self.pace)
        }
    }

    /// Turn 10, nothing kept, background on (soft share 0.8 of 1,000: 800),
    /// a turn's first step, proceed on failure.
    fn policy() -> Policy {
        Policy {
            turn_idx: 10,
            keep_last_turns: 0,
            keep_recent_tokens: 0,
            background: Some(Background::default()),
            on_failure: FailurePolicy::ProceedUncompacted,
            prior: None,
            read_drafts: false,
        }
    }

    fn inline() -> Policy {
        Policy {
            background: None,
            ..policy()
        }
    }

    /// A table with a threshold of 1,000 and the newest measure `tokens`
    /// (taken on no compaction).
    fn measured(tokens: i64) -> Table {
        Table {
            threshold: Some(1_000),
            measure: Some((tokens, None)),
            ..Table::default()
        }
    }

    fn claim(boundary: i64, measure: Option<i64>, latest: Option<CompactionRow>) -> Decision {
        Decision::Claim {
            boundary,
            measure,
            latest,
        }
    }

    fn background(
        boundary: i64,
        measure: Option<i64>,
        soft: Option<i64>,
        read: Option<CompactionRow>,
    ) -> Decision {
        Decision::Background {
            boundary,
            measure,
            soft,
            read,
        }
    }

    fn with_at(mut t: Table, r: CompactionRow) -> Table {
        t.at.insert(r.up_to_turn_index, r);
        t
    }

    #[test]
    fn the_decision_table() {
        let c4 = row(4, 4, Completed);
        let c8 = row(8, 8, Completed);
        let cases: Vec<(&str, Policy, Table, Decision)> = vec![
            (
                "turn 0: no boundary, nothing to do",
                Policy {
                    turn_idx: 0,
                    ..policy()
                },
                measured(5_000),
                Decision::Read(None),
            ),
            (
                "fewer turns than keep_last_turns + 1: nothing to do",
                Policy {
                    keep_last_turns: 10,
                    ..policy()
                },
                measured(5_000),
                Decision::Read(None),
            ),
            (
                "keep_recent_tokens moves the boundary before turn 0",
                Policy {
                    keep_recent_tokens: 500,
                    ..policy()
                },
                Table {
                    recent: Some(-1),
                    ..measured(5_000)
                },
                Decision::Read(None),
            ),
            (
                "the newest completed row reaches the boundary: read it",
                policy(),
                Table {
                    latest: Some(row(9, 9, Completed)),
                    ..measured(5_000)
                },
                Decision::Read(Some(row(9, 9, Completed))),
            ),
            (
                "completed in the background since the turn began, below the hard threshold: \
                 the turn keeps what it read",
                Policy {
                    prior: Some(Some(4.into())),
                    ..policy()
                },
                Table {
                    latest: Some(row(9, 9, Completed)),
                    by_id: vec![c4.clone()],
                    measure: Some((500, Some(4))),
                    threshold: Some(1_000),
                    ..Table::default()
                },
                Decision::Read(Some(c4.clone())),
            ),
            (
                "the same at the hard threshold: the new summary is read",
                Policy {
                    prior: Some(Some(4.into())),
                    ..policy()
                },
                Table {
                    latest: Some(row(9, 9, Completed)),
                    by_id: vec![c4.clone()],
                    measure: Some((1_000, Some(4))),
                    threshold: Some(1_000),
                    ..Table::default()
                },
                Decision::Read(Some(row(9, 9, Completed))),
            ),
            (
                "a failed row at the boundary, proceed: read what was read, no retry",
                policy(),
                with_at(
                    Table {
                        latest: Some(c4.clone()),
                        ..measured(5_000)
                    },
                    row(9, 9, Failed),
                ),
                Decision::Read(Some(c4.clone())),
            ),
            (
                "a completed row at the boundary: read it",
                policy(),
                with_at(measured(5_000), row(9, 9, Completed)),
                Decision::Read(Some(row(9, 9, Completed))),
            ),
            (
                "a pending row, inline compaction: finished by this step, never re-decided",
                inline(),
                with_at(measured(10), row(9, 9, Pending)),
                claim(9, None, None),
            ),
            (
                "a pending row at the hard threshold: this step finishes it",
                policy(),
                with_at(measured(1_000), row(9, 9, Pending)),
                claim(9, None, None),
            ),
            (
                "a pending row below the hard threshold held by a live other: left to it (G4: \
                 never read)",
                policy(),
                with_at(
                    Table {
                        held: true,
                        ..measured(900)
                    },
                    row(9, 9, Pending),
                ),
                Decision::Read(None),
            ),
            (
                "a pending row below the hard threshold, abandoned: taken over in the background",
                policy(),
                with_at(measured(900), row(9, 9, Pending)),
                background(9, None, None, None),
            ),
            (
                "a pending row below the hard threshold, served elsewhere: left to the server",
                Policy {
                    background: Some(Background {
                        worker: BackgroundWorker::Elsewhere,
                        ..Background::default()
                    }),
                    ..policy()
                },
                with_at(measured(900), row(9, 9, Pending)),
                Decision::Read(None),
            ),
            (
                "no threshold for the model: nothing to do",
                policy(),
                Table {
                    threshold: None,
                    measure: Some((1_000_000, None)),
                    ..Table::default()
                },
                Decision::Read(None),
            ),
            (
                "no measure yet (a session's first step): nothing to do",
                policy(),
                Table {
                    threshold: Some(1_000),
                    ..Table::default()
                },
                Decision::Read(None),
            ),
            (
                "a measure taken on an older compaction than the step reads decides nothing",
                Policy {
                    prior: Some(Some(8.into())),
                    ..policy()
                },
                Table {
                    latest: Some(c8.clone()),
                    measure: Some((5_000, Some(4))),
                    threshold: Some(1_000),
                    ..Table::default()
                },
                Decision::Read(Some(c8.clone())),
            ),
            (
                "at the hard threshold, nothing pending: claim at the boundary, with the measure",
                policy(),
                Table {
                    latest: Some(c4.clone()),
                    measure: Some((1_000, Some(4))),
                    threshold: Some(1_000),
                    ..Table::default()
                },
                claim(9, Some(1_000), Some(c4.clone())),
            ),
            (
                "at the hard threshold with a background summary on its way: wait for that one",
                policy(),
                Table {
                    pending: Some(row(6, 6, Pending)),
                    ..measured(1_000)
                },
                claim(6, None, None),
            ),
            (
                "at the hard threshold, inline: a pending row elsewhere is not asked for",
                inline(),
                measured(1_000),
                claim(9, Some(1_000), None),
            ),
            (
                "below the soft threshold: nothing to do",
                policy(),
                measured(799),
                Decision::Read(None),
            ),
            (
                "at the soft threshold without background compaction: nothing to do",
                inline(),
                measured(800),
                Decision::Read(None),
            ),
            (
                "at the soft threshold one turn after the last summary: left to the hard one",
                policy(),
                Table {
                    latest: Some(row(8, 8, Completed)),
                    measure: Some((800, Some(8))),
                    threshold: Some(1_000),
                    ..Table::default()
                },
                Decision::Read(Some(row(8, 8, Completed))),
            ),
            (
                "at the soft threshold, nothing pending: claim in the background",
                policy(),
                measured(800),
                background(
                    9,
                    Some(800),
                    Some(Background::default().soft_tokens(1_000) as i64),
                    None,
                ),
            ),
            (
                "at the soft threshold, an earlier summary held by a live other: let it finish",
                policy(),
                Table {
                    pending: Some(row(6, 6, Pending)),
                    held: true,
                    ..measured(800)
                },
                Decision::Read(None),
            ),
            (
                "at the soft threshold, an earlier summary abandoned: taken over in the \
                 background, not overtaken",
                policy(),
                Table {
                    pending: Some(row(6, 6, Pending)),
                    ..measured(800)
                },
                background(6, None, None, None),
            ),
            (
                "under a soft threshold brought down for a large turn (350: 1,000 - 2 x 350 \
                 is below half, so 500), a summary that would fold less than that turn (600 \
                 measured on a summary of 300): left to a later turn",
                policy(),
                after_a_large_turn(300, 600),
                Decision::Read(Some(summary_of(300))),
            ),
            (
                "the same once the context has grown by that turn since the summary: claim \
                 in the background under the lowered threshold",
                policy(),
                after_a_large_turn(250, 600),
                background(9, Some(600), Some(500), Some(summary_of(250))),
            ),
            (
                "at the configured soft threshold (not brought down), the summary's size does \
                 not hold a claim back",
                policy(),
                after_a_large_turn(700, 800),
                background(9, Some(800), Some(800), Some(summary_of(700))),
            ),
        ];
        let n = cases.len();
        for (what, p, mut facts, want) in cases {
            let got = decide(&p, &mut facts).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got, want, "{what}");
        }
        assert!(n >= 27);
    }

    /// A completed summary at turn 6 of `tokens` tokens.
    fn summary_of(tokens: i64) -> CompactionRow {
        CompactionRow {
            tokens_after: Some(tokens),
            ..row(6, 6, Completed)
        }
    }

    /// A threshold of 1,000, the newest measure `tokens` taken on a summary
    /// of `summary` tokens at turn 6, and a recent turn that grew by 350.
    fn after_a_large_turn(summary: i64, tokens: i64) -> Table {
        Table {
            latest: Some(summary_of(summary)),
            measure: Some((tokens, Some(6))),
            threshold: Some(1_000),
            pace: (Some(350), None, None),
            ..Table::default()
        }
    }

    /// The deliberately broken build's knob (`Sabotage::read_drafts`) does
    /// what it says: the draft another live runner holds is read, the very
    /// G4 violation the chaos harness and the G4 tests must catch.
    #[test]
    fn the_read_drafts_sabotage_reads_the_draft_a_live_other_holds() {
        let draft = row(9, 9, Pending);
        let held = || {
            with_at(
                Table {
                    held: true,
                    ..measured(900)
                },
                draft.clone(),
            )
        };
        assert_eq!(
            decide(&policy(), &mut held()).unwrap(),
            Decision::Read(None)
        );
        let broken = Policy {
            read_drafts: true,
            ..policy()
        };
        assert_eq!(
            decide(&broken, &mut held()).unwrap(),
            Decision::Read(Some(draft.clone()))
        );
    }

    #[test]
    fn a_failed_row_fails_the_turn_under_that_policy() {
        let p = Policy {
            on_failure: FailurePolicy::FailTurn,
            ..policy()
        };
        let mut t = with_at(measured(5_000), row(9, 9, Failed));
        match decide(&p, &mut t) {
            Err(Error::CompactionFailed {
                boundary, message, ..
            }) => {
                assert_eq!((boundary, message.as_str()), (9, "it broke"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_step_below_the_threshold_asks_only_what_it_needs() {
        // Turn 0: the newest row only.
        let mut t = measured(5_000);
        decide(
            &Policy {
                turn_idx: 0,
                ..policy()
            },
            &mut t,
        )
        .unwrap();
        assert_eq!(t.asked, ["latest"]);
        // Below the soft threshold: no pending row, no lease looked at.
        let mut t = measured(10);
        decide(&policy(), &mut t).unwrap();
        assert_eq!(t.asked, ["latest", "at", "threshold", "measure"]);
        // The newest row already reaches the boundary: nothing measured.
        let mut t = Table {
            latest: Some(row(9, 9, Completed)),
            ..measured(10)
        };
        decide(&policy(), &mut t).unwrap();
        assert_eq!(t.asked, ["latest"]);
    }
}
