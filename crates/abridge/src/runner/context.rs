//! The message context a runner keeps per session, extended step by step.
//!
//! A step's messages are the system prompt, the summary it reads, and every
//! completed step since: rows that never change once written (G3). So the
//! array a step sends is the previous step's array plus what completed in
//! between, and its bytes are the previous bytes plus those messages. A
//! [`Context`] keeps the array, its serialised bytes (without the closing `]`)
//! and the SHA-256 state of those bytes; each step appends only the rows
//! written since the last one, read with the same queries and rendered by the
//! same functions as a full build. The result is byte for byte what
//! `replay::build_for` gives (which is what `rebuild_step` uses), without
//! re-reading, re-rendering and re-hashing the whole context at every step.
//!
//! A context is keyed by the compaction it starts from: a new compaction
//! means a new array, built in full. [`ContextCache`] keeps contexts between
//! turns, least recently used first out, within a byte budget.

use crate::error::Result;
use crate::ids::{CompactionId, SessionId};
use crate::message::{Message, ModelRequest};
use crate::render::{render_steps, render_turn, RenderFormat};
use crate::replay::build_for;
use crate::store::Connection;
use crate::store::{self, CompactionRow, HistoryStep, HistoryTurn, SessionRow, TurnRow};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

/// A build or an extension reading more turns than this runs inside
/// `store::may_block`: its time grows with the turns read.
const LONG_BUILD_TURNS: i64 = 32;

/// A session's message array up to a position, serialised and hashed.
pub(crate) struct Context {
    session_id: SessionId,
    /// The session's first own turn (0 unless it is a fork): a range read
    /// from there on reads no ancestor's turns.
    own_from: i64,
    /// The session's newest redaction when it was built: a newer one
    /// changed rows it holds, so it is built again.
    redaction: i64,
    compaction_id: Option<CompactionId>,
    /// `(turn idx, step idx)`: the array holds everything before step `at.1`
    /// of turn `at.0`, that turn's input included.
    at: (i64, i64),
    /// Turn `at.0` finished at step `at.1 - 1` (the runner that wrote its
    /// last step said so, [`Context::finish_turn_written`]): the array holds
    /// all of it, and the next turn's first step needs only that turn's input.
    turn_finished: bool,
    /// The tool results of turn `at.0`'s first `elided` steps are
    /// placeholders (context overflow inside the turn; see
    /// `render::elide_results`). Holds for that turn only.
    elided: i64,
    /// Shared with the request of the step that reads it (no copy per step).
    messages: std::sync::Arc<Vec<Message>>,
    /// Length in bytes and in characters of `[` and the serialised messages
    /// joined by `,` (the bytes a step hashes, less the closing `]`), which
    /// are not kept: the hash state and these counts are all a step needs of
    /// them, so a session's context is held once, as its message array.
    bytes: usize,
    chars: u64,
    /// One message's bytes at a time, reused.
    scratch: Vec<u8>,
    hasher: Sha256,
}

impl Context {
    /// Builds the array of step `at.1` of turn `at.0` reading `compaction`, in
    /// full, with the results of that turn's first `elided` steps elided.
    pub(crate) fn build(
        conn: &Connection,
        session: &SessionRow,
        compaction: Option<&CompactionRow>,
        at: (i64, i64),
        elided: i64,
    ) -> Result<Context> {
        // Many turns to read and render: off the calling worker's other tasks.
        let from = compaction.map_or(0, |c| c.up_to_turn_index + 1);
        let read = || build_for(conn, session, at, compaction, elided, RenderFormat::CURRENT);
        let messages = if at.0 - from > LONG_BUILD_TURNS {
            crate::store::may_block(read)?
        } else {
            read()?
        };
        let mut ctx = Context {
            session_id: session.id,
            own_from: session.first_own_turn(),
            redaction: session.redaction,
            compaction_id: compaction.map(|c| c.id),
            at,
            turn_finished: false,
            elided,
            messages: std::sync::Arc::new(Vec::with_capacity(messages.len())),
            bytes: 1,
            chars: 1,
            scratch: Vec::new(),
            hasher: Sha256::new(),
        };
        ctx.hasher.update(b"[");
        ctx.push(messages);
        Ok(ctx)
    }

