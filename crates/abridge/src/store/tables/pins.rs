//! Pinned facts: recorded with the turn that states them, read back live at a
//! boundary (the newest value of each slot).

use crate::error::Result;
use crate::ids::SessionId;
use crate::message::{ModelResponse, ResponseBlock};
use crate::pins::{Fact, FactKind, FactSource, Pin, PinExtractor, MAX_PINS_PER_TURN};
use crate::store::db::{Connection, OptionalExtension};
use crate::store::history::{load_own_turn, HistoryTurn};
use rusqlite::params;

/// A pin's columns; the value it replaced is read only when it differs (a
/// value mentioned again supersedes its own earlier pin).
const PIN_COLUMNS: &str = "p.id, p.turn_index, p.kind, p.slot, p.value, p.sentence, p.source, \
     p.supersedes, (SELECT o.value FROM pins o WHERE o.id = p.supersedes AND o.value <> p.value), \
     p.windowed";

fn pin_from_row(r: &crate::store::Row<'_>) -> rusqlite::Result<Pin> {
    let kind: String = r.get(2)?;
    let source: String = r.get(6)?;
    Ok(Pin {
        id: r.get(0)?,
        turn_index: r.get(1)?,
        kind: FactKind::parse(&kind).unwrap_or(FactKind::Host),
        slot: r.get(3)?,
        value: r.get(4)?,
        sentence: r.get(5)?,
        source: FactSource::parse(&source).unwrap_or(FactSource::Host),
        supersedes: r.get(7)?,
        superseded_value: r.get(8)?,
        window: u8::try_from(r.get::<_, i64>(9)?).unwrap_or(0),
    })
}

/// Records `facts` stated in turn `turn_index` (inside the caller's write
/// transaction). A slotted fact is recorded only when its value differs from
/// the slot's newest, which it then supersedes. A fact without a slot is not
/// recorded when a slotted pin holds its value, nor when a pin of it lives
/// for good; one mentioned in passing again in a later turn is recorded at
/// this turn, superseding its earlier pin (it refreshes its turn, so it stays
/// in its window; a user repeating a tool's or the assistant's value makes it
/// the user's, while a tool repeating the user's keeps it the user's).
/// Returns how many rows were written.
pub(crate) fn record_facts(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
    source: FactSource,
    facts: &[Fact],
) -> Result<usize> {
    let facts: Vec<(FactSource, &Fact)> = facts.iter().map(|f| (source, f)).collect();
    record_all(conn, session_id, turn_index, &facts)
}

/// Who holds a value a fact without a slot states: a slotted pin first (any
/// of its values, superseded or not), else the value's pin not superseded,
/// and whether a pin of its window was stated after it (through `pins_live`,
/// stopping at the first). Each half looks in a partial index of its own
/// (`pins_slotted_by_value`, `pins_held_by_value`, schema 13) and visits at
/// most one row: a value restated every turn has a pin a turn, superseded
/// but kept, which a look through all of them would visit at every step.
/// At most two rows, one a half; [`holder`] prefers the slotted one (an
/// `ORDER BY` over the two would build a temporary b-tree at every run).
const HELD_SQL: &str = "\
     SELECT * FROM (SELECT p.slot IS NOT NULL AS slotted, p.id, p.turn_index, p.windowed, \
     p.kind, p.sentence, p.source, 0 = 1 AS overtaken FROM pins p \
     WHERE p.session_id = ?1 AND p.value = ?2 AND p.slot IS NOT NULL LIMIT 1) slotted \
     UNION ALL SELECT * FROM (SELECT p.slot IS NOT NULL AS slotted, p.id, p.turn_index, \
     p.windowed, p.kind, p.sentence, p.source, EXISTS (SELECT 1 FROM pins n \
     WHERE n.session_id = p.session_id AND n.windowed = p.windowed \
     AND n.superseded_at IS NULL AND n.turn_index > p.turn_index) AS overtaken \
     FROM pins p WHERE p.session_id = ?1 AND p.value = ?2 \
     AND p.slot IS NULL AND p.superseded_by IS NULL \
     ORDER BY p.turn_index DESC, p.id DESC LIMIT 1) held";

