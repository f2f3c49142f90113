//! The demo's and the chaos harness's own tables: the effects their tools apply.
//!
//! These are host tables, not abridge's: a transactional tool writes to
//! `demo_effects` inside the invocation's transaction; the idempotent and
//! at-most-once tools write to `demo_external` as an outside service would
//! (their own connection, their own transaction). No unique constraints: a
//! repeated effect stays visible, which is what `verify` and the chaos harness
//! look for.

use abridge::error::Result;
use abridge::store::Connection;
use rusqlite::params;

/// Creates the demo tables if missing (IMMEDIATE: several processes may open
/// the same new file at once).
pub fn create_demo_tables(conn: &mut Connection) -> Result<()> {
    let tx = abridge::testing::write_tx(conn)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS demo_effects (
             id INTEGER PRIMARY KEY,
             idempotency_key TEXT NOT NULL,
             tool TEXT NOT NULL,
             arguments TEXT NOT NULL
         );
         CREATE TABLE IF NOT EXISTS demo_external (
             id INTEGER PRIMARY KEY,
             idempotency_key TEXT NOT NULL,
             tool TEXT NOT NULL,
             arguments TEXT NOT NULL
         );",
    )?;
    tx.commit()?;
    Ok(())
}

/// Appends one applied effect (inside the caller's transaction).
pub fn append_effect(
    conn: &Connection,
    table: DemoTable,
    key: &str,
    tool: &str,
    args: &str,
) -> Result<()> {
    // Written as a host writes for its backend: a transactional tool's
    // statements reach PostgreSQL untranslated.
    let pg = conn.kind() == abridge::store::BackendKind::Postgres;
    let sql = match (table, pg) {
        (DemoTable::Effects, false) => {
            "INSERT INTO demo_effects (idempotency_key, tool, arguments) VALUES (?1, ?2, ?3)"
        }
        (DemoTable::Effects, true) => {
            "INSERT INTO demo_effects (idempotency_key, tool, arguments) VALUES ($1, $2, $3)"
        }
        (DemoTable::External, false) => {
            "INSERT INTO demo_external (idempotency_key, tool, arguments) VALUES (?1, ?2, ?3)"
        }
        (DemoTable::External, true) => {
            "INSERT INTO demo_external (idempotency_key, tool, arguments) VALUES ($1, $2, $3)"
        }
    };
    conn.prepare_cached(sql)?
        .execute(params![key, tool, args])?;
    Ok(())
}

/// Appends an effect in its own IMMEDIATE transaction (an outside service).
pub fn append_external(conn: &mut Connection, key: &str, tool: &str, args: &str) -> Result<()> {
    let tx = abridge::testing::write_tx(conn)?;
    append_effect(&tx, DemoTable::External, key, tool, args)?;
    tx.commit()?;
    Ok(())
}

/// Which demo table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoTable {
    /// Transactional tools' effects.
    Effects,
    /// Idempotent and at-most-once tools' effects (an outside service).
    External,
}

/// True when the demo tables exist.
pub fn has_demo_tables(conn: &Connection) -> Result<bool> {
    conn.has_table("demo_effects")
}