    /// `(turn idx, step idx)` it holds everything before.
    pub(crate) fn at(&self) -> (i64, i64) {
        self.at
    }

    /// The compaction it starts from.
    pub(crate) fn compaction_id(&self) -> Option<CompactionId> {
        self.compaction_id
    }

    /// The steps of its turn whose tool results it holds as placeholders.
    pub(crate) fn elided(&self) -> i64 {
        self.elided
    }

    /// Whether this context can be extended to step `at` of `session` reading
    /// compaction `compaction_id` with `elided` steps' results elided (an
    /// elision holds within its turn only).
    pub(crate) fn continues_to(
        &self,
        session_id: SessionId,
        compaction_id: Option<CompactionId>,
        at: (i64, i64),
        elided: i64,
    ) -> bool {
        self.session_id == session_id
            && self.compaction_id == compaction_id
            && self.at <= at
            && self.elided == elided
            && (elided == 0 || self.at.0 == at.0)
    }

    /// The array of step `at` (eliding the results of that turn's first
    /// `elided` steps): this one, extended with the rows written since, or
    /// built in full when this one cannot be extended there.
    pub(crate) fn advance(
        this: Option<Context>,
        conn: &Connection,
        session: &SessionRow,
        compaction: Option<&CompactionRow>,
        at: (i64, i64),
        elided: i64,
    ) -> Result<Context> {
        match this {
            Some(mut ctx)
                if ctx.redaction == session.redaction
                    && ctx.continues_to(session.id, compaction.map(|c| c.id), at, elided) =>
            {
                ctx.extend(conn, at)?;
                Ok(ctx)
            }
            _ => Context::build(conn, session, compaction, at, elided),
        }
    }

    /// The step of turn `turn_idx` that most likely comes next (the one this
    /// context stops before, or the turn's first), with the reads that would
    /// extend this context to it queued (see [`Connection::prefetch`]): a
    /// runner's read transaction sends them with its first request. A wrong
    /// guess costs the server those reads, and the step reads as usual.
    ///
    /// A context of the turn stops before its next step: the runner extends
    /// it past each step it completes from the rows it has just written
    /// ([`Context::extend_written`]).
    pub(crate) fn prefetch_next(
        this: Option<&Context>,
        conn: &Connection,
        session_id: SessionId,
        turn_idx: i64,
    ) -> Result<i64> {
        let Some(ctx) = this.filter(|c| c.session_id == session_id) else {
            return Ok(0);
        };
        let next = if ctx.at.0 == turn_idx { ctx.at.1 } else { 0 };
        if ctx.at < (turn_idx, next) {
            store::prefetch_range(conn, session_id, ctx.at, (turn_idx, next), ctx.own_from)?;
        }
        Ok(next)
    }

    fn extend(&mut self, conn: &Connection, to: (i64, i64)) -> Result<()> {
        if to == self.at {
            return Ok(());
        }
        let read = || store::load_range_from(conn, self.session_id, self.at, to, self.own_from);
        let turns = if to.0 - self.at.0 > LONG_BUILD_TURNS {
            crate::store::may_block(read)?
        } else {
            read()?
        };
        let mut more = Vec::new();
        for turn in &turns {
            if turn.idx == self.at.0 {
                render_steps(&turn.steps, &mut more, RenderFormat::CURRENT)?; // its input is in already
            } else {
                render_turn(turn, &mut more, RenderFormat::CURRENT)?;
            }
        }
        self.push(more);
        self.at = to;
        self.turn_finished = false;
        Ok(())
    }

