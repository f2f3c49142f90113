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
use super::*;
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

    /// Whether [`Compactor::resolve`] may make a summary or wait for one
    /// (a compaction is due before the step reads).
    pub(crate) fn may_wait(&self) -> bool {
        self.read_now().is_none()
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
        let keep_recent_tokens = self
            .config
            .recent_tokens(self.threshold_tokens(session, turn_idx));
        let policy = Policy {
            turn_idx,
            keep_last_turns: self.config.keep_last_turns,
            keep_recent_tokens,
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
            keep_recent_tokens,
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
                soft,
                read,
            } => {
                self.background(subject, boundary, measure, soft, read.as_ref())
                    .await?;
                Ok(Resolved {
                    row: read,
                    waited: None,
                })
            }
            Decision::Claim {
                boundary,
                measure,
                latest,
            } => {
                let began = std::time::Instant::now();
                let row = self
                    .claim_due(subject, turn_idx, boundary, measure, latest)
                    .await?;
                let waited_ms = began.elapsed().as_millis().min(i64::MAX as u128) as i64;
                Ok(Resolved {
                    row,
                    waited: Some((boundary, waited_ms)),
                })
            }
        }
    }
}

impl Compactor {
    /// Keeps the size of turn `turn`, just finished with the rows it holds
    /// all written by this process, for the session's next tail walk, which
    /// then reads no turn at all as a rule (see [`TurnSizes::finished`]).
    pub(crate) fn turn_finished(&self, session: &SessionRow, turn: &crate::store::HistoryTurn) {
        if let Some(chars) = store::turn_text_chars(turn) {
            self.sizes.finished(session, turn.idx, chars);
        }
    }

    /// The turns' sizes kept for `session` (newest first), to hold them to
    /// what the store reads.
    #[doc(hidden)]
    pub fn kept_turn_sizes(&self, session: crate::ids::SessionId) -> Option<Vec<(i64, i64)>> {
        self.sizes.last(session).map(|m| m.sizes)
    }

    /// Says which of [`Compactor::plan`]'s reads for step `step_idx` of
    /// turn `turn_idx` follow (see [`crate::store::Connection::prefetch`]):
    /// the caller's next read takes them along, on PostgreSQL in one round
    /// trip. A read that the plan turns out not to need costs the server
    /// one indexed lookup, and no round trip.
    pub(crate) fn prefetch_decision(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn_idx: i64,
        step_idx: i64,
    ) -> Result<()> {
        store::prefetch_latest_completed_id(c, session.id, turn_idx)?;
        let Some(b) = planner::boundary(turn_idx, self.config.keep_last_turns) else {
            return Ok(());
        };
        let keep = self
            .config
            .recent_tokens(self.threshold_tokens(session, turn_idx));
        if keep == 0 {
            store::prefetch_compaction_at(c, session.id, b)?;
        } else {
            // The window the session's previous decision found: when it was
            // this turn's, its boundary is this step's too (the same latest
            // completed row, guessed); otherwise its read goes along (the
            // same row guessed). The row at the boundary goes with them: at
            // the last one moved on by as many turns (a tail of turns of a
            // similar size; the same one within the turn), and at the last
            // one. A row at or before the latest completed one is never
            // asked for (nor one at -1: nothing to compact); the same read
            // twice is queued once. The window's read is of the turns its
            // kept sizes do not hold (see `TurnSizes`).
            if let Some(w) = self.windows.last(session.id) {
                if w.key != WindowKey::new(session, turn_idx, w.key.after, b, keep) {
                    let after = match self.sizes.read_after(session, turn_idx) {
                        Some(top) => top.max(w.key.after),
                        None => w.key.after,
                    };
                    if after < turn_idx - 1 {
                        store::prefetch_recent_window(c, session.id, turn_idx, after)?;
                    }
                }
                let moved = w.found + (turn_idx - w.key.turn_idx);
                for guess in [moved, w.found].into_iter().filter(|&g| g > w.key.after) {
                    store::prefetch_compaction_at(c, session.id, guess)?;
                }
            }
        }
        let window = self.config.context_window(&session.model);
        if self.config.compact_at.tokens(window).is_some() {
            store::prefetch_latest_context_tokens(
                c,
                session.id,
                session.first_own_turn(),
                turn_idx,
                step_idx,
            )?;
        }
        Ok(())
    }