/// Marks a value's earlier pin (`?4`) superseded by the one just written in
/// turn `?3`, read in the same statement. That row is not superseded, which
/// the read says, so `pins_held_by_value` (which holds just such rows, by
/// session, value and turn) finds it and gives the newest first: with the
/// value alone it would go through every pin of the session and sort them.
const MARK_RESTATED_SQL: &str = "UPDATE pins SET superseded_by = (SELECT n.id FROM pins n \
     WHERE n.session_id = ?1 AND n.value = ?2 AND n.turn_index = ?3 \
     AND n.slot IS NULL AND n.superseded_by IS NULL ORDER BY n.id DESC LIMIT 1), \
     superseded_at = ?3 WHERE id = ?4 AND superseded_by IS NULL";

/// The holder of `value` ([`HELD_SQL`]): the slotted row if there is one,
/// else the other, whichever order they came in.
fn holder(conn: &Connection, session_id: SessionId, value: &str) -> Result<Option<Holder>> {
    let mut st = conn.prepare_cached(HELD_SQL)?;
    let mut rows = st.query(params![session_id, value])?;
    let mut found = None;
    while let Some(r) = rows.next()? {
        let h = holder_from_row(&r)?;
        if matches!(h, Holder::Slot) {
            return Ok(Some(h));
        }
        found = Some(h);
    }
    Ok(found)
}

/// The pin that holds a value a fact without a slot states.
#[derive(Clone)]
enum Holder {
    /// A slot's value, now or before: never pinned apart.
    Slot,
    /// The value's pin not superseded.
    Pin {
        id: i64,
        turn_index: i64,
        window: u8,
        kind: String,
        sentence: String,
        source: String,
        /// Whether a pin of its window was stated after it: if not, it is
        /// still the newest, and a refresh would change nothing.
        overtaken: bool,
    },
}

fn holder_from_row(r: &crate::store::Row<'_>) -> rusqlite::Result<Holder> {
    if r.get::<_, bool>(0)? {
        return Ok(Holder::Slot);
    }
    Ok(Holder::Pin {
        id: r.get(1)?,
        turn_index: r.get(2)?,
        window: u8::try_from(r.get::<_, i64>(3)?).unwrap_or(0),
        kind: r.get(4)?,
        sentence: r.get(5)?,
        source: r.get(6)?,
        overtaken: r.get(7)?,
    })
}
/// The newest pin of a slot.
const NEWEST_OF_SLOT_SQL: &str = "SELECT id, value FROM pins WHERE session_id = ?1 AND slot = ?2 \
     ORDER BY id DESC LIMIT 1";

/// The session's live slots, newest first (for a correction naming none).
const RECENT_SLOTS_SQL: &str = "SELECT slot, value FROM pins WHERE session_id = ?1 \
     AND windowed = 0 AND superseded_at IS NULL AND slot IS NOT NULL \
     ORDER BY turn_index DESC, id DESC LIMIT 50";