    /// Extends the array past step `done` of turn `turn_idx`, from the rows
    /// the runner has just written for it instead of reading them back: the
    /// same messages as [`extend`](Context::extend) renders from the stored
    /// rows (the same strings, the same function). Only when the array
    /// stops right before that step; otherwise it is left as it is, and the
    /// next step reads what it lacks.
    pub(crate) fn extend_written(&mut self, turn_idx: i64, done: &HistoryStep) -> Result<()> {
        if self.at != (turn_idx, done.idx) {
            return Ok(());
        }
        let mut more = Vec::new();
        render_steps(std::slice::from_ref(done), &mut more, RenderFormat::CURRENT)?;
        self.push(more);
        self.at = (turn_idx, done.idx + 1);
        self.turn_finished = false;
        Ok(())
    }

    /// As [`extend_written`](Context::extend_written) with the step that
    /// finished turn `turn_idx` (its final answer): the array then holds the
    /// whole turn, and [`begin_turn_written`](Context::begin_turn_written)
    /// takes it to the next turn's first step without a read.
    pub(crate) fn finish_turn_written(&mut self, turn_idx: i64, done: &HistoryStep) -> Result<()> {
        let reached = self.at == (turn_idx, done.idx);
        self.extend_written(turn_idx, done)?;
        self.turn_finished = reached;
        Ok(())
    }

    /// Extends an array that holds the whole of the turn before `turn` (see
    /// [`finish_turn_written`](Context::finish_turn_written)) to `turn`'s
    /// first step: `turn`'s input, the string its row holds, rendered as
    /// [`extend`](Context::extend) renders a turn read with no step yet.
    /// Otherwise the array is left as it is, and the step reads what it
    /// lacks.
    pub(crate) fn begin_turn_written(&mut self, turn: &TurnRow) {
        if !self.turn_finished || self.elided != 0 || turn.idx != self.at.0 + 1 {
            return;
        }
        let mut more = Vec::new();
        let input = HistoryTurn {
            idx: turn.idx,
            input: turn.input.clone(),
            steps: Vec::new(),
        };
        if render_turn(&input, &mut more, RenderFormat::CURRENT).is_err() {
            return;
        }
        self.push(more);
        self.at = (turn.idx, 0);
        self.turn_finished = false;
    }

    fn push(&mut self, messages: Vec<Message>) {
        for m in messages {
            self.scratch.clear();
            if !self.messages.is_empty() {
                self.scratch.push(b',');
            }
            serde_json::to_writer(&mut self.scratch, &m).expect("messages serialise");
            self.hasher.update(&self.scratch);
            self.bytes += self.scratch.len();
            // serde_json writes UTF-8: a character is a byte that does not
            // continue one.
            self.chars += self.scratch.iter().filter(|b| (**b as i8) >= -0x40).count() as u64;
            // Copies only when a request of an earlier step is still held.
            std::sync::Arc::make_mut(&mut self.messages).push(m);
        }
    }

    /// SHA-256 (hex) of the array's bytes: what `to_bytes` of the messages gives.
    pub(crate) fn sha256(&self) -> String {
        let mut h = self.hasher.clone();
        h.update(b"]");
        crate::message::hex(&h.finalize())
    }

    /// Characters of the array's bytes, the closing `]` included.
    pub(crate) fn chars(&self) -> u64 {
        self.chars + 1
    }

    /// The array's bytes as text, the closing `]` included: built anew (for a
    /// token counter that needs the text).
    pub(crate) fn text(&self) -> String {
        String::from_utf8(crate::message::to_bytes(&self.messages)).unwrap_or_default()
    }

    /// The request for the model: the array, shared (not copied).
    pub(crate) fn request(
        &self,
        model: &str,
        tools: Vec<crate::message::ToolSpec>,
    ) -> ModelRequest {
        ModelRequest {
            model: model.to_string(),
            messages: std::sync::Arc::clone(&self.messages),
            tools,
            max_output_tokens: None,
        }
    }

    /// Roughly what the context holds in memory.
    fn weight(&self) -> usize {
        // The array in memory is about the size of its serialised bytes.
        self.bytes + self.scratch.capacity()
    }
}