    /// The compaction due at `b`: claimed (or finished, or waited for),
    /// summarised and completed; returns the completed compaction the step
    /// reads (`latest` when it failed under `ProceedUncompacted`).
    async fn claim_due(
        &self,
        subject: &Subject,
        turn_idx: i64,
        b: i64,
        measure: Option<i64>,
        latest: Option<CompactionRow>,
    ) -> Result<Option<CompactionRow>> {
        let sid = subject.session_id;
        self.say_if_often(subject, b, measure, latest.as_ref());
        let row = self
            .claim_and_finish(subject, b, Trigger::Auto, None, measure, true)
            .await;
        match row {
            Ok(_row) => {
                crate::error::check_fault(&self.fault, FaultPoint::AfterCompactionComplete)?;
                if self.read_drafts && _row.status != CompactionStatus::Completed {
                    return Ok(Some(_row));
                }
                self.store
                    .call(move |c| store::latest_completed(c, sid, turn_idx))
                    .await
            }
            Err(Error::CompactionFailed { .. })
                if self.config.on_failure == FailurePolicy::ProceedUncompacted =>
            {
                Ok(latest)
            }
            Err(e) => Err(e),
        }
    }
}

/// The store's answers to [`decide()`]'s questions, for one step.
pub(super) struct StoreFacts<'a> {
    pub(super) compactor: &'a Compactor,
    pub(super) c: &'a crate::store::Connection,
    pub(super) session: &'a SessionRow,
    pub(super) turn_idx: i64,
    pub(super) step_idx: i64,
    /// The verbatim tail, tokens (`CompactionConfig::recent_tokens`).
    pub(super) keep_recent_tokens: u64,
}

impl Facts for StoreFacts<'_> {
    fn latest_completed(&mut self) -> Result<Option<CompactionRow>> {
        // Its id, then its row from the memo: a completed row never changes
        // (G2) while the session's redaction mark stays the same, and the
        // text is read once a compaction, not at every step.
        let Some(id) = store::latest_completed_id(self.c, self.session.id, self.turn_idx)? else {
            return Ok(None);
        };
        let completed = &self.compactor.completed;
        let key = CompletedKey::new(self.session, id);
        if let Some(row) = completed.last(self.session.id).filter(|r| r.key == key) {
            return Ok(Some(CompactionRow::clone(&row.row)));
        }
        let row = store::get_compaction(self.c, id)?;
        let kept = Arc::new(row.clone());
        completed.remember(self.session.id, Completed { key, row: kept });
        Ok(Some(row))
    }

    fn compaction(&mut self, id: CompactionId) -> Result<CompactionRow> {
        store::get_compaction(self.c, id)
    }

    fn recent_window_boundary(&mut self, after: i64, boundary: i64) -> Result<i64> {
        let key = WindowKey::new(
            self.session,
            self.turn_idx,
            after,
            boundary,
            self.keep_recent_tokens,
        );
        let windows = &self.compactor.windows;
        if let Some(found) = windows.recall(self.session.id, &key) {
            return Ok(found);
        }
        let found = self.compactor.sizes.boundary(
            self.c,
            self.session,
            self.turn_idx,
            after,
            boundary,
            self.keep_recent_tokens,
        )?;
        windows.remember(self.session.id, Window { key, found });
        Ok(found)
    }

    fn threshold_tokens(&mut self) -> Option<u64> {
        self.compactor.threshold_tokens(self.session, self.turn_idx)
    }

    fn latest_measure(&mut self) -> Result<Option<(i64, Option<CompactionId>)>> {
        store::latest_context_tokens(
            self.c,
            self.session.id,
            self.session.first_own_turn(),
            self.turn_idx,
            self.step_idx,
        )
    }

    fn compaction_at(&mut self, boundary: i64) -> Result<Option<CompactionRow>> {
        store::compaction_at(self.c, self.session.id, boundary)
    }

    fn newest_pending(&mut self) -> Result<Option<CompactionRow>> {
        store::newest_pending(self.c, self.session.id)
    }

    fn held_by_live_other(&mut self, row: &CompactionRow) -> bool {
        let dead = self.compactor.gone_check();
        store::held_by_live_other(row, &self.compactor.owner, self.c.now_ms(), &dead)
    }

    fn pace(&mut self) -> Result<(Option<i64>, Option<i64>, Option<i64>)> {
        let turns = self
            .compactor
            .paces
            .turns(self.c, self.session, self.turn_idx)?;
        let summary_ms = store::background_summary_ms(self.c, self.session.id)?;
        let p = store::Pace::of(&turns, summary_ms);
        Ok((p.growth, p.summary_ms, p.turn_ms))
    }
}

