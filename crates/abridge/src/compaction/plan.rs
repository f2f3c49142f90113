//! The runner's two calls into the compactor, one step at a time: [`plan`]
//! (what must happen before this step, found in the step's read transaction)
//! and [`resolve`] (making it happen: a background claim spawned, or the
//! compaction the step must wait for claimed, summarised and completed). The
//! [`Plan`] between them is opaque to the runner: it asks only which row the
//! step can read now, if any.
//!
//! [`plan`]: Compactor::plan
//! [`resolve`]: Compactor::resolve

use super::decide::{decide, Decision, Policy};
use super::{Compactor, StoreFacts};
use crate::error::Result;
use crate::events::Subject;
use crate::ids::CompactionId;
use crate::store::{CompactionRow, SessionRow};

/// What must happen before a step: made by [`Compactor::plan`], carried
/// out by [`Compactor::resolve`].
#[derive(Debug)]
pub(crate) struct Plan(Decision);

impl Plan {
    /// The compaction the step reads, when it can read it now (Some(None):
    /// none): nothing to wait for, whether or not a background summary is
    /// started. None: a compaction is due first, and the step reads what
    /// [`Compactor::resolve`] returns.
    pub(crate) fn read_now(&self) -> Option<Option<&CompactionRow>> {
        match &self.0 {
            Decision::Read(row) => Some(row.as_ref()),
            Decision::Background { read, .. } => Some(read.as_ref()),
            Decision::Claim { .. } => None,
        }
    }
}

/// What [`Compactor::resolve`] did: the row the step reads, and how long
/// the step waited for it (when it had to).
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The completed compaction the step reads (None: none).
    pub row: Option<CompactionRow>,
    /// (boundary, milliseconds) when the step waited for a compaction.
    pub waited: Option<(i64, i64)>,
}

impl Compactor {
    /// What must happen before step `step_idx` of `turn_idx`, read in the
    /// caller's read transaction: [`decide`] over the store's facts (read as
    /// the decision asks for them) and this compactor's policy: one to three
    /// queries, in the same blocking call that claims the step and builds its
    /// messages, so a step below the threshold costs no extra round trip
    /// (with [`Compactor::prefetch_decision`] first, none on PostgreSQL).
    ///
    /// `prior` is what the turn's previous step read (None for a turn's first
    /// step): a turn keeps the compaction it began with, and a summary that
    /// completed in the background since is read from the next turn on, or
    /// at once when this step has reached the hard threshold.
    pub(crate) fn plan(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn_idx: i64,
        step_idx: i64,
        prior: Option<Option<CompactionId>>,
    ) -> Result<Plan> {
        let policy = Policy {
            turn_idx,
            keep_last_turns: self.config.keep_last_turns,
            keep_recent_tokens: self.config.keep_recent_tokens,
            background: self.config.background,
            on_failure: self.config.on_failure,
            prior,
            read_drafts: self.read_drafts,
        };
        let mut facts = StoreFacts {
            compactor: self,
            c,
            session,
            turn_idx,
            step_idx,
        };
        decide(&policy, &mut facts).map(Plan)
    }

    /// Carries `plan` out for a step of `turn_idx`: nothing to do; a
    /// background summary claimed (or queued for another process) and
    /// spawned, the step reading the row before it; or the compaction due
    /// claimed (or finished, or waited for) and the completed row returned,
    /// with the time the step waited.
    pub(crate) async fn resolve(
        &self,
        subject: &Subject,
        turn_idx: i64,
        plan: Plan,
    ) -> Result<Resolved> {
        match plan.0 {
            Decision::Read(row) => Ok(Resolved { row, waited: None }),
            Decision::Background {
                boundary,
                measure,
                read,
            } => {
                self.background(subject, boundary, measure, read.as_ref())
                    .await?;
                Ok(Resolved {
                    row: read,
                    waited: None,
                })
            }
            due @ Decision::Claim { boundary, .. } => {
                let began = std::time::Instant::now();
                let row = self.act(subject, turn_idx, due).await?;
                let waited_ms = began.elapsed().as_millis().min(i64::MAX as u128) as i64;
                Ok(Resolved {
                    row,
                    waited: Some((boundary, waited_ms)),
                })
            }
        }
    }
}