/// Contexts kept between turns, one per session, within a byte budget.
pub(crate) struct ContextCache {
    budget: usize,
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<SessionId, (u64, Context)>,
    clock: u64,
    weight: usize,
}

impl ContextCache {
    /// A cache holding at most about `budget` bytes; 0 keeps nothing.
    pub(crate) fn new(budget: usize) -> ContextCache {
        ContextCache {
            budget,
            inner: Mutex::new(CacheInner::default()),
        }
    }

    /// Takes the session's context out (a turn owns it while it runs).
    pub(crate) fn take(&self, session_id: SessionId) -> Option<Context> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (_, ctx) = inner.entries.remove(&session_id)?;
        inner.weight -= ctx.weight();
        Some(ctx)
    }

    /// Puts a context back after its turn, evicting the least recently used
    /// ones beyond the budget. A context larger than the whole budget is dropped.
    pub(crate) fn put(&self, ctx: Context) {
        let w = ctx.weight();
        if w > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.clock += 1;
        let tick = inner.clock;
        if let Some((_, old)) = inner.entries.insert(ctx.session_id, (tick, ctx)) {
            inner.weight -= old.weight();
        }
        inner.weight += w;
        while inner.weight > self.budget {
            let Some((&oldest, _)) = inner.entries.iter().min_by_key(|(_, (t, _))| *t) else {
                break;
            };
            if let Some((_, c)) = inner.entries.remove(&oldest) {
                inner.weight -= c.weight();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context keeps no copy of its bytes, only their hash state and
    /// counts: those equal what the serialised array gives, and the request
    /// shares the array.
    #[test]
    fn the_counts_and_hash_kept_equal_those_of_the_serialised_array() {
        use crate::message::{to_bytes, Role};
        let mut ctx = Context {
            session_id: SessionId(1),
            own_from: 0,
            redaction: 0,
            compaction_id: None,
            at: (0, 0),
            turn_finished: false,
            elided: 0,
            messages: Default::default(),
            bytes: 1,
            chars: 1,
            scratch: Vec::new(),
            hasher: Sha256::new(),
        };
        ctx.hasher.update(b"[");
        let messages = vec![
            Message::text(Role::System, "sys"),
            Message::text(Role::User, "naïve café 👩‍👩‍👧 नमस्ते \"quoted\" \u{0}"),
            Message::text(Role::Assistant, "ok"),
        ];
        ctx.push(messages[..2].to_vec());
        ctx.push(messages[2..].to_vec());
        let bytes = to_bytes(&messages);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert_eq!(ctx.chars(), text.chars().count() as u64);
        assert_eq!(ctx.bytes + 1, bytes.len());
        assert_eq!(ctx.text(), text);
        assert_eq!(ctx.sha256(), crate::message::sha256_hex(&bytes));
        let request = ctx.request("m", Vec::new());
        assert!(std::sync::Arc::ptr_eq(&request.messages, &ctx.messages));
    }

    #[test]
    fn the_cache_keeps_the_budget_and_evicts_the_least_recently_used() {
        let ctx = |session_id: i64, n: usize| Context {
            session_id: SessionId(session_id),
            own_from: 0,
            redaction: 0,
            compaction_id: None,
            at: (0, 0),
            turn_finished: false,
            elided: 0,
            messages: Default::default(),
            bytes: n,
            chars: n as u64,
            scratch: Vec::new(),
            hasher: Sha256::new(),
        };
        let cache = ContextCache::new(100);
        cache.put(ctx(1, 40)); // weight 40
        cache.put(ctx(2, 40)); // 80
        cache.put(ctx(3, 40)); // 120 > 100: session 1 goes
        assert!(cache.take(SessionId(1)).is_none());
        assert!(cache.take(SessionId(2)).is_some());
        assert!(cache.take(SessionId(3)).is_some());
        cache.put(ctx(4, 120)); // larger than the budget: not kept
        assert!(cache.take(SessionId(4)).is_none());
        assert_eq!(cache.inner.lock().unwrap().weight, 0);
    }
}