/// Each session's last [`store::PACE_TURNS`] turns as the pace reads them,
/// kept for its next turns: a finished turn's measures and time never change
/// (while the session's redaction stays the same), and every turn before
/// the one running is finished (a session runs one turn at a time). So the
/// next turn's pace reads only the turns finished since (the one before it,
/// as a rule), not all eight again: in a store many sessions write, each
/// of those is a walk of the steps' index from a page cache another
/// connection's commit emptied.
pub(super) type Paces = SessionMemo<TurnPaces, 8_192>;

/// A session's turns `covered` (inclusive; those that exist), and what they
/// were read for.
#[derive(Debug, Clone)]
pub(super) struct TurnPaces {
    /// The session's creation time and redaction mark.
    key: (i64, i64),
    covered: (i64, i64),
    turns: Vec<store::TurnPace>,
}

impl Paces {
    /// The session's turns `turn_idx - PACE_TURNS ..= turn_idx - 1`: those
    /// kept from an earlier turn's read, and the rest read now.
    fn turns(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn_idx: i64,
    ) -> Result<Vec<store::TurnPace>> {
        let (lo, hi) = (turn_idx - store::PACE_TURNS, turn_idx - 1);
        let key = (session.created_at, session.redaction);
        // Kept: the memo's turns in the window, when it covers the window
        // from its start up to a turn before its end.
        let mut turns: Vec<store::TurnPace> = Vec::new();
        let mut from = lo;
        if let Some(m) = self.last(session.id) {
            if m.key == key && m.covered.0 <= lo && m.covered.1 >= lo && m.covered.1 <= hi {
                turns.extend(m.turns.iter().filter(|t| t.idx >= lo).copied());
                from = m.covered.1 + 1;
            }
        }
        if from <= hi {
            turns.extend(store::turn_paces(c, session.id, from, hi)?);
        }
        self.remember(
            session.id,
            TurnPaces {
                key,
                covered: (lo, hi),
                turns: turns.clone(),
            },
        );
        Ok(turns)
    }
}

/// Each session's finished turns' sizes as its verbatim tail last walked
/// them, kept for its next turns: a finished turn's stored text never
/// changes (while the session's redaction stays the same), and every turn
/// before the one running is finished. So the tail's walk at a new turn
/// reads only the turns finished since the session's last walk (the one
/// before it, as a rule) and takes the older ones from here, instead of
/// walking the whole tail again: each turn of it is three descents (the
/// turn, its steps, their tool results) from a page cache another
/// connection's commit emptied, in a store many sessions write.
pub(super) type TurnSizes = SessionMemo<Walked, 8_192>;

/// Turns' sizes a session keeps at most (the newest): a tail of more
/// turns than these (many small turns) reads the older ones again.
const KEPT_SIZES: usize = 64;

/// A session's turns `covered` (inclusive; every one that exists is in
/// `sizes`), newest first, and what they were read for.
#[derive(Debug, Clone)]
pub(super) struct Walked {
    /// The session's creation time and redaction mark.
    key: (i64, i64),
    covered: (i64, i64),
    /// (turn index, stored text's chars), newest first.
    sizes: Vec<(i64, i64)>,
}

impl TurnSizes {
    /// The newest turn a walk before `turn_idx` can take from here (those
    /// after it are read), when anything kept is of use to it.
    fn kept_up_to(&self, session: &SessionRow, turn_idx: i64) -> Option<(i64, Walked)> {
        let key = (session.created_at, session.redaction);
        let m = self.last(session.id).filter(|m| m.key == key)?;
        let top = m.covered.1.min(turn_idx - 1);
        (m.covered.0 <= top).then_some((top, m))
    }

