//! Pinned facts: recorded with the turn that states them, read back live at a
//! boundary (the newest value of each slot).

use super::db::{Connection, OptionalExtension};
use super::history::load_history;
use super::now_ms;
use crate::error::Result;
use crate::ids::SessionId;
use crate::message::{ModelResponse, ResponseBlock};
use crate::pins::{Fact, FactKind, FactSource, Pin, PinExtractor, MAX_PINS_PER_TURN};
use rusqlite::params;

const PIN_COLUMNS: &str = "p.id, p.turn_index, p.kind, p.slot, p.value, p.sentence, p.source, \
     p.supersedes, (SELECT o.value FROM pins o WHERE o.id = p.supersedes)";

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
    })
}

/// Records `facts` stated in turn `turn_index` (inside the caller's write
/// transaction). A fact without a slot is recorded once per session, and not
/// when a pin of the session already holds its value; a slotted one only when
/// its value differs from the slot's newest, which it then supersedes. Returns how many rows were written.
pub(crate) fn record_facts(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
    source: FactSource,
    facts: &[Fact],
) -> Result<usize> {
    let now = now_ms();
    let mut written = 0;
    for f in facts {
        if f.value.trim().is_empty() {
            continue;
        }
        let supersedes = match &f.slot {
            None => {
                let held = conn
                    .prepare_cached(
                        "SELECT 1 FROM pins WHERE session_id = ?1 AND value = ?2 LIMIT 1",
                    )?
                    .exists(params![session_id, f.value])?;
                if held {
                    continue;
                }
                None
            }
            Some(slot) => {
                let newest: Option<(i64, String)> = conn
                    .prepare_cached(
                        "SELECT id, value FROM pins WHERE session_id = ?1 AND slot = ?2 \
                         ORDER BY id DESC LIMIT 1",
                    )?
                    .query_row(params![session_id, slot], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                match newest {
                    Some((_, v)) if v == f.value => continue,
                    other => other.map(|(id, _)| id),
                }
            }
        };
        let id = conn.insert_returning_id(
            "INSERT INTO pins (session_id, turn_index, kind, slot, value, sentence, \
             source, supersedes, windowed, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
            params![
                session_id,
                turn_index,
                f.kind.as_str(),
                f.slot,
                f.value,
                f.sentence,
                source.as_str(),
                supersedes,
                crate::pins::window_group(f.kind, f.slot.is_some(), source),
                now
            ],
        )?;
        let n = usize::from(id.is_some());
        if let (Some(id), Some(old)) = (id, supersedes) {
            conn.prepare_cached(
                "UPDATE pins SET superseded_by = ?1, superseded_at = ?2 \
                 WHERE id = ?3 AND superseded_by IS NULL",
            )?
            .execute(params![id, turn_index, old])?;
        }
        written += n;
    }
    Ok(written)
}

/// Extracts and records the facts of turn `turn_index` (its input, the
/// assistant's text and the full tool results of its completed steps), inside
/// the transaction that finishes the turn; at most
/// [`MAX_PINS_PER_TURN`](crate::pins::MAX_PINS_PER_TURN).
pub(crate) fn pin_turn(
    conn: &Connection,
    session_id: SessionId,
    turn_index: i64,
    extractor: &dyn PinExtractor,
) -> Result<usize> {
    let mut written = 0;
    let mut seen = 0usize;
    let mut record = |source: FactSource, text: &str| -> Result<()> {
        if seen >= MAX_PINS_PER_TURN {
            return Ok(());
        }
        let mut facts = extractor.extract(text, source);
        facts.truncate(MAX_PINS_PER_TURN - seen);
        seen += facts.len();
        written += record_facts(conn, session_id, turn_index, source, &facts)?;
        Ok(())
    };
    for turn in load_history(conn, session_id, turn_index - 1, turn_index, i64::MAX)? {
        record(FactSource::User, &turn.input)?;
        for step in &turn.steps {
            if let Ok(resp) = serde_json::from_str::<ModelResponse>(&step.response) {
                for block in &resp.blocks {
                    if let ResponseBlock::Text { text } = block {
                        record(FactSource::Assistant, text)?;
                    }
                }
            }
            for (_, result, _) in &step.results {
                record(FactSource::Tool, result)?;
            }
        }
    }
    Ok(written)
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
pub(crate) fn live_pins(
    conn: &Connection,
    session_id: SessionId,
    boundary: i64,
    window: usize,
) -> Result<Vec<Pin>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 AND p.windowed = 0 \
         AND p.superseded_at IS NULL AND p.turn_index <= ?2 \
         UNION ALL \
         SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 AND p.windowed = 0 \
         AND p.superseded_at > ?2 AND p.turn_index <= ?2 \
         UNION ALL \
         SELECT * FROM (SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 \
         AND p.windowed = 1 AND p.superseded_at IS NULL AND p.turn_index <= ?2 \
         ORDER BY p.turn_index DESC, p.id DESC LIMIT ?3) AS w1 \
         UNION ALL \
         SELECT * FROM (SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 \
         AND p.windowed = 2 AND p.superseded_at IS NULL AND p.turn_index <= ?2 \
         ORDER BY p.turn_index DESC, p.id DESC LIMIT ?3) AS w2 \
         ORDER BY 1"
    ))?;
    let window = i64::try_from(window).unwrap_or(i64::MAX);
    let rows = st.query_map(params![session_id, boundary, window], pin_from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Every pin of a session, superseded ones included, in order.
pub(crate) fn list_pins(conn: &Connection, session_id: SessionId) -> Result<Vec<Pin>> {
    let mut st = conn.prepare_cached(&format!(
        "SELECT {PIN_COLUMNS} FROM pins p WHERE p.session_id = ?1 ORDER BY p.id"
    ))?;
    let rows = st.query_map([session_id], pin_from_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Pins the finished turns of a store written before pins existed (run by the
/// migration to version 3, with the built-in extractor).
pub(super) fn backfill(conn: &Connection) -> Result<usize> {
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
        written += pin_turn(conn, sid, idx, &crate::pins::RuleExtractor)?;
    }
    Ok(written)
}