/// `facts` with each [`LAST_SLOT`](crate::pins::LAST_SLOT) resolved to the
/// slot last mentioned with a value of its shape (stated earlier in the same
/// batch, or the session's live slots); a correction with none stands alone.
fn resolve_corrections(
    conn: &Connection,
    session_id: SessionId,
    facts: &[(FactSource, &Fact)],
) -> Result<Vec<(FactSource, Fact)>> {
    let stored: Vec<(String, String)> = {
        let mut st = conn.prepare_cached(RECENT_SLOTS_SQL)?;
        let rows = st.query_map(params![session_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut batch: Vec<(String, String)> = Vec::new();
    let mut out = Vec::with_capacity(facts.len());
    for (source, f) in facts {
        let mut f = (*f).clone();
        if let Some(marker) = f.slot.take_if(|s| crate::pins::is_unresolved_slot(s)) {
            let recent = batch
                .iter()
                .rev()
                .chain(stored.iter())
                .map(|(s, v)| (s.as_str(), v.as_str()));
            f.slot = crate::pins::resolve_slot(&marker, &f.value, recent);
        }
        if let Some(slot) = &f.slot {
            batch.push((slot.clone(), f.value.clone()));
        }
        out.push((*source, f));
    }
    Ok(out)
}

/// [`record_facts`] for facts of several sources, in order. What the
/// store holds is read for all of them first (queued together: one round
/// trip on PostgreSQL), and what this batch records is followed in memory,
/// so a fact reads as if each before it were already written. An insert
/// waits for its id only when a row must name it (a pin it supersedes, in
/// the store or in this batch).
fn record_all(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
    facts: &[(FactSource, &Fact)],
) -> Result<usize> {
    // A correction naming no slot takes the slot last mentioned with a
    // value of its shape (read only when a turn has one).
    let resolved: Vec<(FactSource, Fact)>;
    let owned: Vec<(FactSource, &Fact)>;
    let facts = if facts.iter().any(|(_, f)| {
        f.slot
            .as_deref()
            .is_some_and(crate::pins::is_unresolved_slot)
    }) {
        resolved = resolve_corrections(conn, session_id, facts)?;
        owned = resolved.iter().map(|(s, f)| (*s, f)).collect();
        &owned[..]
    } else {
        facts
    };
    let facts: Vec<&(FactSource, &Fact)> = facts
        .iter()
        .filter(|(_, f)| !f.value.trim().is_empty())
        .collect();
    for (_, f) in &facts {
        match &f.slot {
            None => conn.prefetch(HELD_SQL, params![session_id, f.value])?,
            Some(slot) => conn.prefetch(NEWEST_OF_SLOT_SQL, params![session_id, slot])?,
        }
    }
    // What the store held before this batch, per fact: for one without a
    // slot whether its value is held, for one with a slot the slot's newest.
    #[derive(Clone)]
    enum Found<'f> {
        Held(Option<Holder>),
        Newest(&'f str, Option<(i64, String)>),
    }
    let mut found: Vec<Found> = Vec::with_capacity(facts.len());
    for (i, (_, f)) in facts.iter().enumerate() {
        // The same lookup as an earlier fact's: its answer (a prefetched
        // read is served once).
        let same = facts[..i]
            .iter()
            .position(|(_, g)| match (&f.slot, &g.slot) {
                (None, None) => f.value == g.value,
                (Some(a), Some(b)) => a == b,
                _ => false,
            });
        if let Some(j) = same {
            found.push(found[j].clone());
            continue;
        }
        found.push(match &f.slot {
            None => Found::Held(holder(conn, session_id, &f.value)?),
            Some(slot) => Found::Newest(
                slot,
                conn.prepare_cached(NEWEST_OF_SLOT_SQL)?
                    .query_row(params![session_id, slot], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?,
            ),
        });
    }
    // What this batch wrote: the values, and each slot's newest (its id when
    // known).
    let mut values: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut slots: std::collections::HashMap<&str, (Option<i64>, &str)> =
        std::collections::HashMap::new();
    let now = conn.now_ms();
    let mut written = 0;
    for (i, ((source, f), found)) in facts.iter().zip(found).enumerate() {
        // What the row says, when not the fact as stated: a tool repeating
        // the user's value keeps the user's kind, sentence and source.
        let mut kept: Option<(String, String, FactSource, u8)> = None;
        let supersedes = match found {
            Found::Held(_) if values.contains(f.value.as_str()) => continue,
            Found::Held(None) => None,
            Found::Held(Some(Holder::Slot)) => continue,
            Found::Held(Some(Holder::Pin {
                id,
                turn_index: held_at,
                window,
                kind,
                sentence,
                source: held_by,
                overtaken,
            })) => {
                let held_by = FactSource::parse(&held_by).unwrap_or(FactSource::Host);
                let users = |s: FactSource| matches!(s, FactSource::User | FactSource::Host);
                let taken_over = users(*source) && !users(held_by);
                // Live for good, stated in this turn already, or still the
                // newest of its window (unless the user takes a tool's value
                // over): nothing to refresh.
                if window == 0 || held_at >= turn_index || !(overtaken || taken_over) {
                    continue;
                }
                if users(held_by) && !users(*source) {
                    kept = Some((kind, sentence, held_by, window));
                }
                Some(id)
            }
            Found::Newest(slot, stored) => {
                let newest = match slots.get(slot) {
                    Some((id, v)) => Some((*id, *v)),
                    None => stored.as_ref().map(|(id, v)| (Some(*id), v.as_str())),
                };
                match newest {
                    Some((_, v)) if v == f.value => continue,
                    Some((Some(id), _)) => Some(id),
                    // Written by this batch without its id (not expected: a
                    // pin a later fact of its slot may supersede waits for
                    // it): read it.
                    Some((None, _)) => conn
                        .prepare_cached(NEWEST_OF_SLOT_SQL)?
                        .query_row(params![session_id, slot], |r| r.get::<_, i64>(0))
                        .optional()?,
                    None => None,
                }
            }
        };
        // Named later: by the pin it supersedes, or by a newer one of its slot.
        let named_later = f.slot.as_ref().is_some_and(|slot| {
            facts[i + 1..]
                .iter()
                .any(|(_, g)| g.slot.as_ref() == Some(slot))
        });
        let sql = "INSERT INTO pins (session_id, turn_index, kind, slot, value, sentence, \
             source, supersedes, windowed, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING";
        let (kind, sentence, source, window) = match &kept {
            Some((kind, sentence, source, window)) => {
                (kind.as_str(), sentence.as_str(), *source, *window)
            }
            None => (
                f.kind.as_str(),
                f.sentence.as_str(),
                *source,
                crate::pins::window_group(f.kind, f.slot.is_some(), *source),
            ),
        };
        let values_of = params![
            session_id,
            turn_index,
            kind,
            f.slot,
            f.value,
            sentence,
            source.as_str(),
            supersedes,
            window,
            now
        ];
        if let (None, Some(old)) = (&f.slot, supersedes) {
            // Mentioned again: the new row is the value's in this turn, so
            // the earlier one names it by a read in the same statement, and
            // both go with the next request on PostgreSQL (no round trip).
            conn.execute_later(sql, values_of)?;
            conn.execute_later(
                MARK_RESTATED_SQL,
                params![session_id, f.value, turn_index, old],
            )?;
            values.insert(&f.value);
            written += 1;
            continue;
        }
        let id = if supersedes.is_some() || named_later {
            match conn.insert_returning_id(sql, values_of)? {
                Some(id) => Some(id),
                // Not written: the store already holds it.
                None => continue,
            }
        } else {
            // Nothing names it: on PostgreSQL it goes with the next request.
            // The lookups above rule out the one conflict (a value without
            // a slot pinned in this turn), and the write lock keeps them true.
            conn.execute_later(sql, values_of)?;
            None
        };
        if let (Some(id), Some(old)) = (id, supersedes) {
            conn.execute_later(
                "UPDATE pins SET superseded_by = ?1, superseded_at = ?2 \
                 WHERE id = ?3 AND superseded_by IS NULL",
                params![id, turn_index, old],
            )?;
        }
        values.insert(&f.value);
        if let Some(slot) = &f.slot {
            slots.insert(slot, (id, &f.value));
        }
        written += 1;
    }
    Ok(written)
}

/// Extracts and records the facts of turn `turn_index` (its input, the
/// assistant's text and the full tool results of its completed steps), inside
/// the transaction that finishes the turn; at most
/// [`MAX_PINS_PER_TURN`](crate::pins::MAX_PINS_PER_TURN).
/// A turn holding more text than this has its facts extracted inside
/// `store::may_block` (about 40 ns a byte with the built-in extractor).
const LONG_EXTRACTION_BYTES: usize = 64 << 10;

pub(crate) fn pin_turn(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
    extractor: &dyn PinExtractor,
    written: Option<&HistoryTurn>,
) -> Result<usize> {
    let mut facts: Vec<(FactSource, Fact)> = Vec::new();
    let mut record = |source: FactSource, text: &str| {
        let seen = facts.len();
        if seen >= MAX_PINS_PER_TURN {
            return;
        }
        let mut found = extractor.extract(text, source);
        found.truncate(MAX_PINS_PER_TURN - seen);
        facts.extend(found.into_iter().map(|f| (source, f)));
    };
    // The turn's rows as its runner wrote them (the same strings), or read.
    let loaded;
    let turns: &[HistoryTurn] = match written {
        Some(t) => std::slice::from_ref(t),
        None => {
            loaded = load_own_turn(conn, session_id, turn_index)?;
            &loaded
        }
    };
    let mut extract = || {
        for turn in turns {
            record(FactSource::User, &turn.input);
            for step in &turn.steps {
                if let Ok(resp) = serde_json::from_str::<ModelResponse>(&step.response) {
                    for block in &resp.blocks {
                        if let ResponseBlock::Text { text } = block {
                            record(FactSource::Assistant, text);
                        }
                    }
                }
                for (_, result, _) in &step.results {
                    record(FactSource::Tool, result);
                }
            }
        }
    };
    // A long turn's extraction: off the calling worker's other tasks.
    let bytes: usize = turns
        .iter()
        .flat_map(|t| {
            let steps = t.steps.iter();
            let results = steps.flat_map(|s| {
                s.results
                    .iter()
                    .map(|r| r.1.len())
                    .chain([s.response.len()])
            });
            results.chain([t.input.len()])
        })
        .sum();
    if bytes > LONG_EXTRACTION_BYTES {
        crate::store::may_block(extract);
    } else {
        extract();
    }
    let facts: Vec<(FactSource, &Fact)> = facts.iter().map(|(s, f)| (*s, f)).collect();
    record_all(conn, session_id, turn_index, &facts)
}

/// Pins a host's fact before the session's next turn.
pub(crate) fn pin_host_fact(conn: &Connection, session_id: SessionId, fact: &Fact) -> Result<i64> {
    let next: i64 = conn
        .prepare_cached("SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE session_id = ?1")?
        .query_row([session_id], |r| r.get(0))?;
    record_facts(
        conn,
        session_id,
        next,
        FactSource::Host,
        std::slice::from_ref(fact),
    )?;
    Ok(next)
}

/// The live pins stated at or before turn `boundary`, in the order they were
/// stated: the newest value of each slot, every other fact that is not
/// mentioned in passing, and the `window` newest of those that are, counted
/// apart for the user and for the tools and the assistant
/// ([`Fact::in_passing`](crate::pins::Fact::in_passing)). Read through the
/// `pins_live` index: never every value a slot ever had, nor every id a tool
/// ever returned.
/// Whose pins are live at boundary `?2` of session `?1`: a fork's parent's
/// (or further ancestor's) at or before its fork point, where the fork's
/// history is theirs; the session's own after it (a fork holds, from its
/// fork point on, its own copies of the pins live there).
const OWNER: &str = "coalesce((SELECT l.owner_id FROM session_lineage l \
     WHERE l.session_id = ?1 AND l.after_idx < ?2 AND l.upto_idx >= ?2), ?1)";

/// The ids of the `window` newest pins of window group `group` live at the
/// boundary, in two parts: those not superseded, read through `pins_live`
/// newest first (the index covers them and gives them in order), and those
/// superseded (mentioned again) after the boundary, a range the index cannot
/// order, sorted. Each part stops at the window; [`live_pins`] keeps the
/// `window` newest of the two.
fn window_sql(group: u8) -> String {
    format!(
        "SELECT id FROM (SELECT p.id FROM pins p WHERE p.session_id = {OWNER} \
         AND p.windowed = {group} AND p.superseded_at IS NULL AND p.turn_index <= ?2 \
         ORDER BY p.turn_index DESC, p.id DESC LIMIT ?3) AS n{group} \
         UNION ALL \
         SELECT id FROM (SELECT p.id FROM pins p WHERE p.session_id = {OWNER} \
         AND p.windowed = {group} AND p.superseded_at > ?2 AND p.turn_index <= ?2 \
         ORDER BY p.turn_index DESC, p.id DESC LIMIT ?3) AS s{group}"
    )
}

/// [`live_pins`]'s query, made once. The live set is chosen by id alone
/// (index-only reads, small rows to sort) and each pin's row is read once,
/// in id order: the windows' merges sorted whole rows (sentences and all),
/// 220 µs a read at 100 pins in passing against 135 then; merging each
/// window's two parts in SQL sorted them twice more (0.6x the read's time
/// without those sorts, `the_live_pins_read_sorts_only_the_pins_superseded_after_the_boundary`).
fn live_pins_sql() -> &'static str {
    sql_once!(
        "SELECT {PIN_COLUMNS} FROM pins p WHERE p.id IN (\
             SELECT p.id FROM pins p WHERE p.session_id = {OWNER} AND p.windowed = 0 \
             AND p.superseded_at IS NULL AND p.turn_index <= ?2 \
             UNION ALL \
             SELECT p.id FROM pins p WHERE p.session_id = {OWNER} AND p.windowed = 0 \
             AND p.superseded_at > ?2 AND p.turn_index <= ?2 \
             UNION ALL {w1} UNION ALL {w2}) ORDER BY p.id",
        w1 = window_sql(1),
        w2 = window_sql(2),
    )
}

/// Keeps the `window` newest (by turn, then id) of each group in passing of
/// `pins` (in id order, each group's two parts read up to `window` each).
fn cut_windows(pins: &mut Vec<Pin>, window: usize) {
    for group in [1, 2] {
        let mut newest: Vec<(i64, i64)> = pins
            .iter()
            .filter(|p| p.window == group)
            .map(|p| (p.turn_index, p.id))
            .collect();
        if newest.len() <= window {
            continue;
        }
        newest.sort_unstable_by(|a, b| b.cmp(a));
        let oldest_kept = window.checked_sub(1).map(|i| newest[i]);
        pins.retain(|p| {
            p.window != group || oldest_kept.is_some_and(|k| (p.turn_index, p.id) >= k)
        });
    }
}

/// Queues [`live_pins`]'s read (see [`Connection::prefetch`]).
pub(crate) fn prefetch_live_pins(
    conn: &Connection,
    session_id: SessionId,
    boundary: i64,
    window: usize,
) -> Result<()> {
    let window = i64::try_from(window).unwrap_or(i64::MAX);
    conn.prefetch(live_pins_sql(), params![session_id, boundary, window])
}

pub(crate) fn live_pins(
    conn: &Connection,
    session_id: SessionId,
    boundary: i64,
    window: usize,
) -> Result<Vec<Pin>> {
    let mut st = conn.prepare_cached(live_pins_sql())?;
    let bound = i64::try_from(window).unwrap_or(i64::MAX);
    let rows = st.query_map(params![session_id, boundary, bound], pin_from_row)?;
    let mut pins: Vec<Pin> = rows.collect::<rusqlite::Result<_>>()?;
    cut_windows(&mut pins, window);
    Ok(pins)
}

/// Every pin of a session, superseded ones included, in order.
pub(crate) fn list_pins(conn: &Connection, session_id: SessionId) -> Result<Vec<Pin>> {
    let mut st = conn.prepare_cached(sql_once!(
        "SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 ORDER BY p.id"
    ))?;
    let rows = st.query_map([session_id], pin_from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Pins the finished turns of a store written before pins existed (run by the
/// migration to version 3, with the built-in extractor).
pub(crate) fn backfill(conn: &Connection) -> Result<usize> {
    let turns: Vec<(SessionId, i64)> = {
        let mut st = conn.prepare(
            "SELECT session_id, idx FROM turns WHERE status IN ('completed', 'failed') \
             ORDER BY session_id, idx",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut written = 0;
    for (sid, idx) in turns {
        written += pin_turn(conn, sid, idx, &crate::pins::RuleExtractor, None)?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::FactKind;

    /// The live pins' read (read at every step that folds or carries pins)
    /// keeps the plan it was prepared with whatever its boundary and window:
    /// SQLite re-prepared it at every run when a plan could depend on the
    /// values bound (its `LIMIT`s in nested `UNION ALL`s did), about 8% of
    /// a step's CPU in the step bench's profile.
    #[test]
    fn the_live_pins_read_is_prepared_once_whatever_its_boundary() {
        with_session(|c, sid| {
            for turn in 0..6 {
                record_facts(
                    c,
                    sid,
                    turn,
                    FactSource::Tool,
                    &[id(&format!("ORD-{turn}"))],
                )?;
            }
            for (boundary, window) in [(1, 100), (3, 100), (5, 2), (2, 1), (6, 100)] {
                live_pins(c, sid, boundary, window)?;
            }
            let raw = c.as_sqlite().expect("an SQLite store");
            let st = raw.prepare_cached(live_pins_sql())?;
            assert_eq!(st.get_status(rusqlite::StatementStatus::RePrepare), 0);
            Ok(())
        });
    }

    /// The live pins' read sorts only what its index cannot give in order:
    /// the pins superseded after the boundary (a range on `superseded_at`),
    /// one sort for each group in passing. The newest of each group come
    /// through `pins_live` in order, and the window is cut in Rust from the
    /// two parts (merging them in SQL sorted both again, a temporary b-tree
    /// each, at every read: 0.6x the read's time without them).
    #[test]
    fn the_live_pins_read_sorts_only_the_pins_superseded_after_the_boundary() {
        with_session(|c, _| {
            let raw = c.as_sqlite().expect("an SQLite store");
            let mut st = raw.prepare(&format!("EXPLAIN {}", live_pins_sql()))?;
            let ops: Vec<String> = st
                .query_map(params![1, 1, 1], |r| r.get::<_, String>(1))?
                .collect::<rusqlite::Result<_>>()?;
            let sorts = ops
                .iter()
                .filter(|o| *o == "SorterOpen" || *o == "OpenEphemeral")
                .count();
            // Two sorts, and the `IN` list's own table of ids.
            assert_eq!(sorts, 3, "{ops:?}");
            Ok(())
        });
    }

    /// The mark of a restated value's earlier pin finds the pin just written
    /// through `pins_held_by_value`, newest first as the index holds them:
    /// no other index of the pins' values is left to serve it (schema 15
    /// dropped `pins_by_value`), and through `pins_live` it would visit every
    /// pin of the session and sort them at every restatement.
    #[test]
    fn the_mark_of_a_restated_value_reads_one_index_entry() {
        with_session(|c, _| {
            let raw = c.as_sqlite().expect("an SQLite store");
            let mut st = raw.prepare(&format!("EXPLAIN QUERY PLAN {MARK_RESTATED_SQL}"))?;
            let plan: Vec<String> = st
                .query_map(params![1, "ORD-1", 2, 1], |r| r.get::<_, String>(3))?
                .collect::<rusqlite::Result<_>>()?;
            assert!(
                plan.iter().any(|l| l.starts_with("SEARCH n USING INDEX pins_held_by_value (session_id=? AND value=? AND turn_index=?)")),
                "{plan:?}"
            );
            assert!(!plan.iter().any(|l| l.contains("TEMP B-TREE")), "{plan:?}");
            let indexes: Vec<String> = raw
                .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'pins' ORDER BY name")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            assert!(!indexes.iter().any(|n| n == "pins_by_value"), "{indexes:?}");
            Ok(())
        });
    }

    /// The mark of a restated value names the pin written in its turn, and
    /// only the earlier pin changes.
    #[test]
    fn a_restated_value_supersedes_its_earlier_pin_with_the_new_one() {
        with_session(|c, sid| {
            record_facts(c, sid, 0, FactSource::Tool, &[id("ORD-1")])?;
            // Overtaken in its window by later values, then restated.
            for turn in 1..4 {
                record_facts(
                    c,
                    sid,
                    turn,
                    FactSource::Tool,
                    &[id(&format!("ORD-{}", turn + 1))],
                )?;
            }
            let before: Vec<Pin> = list_pins(c, sid)?;
            record_facts(c, sid, 4, FactSource::Tool, &[id("ORD-1")])?;
            let after: Vec<Pin> = list_pins(c, sid)?;
            let rows: Vec<(i64, i64, Option<i64>, Option<i64>)> = c
                .prepare(
                    "SELECT id, turn_index, superseded_by, superseded_at FROM pins \
                     WHERE value = 'ORD-1' ORDER BY id",
                )?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            assert_eq!(rows.len(), 2, "{rows:?}");
            let (old, new) = (rows[0], rows[1]);
            assert_eq!((old.1, new.1), (0, 4));
            assert_eq!((old.2, old.3), (Some(new.0), Some(4)), "{rows:?}");
            assert_eq!((new.2, new.3), (None, None), "{rows:?}");
            assert_eq!(after.len(), before.len() + 1);
            Ok(())
        });
    }

    /// The live pins' read agrees with its definition at every boundary and
    /// window: the pins stated at or before the boundary and not superseded
    /// by then, all of those held for good and the `window` newest of each
    /// group in passing, in id order. Facts of every group, restated and
    /// re-slotted across 40 turns.
    #[test]
    fn the_live_pins_read_agrees_with_its_definition() {
        with_session(|c, sid| {
            let mut seed: u64 = 7;
            let mut next = |n: u64| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) % n
            };
            for turn in 0..40 {
                for _ in 0..1 + next(3) {
                    let (source, fact) = match next(4) {
                        0 => (FactSource::Tool, id(&format!("TK-{}", next(12)))),
                        1 => (FactSource::User, id(&format!("ORD-{}", next(12)))),
                        2 => (
                            FactSource::Host,
                            Fact::host(Some("size"), &format!("EU {}", next(5))),
                        ),
                        _ => (
                            FactSource::Host,
                            Fact::host(None, &format!("rule {}", next(6))),
                        ),
                    };
                    record_facts(c, sid, turn, source, &[fact])?;
                }
            }
            let rows: Vec<(i64, i64, i64, Option<i64>)> = {
                let mut st = c.prepare(
                    "SELECT id, windowed, turn_index, superseded_at FROM pins \
                     WHERE session_id = 1 ORDER BY id",
                )?;
                let rows =
                    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let groups: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.1).collect();
            assert_eq!(groups.len(), 3, "every group is exercised: {groups:?}");
            for boundary in -1..42 {
                for window in [0, 1, 2, 3, 5, 100] {
                    let live = |r: &&(i64, i64, i64, Option<i64>)| {
                        r.2 <= boundary && r.3.is_none_or(|at| at > boundary)
                    };
                    let mut want: Vec<i64> = rows
                        .iter()
                        .filter(live)
                        .filter(|r| r.1 == 0)
                        .map(|r| r.0)
                        .collect();
                    for group in [1, 2] {
                        let mut of: Vec<_> =
                            rows.iter().filter(live).filter(|r| r.1 == group).collect();
                        of.sort_by_key(|r| std::cmp::Reverse((r.2, r.0)));
                        want.extend(of.iter().take(window).map(|r| r.0));
                    }
                    want.sort_unstable();
                    let got: Vec<i64> = live_pins(c, sid, boundary, window)?
                        .iter()
                        .map(|p| p.id)
                        .collect();
                    assert_eq!(got, want, "boundary {boundary}, window {window}");
                }
            }
            Ok(())
        });
    }

    /// Runs `f` on a fresh store's connection with session 1 in it.
    fn with_session(f: impl FnOnce(&Connection, SessionId) -> Result<()>) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path().join("p.db")).unwrap();
        store
            .with_conn(|c| {
                c.execute_batch(
                    "INSERT INTO sessions (id, external_id, model, system_prompt, created_at) \
                     VALUES (1, 's', 'm', 'p', 0)",
                )?;
                f(c, SessionId(1))
            })
            .unwrap();
    }

    fn id(value: &str) -> Fact {
        Fact {
            kind: FactKind::Id,
            slot: None,
            value: value.into(),
            sentence: format!("The order is {value}."),
        }
    }

    /// Who holds a value a fact without a slot states (`HELD_SQL`): a slot
    /// that has or had the value holds it (never pinned apart); else the
    /// value's pin not superseded, refreshed when overtaken in its window,
    /// so each value has one live pin however often it is restated.
    #[test]
    fn a_value_is_held_by_a_slot_first_then_by_its_one_pin_not_superseded() {
        with_session(|c, sid| {
            let colour = |v: &str| Fact::host(Some("colour"), v);
            let host = FactSource::Host;
            let tool = FactSource::Tool;
            assert_eq!(record_facts(c, sid, 0, host, &[colour("blue")])?, 1);
            assert_eq!(record_facts(c, sid, 0, tool, &[id("ORD-1")])?, 1);
            assert_eq!(record_facts(c, sid, 1, host, &[colour("red")])?, 1);
            // The slot's value now and its value before: held by it.
            assert_eq!(record_facts(c, sid, 2, tool, &[id("red"), id("blue")])?, 0);
            // ORD-1 overtaken in its window, then restated: refreshed,
            // twice over.
            for (turn, other) in [(3, "ORD-2"), (5, "ORD-3")] {
                assert_eq!(record_facts(c, sid, turn, tool, &[id(other)])?, 1);
                assert_eq!(record_facts(c, sid, turn + 1, tool, &[id("ORD-1")])?, 1);
            }
            // Still the newest of its window: nothing to refresh.
            assert_eq!(record_facts(c, sid, 8, tool, &[id("ORD-1")])?, 0);
            let (rows, live, live_turn, apart): (i64, i64, i64, i64) = c.query_row(
                "SELECT count(*), count(*) FILTER (WHERE superseded_by IS NULL), \
                     max(turn_index) FILTER (WHERE superseded_by IS NULL), \
                     (SELECT count(*) FROM pins WHERE slot IS NULL AND value IN ('red', 'blue')) \
                     FROM pins WHERE session_id = 1 AND value = 'ORD-1'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )?;
            assert_eq!((rows, live, live_turn, apart), (3, 1, 6, 0));
            Ok(())
        });
    }
}