    /// Takes the size of turn `idx`, finished, into what is kept for
    /// `session`, when what is kept reaches the turn before it (a session
    /// whose tail was walked before in this process): a finished turn's
    /// stored text never changes, so its size counted from the strings its
    /// rows were written with is what a walk would read, and the next walk
    /// reads none of the turns kept. Otherwise nothing is kept, and the
    /// next walk reads the turn.
    fn finished(&self, session: &SessionRow, idx: i64, chars: i64) {
        let key = (session.created_at, session.redaction);
        self.update(session.id, |m| {
            if m.key != key || m.covered.1 != idx - 1 {
                return;
            }
            m.sizes.insert(0, (idx, chars));
            m.covered.1 = idx;
            if m.sizes.len() > KEPT_SIZES {
                m.sizes.truncate(KEPT_SIZES);
                m.covered.0 = m.sizes.last().map_or(idx, |&(i, _)| i);
            }
        });
    }

    /// The turns after `kept_up_to` that a walk at `turn_idx` reads first
    /// (as `after_idx` of [`store::walk_turn_sizes`]), when it takes older
    /// ones from here.
    pub(super) fn read_after(&self, session: &SessionRow, turn_idx: i64) -> Option<i64> {
        self.kept_up_to(session, turn_idx).map(|(top, _)| top)
    }

    /// [`store::recent_window_boundary`] for turn `turn_idx`: the turns
    /// finished since the session's last walk read, the older ones taken
    /// from what that walk kept, and any older still that this walk reaches
    /// read; what it walked kept for the next.
    fn boundary(
        &self,
        c: &crate::store::Connection,
        session: &SessionRow,
        turn_idx: i64,
        after_idx: i64,
        boundary: i64,
        keep: u64,
    ) -> Result<i64> {
        let hi = turn_idx - 1;
        let mut walk = Walk {
            tail: store::Tail::new(boundary, keep),
            walked: Vec::new(),
            open: true,
        };
        match self.kept_up_to(session, turn_idx) {
            Some((top, kept)) => {
                walk.read(c, session, turn_idx, top.max(after_idx))?;
                for &(i, n) in kept
                    .sizes
                    .iter()
                    .filter(|(i, _)| *i <= top && *i > after_idx)
                {
                    if !walk.take(i, n) {
                        break;
                    }
                }
                walk.read(c, session, kept.covered.0, after_idx)?;
            }
            None => walk.read(c, session, turn_idx, after_idx)?,
        }
        let Walk {
            tail,
            mut walked,
            open,
        } = walk;
        // Every turn from `hi` down to the last one walked (or, the walk
        // run out, to `after_idx + 1`) was read or kept.
        let mut lo = match walked.last() {
            Some(&(i, _)) if !open => i,
            _ => after_idx + 1,
        };
        if walked.len() > KEPT_SIZES {
            walked.truncate(KEPT_SIZES);
            lo = walked.last().map_or(lo, |&(i, _)| i);
        }
        if lo <= hi {
            self.remember(
                session.id,
                Walked {
                    key: (session.created_at, session.redaction),
                    covered: (lo, hi),
                    sizes: walked,
                },
            );
        }
        Ok(tail.boundary())
    }
}

/// One walk of a session's tail: the turns it took, newest first, and
/// whether it goes on (the last one fitted).
struct Walk {
    tail: store::Tail,
    walked: Vec<(i64, i64)>,
    open: bool,
}

impl Walk {
    fn take(&mut self, idx: i64, chars: i64) -> bool {
        self.walked.push((idx, chars));
        self.open = self.tail.take(idx, chars);
        self.open
    }

    /// Walks on through the session's turns after `after_idx` and before
    /// `before_idx`, read from the store, while the tail is open (no
    /// statement for an empty range).
    fn read(
        &mut self,
        c: &crate::store::Connection,
        session: &SessionRow,
        before_idx: i64,
        after_idx: i64,
    ) -> Result<()> {
        if !self.open || before_idx - 1 <= after_idx {
            return Ok(());
        }
        store::walk_turn_sizes(c, session.id, before_idx, after_idx, |i, n| self.take(i, n))
    }
}

/// What a recent-window boundary is a function of: the session's finished
/// turns before `turn_idx` and after `after` (which never change while its
/// redaction stays the same), the planner's boundary and the tail's size.
/// The session's creation time tells a session from one deleted before it
/// that had its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WindowKey {
    created_at: i64,
    redaction: i64,
    turn_idx: i64,
    after: i64,
    boundary: i64,
    keep: u64,
}

impl WindowKey {
    fn new(session: &SessionRow, turn_idx: i64, after: i64, boundary: i64, keep: u64) -> Self {
        WindowKey {
            created_at: session.created_at,
            redaction: session.redaction,
            turn_idx,
            after,
            boundary,
            keep,
        }
    }
}