/// Effects per (table, key) applied more than once: (key, tool, count).
pub fn duplicate_effects(
    conn: &Connection,
    table: DemoTable,
) -> Result<Vec<(String, String, i64)>> {
    let sql = match table {
        DemoTable::Effects => {
            "SELECT idempotency_key, min(tool), count(*) FROM demo_effects GROUP BY idempotency_key HAVING count(*) > 1"
        }
        DemoTable::External => {
            "SELECT idempotency_key, min(tool), count(*) FROM demo_external GROUP BY idempotency_key \
             HAVING count(DISTINCT arguments) > 1 OR (min(tool) = 'charge_card' AND count(*) > 1)"
        }
    };
    let mut st = conn.prepare(sql)?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Number of rows in a demo table.
pub fn count_effects(conn: &Connection, table: DemoTable) -> Result<i64> {
    let sql = match table {
        DemoTable::Effects => "SELECT count(*) FROM demo_effects",
        DemoTable::External => "SELECT count(*) FROM demo_external",
    };
    conn.query_row(sql, [], |r| r.get(0))
}

/// Every (call, tool, arguments) of a table, ordered: for comparing two runs.
/// The call is named as a run names it, `session/turn/step/call id` (found
/// through the effect's idempotency key), not by the key itself: keys carry
/// the session's row, so two stores running the same script have different
/// ones. An effect no invocation accounts for is named by its key.
pub fn all_effects(conn: &Connection, table: DemoTable) -> Result<Vec<(String, String, String)>> {
    let (distinct, table) = match table {
        DemoTable::Effects => ("", "demo_effects"),
        DemoTable::External => ("DISTINCT", "demo_external"),
    };
    let sql = format!(
        "SELECT {distinct} coalesce(se.external_id || '/' || t.idx || '/' || s.idx || '/' \
                || i.tool_call_id, e.idempotency_key), e.tool, e.arguments \
         FROM {table} e \
         LEFT JOIN tool_invocations i ON i.idempotency_key = e.idempotency_key \
         LEFT JOIN steps s ON s.id = i.step_id \
         LEFT JOIN turns t ON t.id = s.turn_id \
         LEFT JOIN sessions se ON se.id = t.session_id \
         ORDER BY 1, 2, 3"
    );
    let mut st = conn.prepare(&sql)?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// One applied transactional effect: (turn index, `step/call id` (its key
/// when no invocation accounts for it), tool, arguments).
pub type SessionEffect = (i64, String, String, String);

/// Every row of `demo_effects`, grouped by the external id of the session
/// whose invocation applied it (found through its idempotency key), each
/// group ordered. An effect no invocation accounts for is grouped under `""`.
/// A duplicated effect shows as two equal entries.
pub fn effects_by_session(
    conn: &Connection,
) -> Result<std::collections::BTreeMap<String, Vec<SessionEffect>>> {
    let mut st = conn.prepare(
        "SELECT coalesce(se.external_id, ''), coalesce(t.idx, -1), \
                coalesce(s.idx || '/' || i.tool_call_id, e.idempotency_key), e.tool,                 e.arguments          FROM demo_effects e          LEFT JOIN tool_invocations i            ON i.idempotency_key = e.idempotency_key AND i.effect = 'transactional'          LEFT JOIN steps s ON s.id = i.step_id          LEFT JOIN turns t ON t.id = s.turn_id          LEFT JOIN sessions se ON se.id = t.session_id          ORDER BY 1, 2, 3, 4, 5",
    )?;
    let mut out: std::collections::BTreeMap<String, Vec<SessionEffect>> = Default::default();
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
        ))
    })?;
    for row in rows {
        let (session, effect) = row?;
        out.entry(session).or_default().push(effect);
    }
    Ok(out)
}

/// The demo's transactional effects against their invocations, matched by
/// idempotency key: (completed transactional invocations of a demo tool with
/// no applied effect, applied effects with no completed invocation). The
/// second is a violation only in a store where no session was deleted: a
/// deleted session's effects are the host's rows and stay (its invocations
/// go with it).
pub fn transactional_effect_balance(conn: &Connection) -> Result<(i64, i64)> {
    conn.query_row(
        "SELECT (SELECT count(*) FROM tool_invocations i \
                 LEFT JOIN demo_effects e ON e.idempotency_key = i.idempotency_key \
                 WHERE i.effect = 'transactional' AND i.status = 'completed' AND e.id IS NULL \
                 AND i.tool_name IN ('lookup_order', 'check_postcode', 'quote_shipping', 'place_change')), \
                (SELECT count(*) FROM demo_effects e \
                 LEFT JOIN tool_invocations i ON i.idempotency_key = e.idempotency_key \
                 AND i.status = 'completed' WHERE i.id IS NULL)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// The demo's effects, checked as part of G5 by `abridge verify` and the
/// tests: each applied at most once per key, and every completed
/// transactional invocation of a demo tool matched by one applied effect. A
/// store without the demo's tables has nothing to check.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoEffects;