/// A session's last recent-window boundary and what it was found for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    key: WindowKey,
    found: i64,
}

/// A value kept for each session, the last one remembered: bounded, past
/// `CAP` sessions it starts again empty (a forgotten session reads it once
/// more).
#[derive(Debug)]
pub(super) struct SessionMemo<T, const CAP: usize>(Mutex<HashMap<SessionId, T>>);

impl<T, const CAP: usize> Default for SessionMemo<T, CAP> {
    fn default() -> Self {
        SessionMemo(Mutex::default())
    }
}

impl<T: Clone, const CAP: usize> SessionMemo<T, CAP> {
    fn last(&self, session: SessionId) -> Option<T> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&session)
            .cloned()
    }

    /// Changes the value kept for `session`, if any, in place.
    fn update(&self, session: SessionId, f: impl FnOnce(&mut T)) {
        if let Some(v) = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&session)
        {
            f(v);
        }
    }

    fn remember(&self, session: SessionId, value: T) {
        let mut memo = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= CAP && !memo.contains_key(&session) {
            memo.clear();
        }
        memo.insert(session, value);
    }
}

/// Each session's last recent-window boundary, found once a turn instead of
/// at every step: a turn's steps all ask for the same one (the turns it
/// reads are finished), and the next turn's read is sent ahead with the
/// step's first request on PostgreSQL, guessing the same latest completed
/// row.
pub(super) type RecentWindows = SessionMemo<Window, 8_192>;

impl RecentWindows {
    fn recall(&self, session: SessionId, key: &WindowKey) -> Option<i64> {
        self.last(session)
            .filter(|w| w.key == *key)
            .map(|w| w.found)
    }
}

/// Each session's newest completed compaction as a step last read it: the
/// next steps read only its id, and its row (the summary's text) only when
/// the id is another. At most 2,048 sessions' rows, a quarter of the
/// windows' bound: each holds a summary's text.
pub(super) type CompletedRows = SessionMemo<Completed, 2_048>;

/// A completed row and what it was read for.
#[derive(Debug, Clone)]
pub(super) struct Completed {
    key: CompletedKey,
    row: Arc<CompactionRow>,
}

/// What a completed row's text is a function of: its id (a completed row
/// never changes, G2), but for the session's redaction (which rewrites its
/// summaries) and its creation time (a session deleted, its ids reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CompletedKey {
    created_at: i64,
    redaction: i64,
    id: CompactionId,
}

impl CompletedKey {
    fn new(session: &SessionRow, id: CompactionId) -> Self {
        CompletedKey {
            created_at: session.created_at,
            redaction: session.redaction,
            id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SessionId;

    /// A session of `turns` turns with measures, falls (compactions),
    /// unmeasured steps, failed turns and times drawn from a fixed seed, and
    /// a few compactions, completed in the background or not.
    fn seeded(turns: i64) -> (tempfile::TempDir, crate::store::Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path().join("p.db")).unwrap();
        // Draws below `n` from a fixed seed (xorshift).
        let draws = |mut x: u64| {
            move |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            }
        };
        let mut next = draws(0x9e37_79b9_7f4a_7c15);
        // The texts' sizes from a sequence of their own (the draws above
        // stay as they were).
        let mut size = draws(0x2545_f491_4f6c_dd1d);
        store
            .with_conn(|c| {
                c.execute_batch(
                    "INSERT INTO sessions (id, external_id, model, system_prompt, created_at) \
                     VALUES (1, 's', 'm', 'p', 0)",
                )?;
                let (mut step_id, mut at) = (1, 0i64);
                for idx in 0..turns {
                    let status = if next(6) == 0 { "failed" } else { "completed" };
                    let took = 1 + next(3_000) as i64;
                    let input = "i".repeat(1 + size(400) as usize);
                    c.execute(
                        "INSERT INTO turns (id, session_id, idx, input, status, created_at, \
                         finished_at) VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6)",
                        rusqlite::params![100 + idx, idx, input, status, at, at + took],
                    )?;
                    for s in 0..(1 + next(3) as i64) {
                        let measure = (next(4) != 0).then(|| next(6_000) as i64);
                        let response = (size(5) != 0).then(|| "r".repeat(size(900) as usize));
                        c.execute(
                            "INSERT INTO steps (id, turn_id, idx, status, context_tokens, \
                             response, created_at) VALUES (?1, ?2, ?3, 'completed', ?4, ?5, ?6)",
                            rusqlite::params![step_id, 100 + idx, s, measure, response, at],
                        )?;
                        if size(2) == 0 {
                            c.execute(
                                "INSERT INTO tool_invocations (step_id, position, tool_call_id, \
                                 tool_name, arguments, effect, idempotency_key, status, result, \
                                 created_at, completed_at) VALUES (?1, 0, 'c', 't', '{}', \
                                 'transactional', ?2, 'completed', ?3, ?4, ?4)",
                                rusqlite::params![
                                    step_id,
                                    format!("k{step_id}"),
                                    "é".repeat(size(1_500) as usize),
                                    at
                                ],
                            )?;
                        }
                        step_id += 1;
                    }
                    if idx % 5 == 4 {
                        let (status, done) = if next(3) == 0 {
                            ("pending", None)
                        } else {
                            ("completed", Some(at + 1 + next(2_000) as i64))
                        };
                        c.execute(
                            concat!(
                                "INSERT INTO compactions (id, session_id, up_to_turn_index, \
                                 up_to_turn_id, status, summary, summary_sha256, trigger, \
                                 attempts, tokens_before, tokens_after, summary_calls, \
                                 created_at, completed_at, background) VALUES (",
                                crate::store::next_id!("compactions"),
                                ", 1, ?1, ?2, ?3, 's', 'h', 'auto', 1, 10, 1, 1, ?4, ?5, ?6)"
                            ),
                            rusqlite::params![idx, 100 + idx, status, at, done, next(2) as i64],
                        )?;
                    }
                    at += took + 1;
                }
                Ok(())
            })
            .unwrap();
        (dir, store)
    }

    /// The pace read a turn at a time, kept turns and all, says what the one
    /// statement over all eight turns says: at every turn read in order,
    /// with turns skipped, from the start again, and with nothing kept.
    #[test]
    fn the_pace_read_a_turn_at_a_time_is_the_whole_windows() {
        let (_dir, store) = seeded(60);
        store
            .with_conn(|c| {
                let session = store::get_session(c, SessionId(1))?;
                let kept = Paces::default();
                let summary_ms = store::background_summary_ms(c, session.id)?;
                let mut checked = (0, false, false);
                let turns_at = (0..=62).chain([3, 4, 40]).chain((10..=62).step_by(3));
                for t in turns_at {
                    let want = store::session_pace(c, session.id, t)?;
                    let got = store::Pace::of(&kept.turns(c, &session, t)?, summary_ms);
                    assert_eq!(got, want, "turn {t}");
                    let alone = Paces::default().turns(c, &session, t)?;
                    assert_eq!(store::Pace::of(&alone, summary_ms), want, "turn {t}");
                    checked.0 += 1;
                    checked.1 |= want.growth.is_some();
                    checked.2 |= want.turn_ms.is_some() && want.summary_ms.is_some();
                }
                assert!(checked.0 >= 80 && checked.1 && checked.2, "{checked:?}");
                Ok(())
            })
            .unwrap();
    }

    /// A finished turn is read once: the next turns' pace keeps it (a step
    /// added to it afterwards, as nothing in abridge does, is not seen),
    /// while a turn not yet read is, and a new redaction of the session reads
    /// its turns again.
    #[test]
    fn a_sessions_pace_reads_only_the_turns_finished_since_its_last() {
        let (_dir, store) = seeded(30);
        store
            .with_conn(|c| {
                let mut session = store::get_session(c, SessionId(1))?;
                let kept = Paces::default();
                let before = kept.turns(c, &session, 20)?;
                let probe = |c: &crate::store::Connection, turn: i64| {
                    c.execute(
                        "INSERT INTO steps (turn_id, idx, status, context_tokens, created_at) \
                         VALUES (?1, 9, 'completed', 999999, 0)",
                        [100 + turn],
                    )
                };
                probe(c, 15)?; // kept from the read at turn 20
                probe(c, 20)?; // not read yet
                let after = kept.turns(c, &session, 21)?;
                let max_of = |turns: &[store::TurnPace], idx| {
                    turns
                        .iter()
                        .find(|t| t.idx == idx)
                        .and_then(|t| t.max_context)
                };
                assert_eq!(max_of(&after, 15), max_of(&before, 15));
                assert_ne!(max_of(&before, 15), Some(999_999));
                assert_eq!(max_of(&after, 20), Some(999_999));
                assert_eq!(after.first().map(|t| t.idx), Some(13));
                session.redaction += 1;
                let again = kept.turns(c, &session, 21)?;
                assert_eq!(max_of(&again, 15), Some(999_999));
                Ok(())
            })
            .unwrap();
    }

    /// The verbatim tail's walk with the sizes kept from a session's earlier
    /// turns finds what the one statement over the whole tail finds: at
    /// every turn in order, with turns skipped, from the start again, with
    /// a tail that reaches past the turns kept (and past the most kept), the
    /// latest compaction's boundary moving, and with nothing kept.
    #[test]
    fn the_tail_walked_with_kept_sizes_is_the_whole_walks() {
        let (_dir, store) = seeded(150);
        store
            .with_conn(|c| {
                let session = store::get_session(c, SessionId(1))?;
                let kept = TurnSizes::default();
                let mut checked = (0, 0);
                let turns_at = (0..=152)
                    .chain([3, 4, 40])
                    .chain((10..=152).step_by(7))
                    .chain(100..=152);
                for (n, t) in turns_at.enumerate() {
                    let n = n as i64;
                    // The tail's size (tokens): a turn's text is 0-1,000;
                    // from none at all to more than the most turns kept.
                    let keep = [0, 150, 400, 1_000, 3_000, 40_000][(n % 6) as usize];
                    let after = [-1, t - 30, t / 2, t - 2][(n % 4) as usize].max(-1);
                    let boundary = t - 1 - n % 3;
                    let want =
                        store::recent_window_boundary(c, session.id, t, after, boundary, keep)?;
                    let got = kept.boundary(c, &session, t, after, boundary, keep)?;
                    assert_eq!(got, want, "turn {t}, after {after}, keep {keep}");
                    let alone =
                        TurnSizes::default().boundary(c, &session, t, after, boundary, keep)?;
                    assert_eq!(alone, want, "turn {t}, nothing kept");
                    checked.0 += 1;
                    checked.1 += i64::from(want < boundary);
                }
                assert!(checked.0 >= 200 && checked.1 >= 50, "{checked:?}");
                // A tail of more turns than a session keeps, turn after turn.
                for t in 120..=152 {
                    let want = store::recent_window_boundary(c, session.id, t, -1, t - 1, 1 << 40)?;
                    assert_eq!(want, -1);
                    assert_eq!(
                        kept.boundary(c, &session, t, -1, t - 1, 1 << 40)?,
                        want,
                        "turn {t}"
                    );
                }
                Ok(())
            })
            .unwrap();
    }

    /// A finished turn's size is read once: the next turns' tails keep it
    /// (a step added to it afterwards, as nothing in abridge does, is not
    /// seen), while a turn not walked yet is read, and a new redaction of
    /// the session reads its turns again.
    #[test]
    fn a_sessions_tail_reads_only_the_turns_finished_since_its_last_walk() {
        let (_dir, store) = seeded(30);
        store
            .with_conn(|c| {
                let mut session = store::get_session(c, SessionId(1))?;
                let kept = TurnSizes::default();
                let keep = 1_000_000;
                let before = kept.boundary(c, &session, 20, -1, 19, keep)?;
                assert_eq!(before, -1, "every turn fits");
                let probe = |c: &crate::store::Connection, turn: i64| {
                    c.execute(
                        "INSERT INTO steps (turn_id, idx, status, response, created_at) \
                         VALUES (?1, 9, 'completed', ?2, 0)",
                        rusqlite::params![100 + turn, "p".repeat(8_000_000)],
                    )
                };
                probe(c, 15)?; // kept from the walk at turn 20
                assert_eq!(kept.boundary(c, &session, 21, -1, 20, keep)?, -1);
                assert_eq!(
                    store::recent_window_boundary(c, session.id, 21, -1, 20, keep)?,
                    15,
                    "the probe is seen when the turn is read"
                );
                probe(c, 21)?; // not walked yet
                assert_eq!(kept.boundary(c, &session, 22, -1, 21, keep)?, 21);
                session.redaction += 1;
                assert_eq!(kept.boundary(c, &session, 22, -1, 21, keep)?, 21);
                assert_eq!(kept.boundary(c, &session, 21, -1, 20, keep)?, 15);
                Ok(())
            })
            .unwrap();
    }
}
