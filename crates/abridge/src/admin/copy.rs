//! Moving a store from an SQLite file to a PostgreSQL server (`abridge
//! migrate`, [`migrate_store`]): every row of every table, with its id, in
//! one transaction on the server; then every executed step is rebuilt there
//! and checked against the hash it recorded when it ran, before the
//! transaction commits. A store that would not replay byte for byte on the
//! server is not moved.

use crate::error::{Error, Result};
use crate::store::Connection;
use crate::store::{Key, Location, Store, StoreOptions};
use rusqlite::types::Value;
use serde::Serialize;

/// What [`migrate_store`] moved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Migrated {
    /// Rows copied, by table, in the order copied.
    pub rows: Vec<(String, i64)>,
    /// Executed steps rebuilt on the target, each to the hash it recorded
    /// (or, for a step a redaction changed, to the hash recorded then).
    pub steps_rebuilt: i64,
    /// The target, without its password.
    pub target: String,
}

/// abridge's tables in an order that satisfies their references (a pin's
/// `superseded_by` names a later pin: set after every pin is in).
const TABLES: &[(&str, &str)] = &[
    ("sessions", "id"),
    ("turns", "id"),
    ("compactions", "id"),
    ("steps", "id"),
    ("tool_invocations", "id"),
    ("pins", "id"),
    ("erasures", "id"),
    ("redactions", "id"),
    ("redacted_rows", "redaction_id, tbl, row_id"),
    ("approvals", "id"),
    ("approval_grants", "session_id, tool_name"),
];

/// The host tables of the demo workload, moved with the store when present
/// (what `verify` checks the demo's effects against).
const HOST_TABLES: &[&str] = &["demo_effects", "demo_external"];

/// Copies the SQLite store at `from` (encrypted with `from_key`, if any)
/// into the PostgreSQL store at `to` (a `postgres://` URL, see
/// [`Store::open_url`]), which must hold no session yet. Every row keeps its
/// id. Before committing, every executed step is rebuilt on the target and
/// must reproduce its recorded hash (G3); otherwise nothing is written and
/// the error names the step. The file is only read.
///
/// Errors: the source's ([`Error::NotFound`], [`Error::SchemaTooOld`]: run
/// `abridge upgrade` first), the target's ([`Error::Unreachable`], …),
/// [`Error::Config`] when the target already holds sessions.
pub fn migrate_store(
    from: impl Into<Location>,
    from_key: Option<&Key>,
    to: impl Into<Location>,
) -> Result<Migrated> {
    let (from, to) = (from.into(), to.into());
    let Location::Postgres(to) = to else {
        return Err(Error::Config(format!(
            "the target must be a postgres:// URL, not {:?}",
            to.to_string()
        )));
    };
    if from.is_server() {
        return Err(Error::Config(format!(
            "the source must be an SQLite file, not {:?}",
            from.to_string()
        )));
    }
    let source = crate::store::open_read_only_keyed(&from, from_key)?;
    let target = Store::open_url(&to, StoreOptions::default().with_max_connections(1))?;
    let display = target.path().display().to_string();
    target.with_conn(|conn| {
        let tx = conn.write_tx()?;
        let present: i64 = tx.query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))?;
        if present > 0 {
            return Err(Error::Config(format!(
                "{display} already holds {present} session(s): migrate into an empty store"
            )));
        }
        source
            .in_read_tx(|src| {
                let mut out = Migrated {
                    target: display.clone(),
                    ..Migrated::default()
                };
                for (table, key) in TABLES {
                    let n = copy_table(src, &tx, table, key)?;
                    out.rows.push((table.to_string(), n));
                }
                for table in HOST_TABLES {
                    if src.has_table(table)? {
                        tx.execute_batch(&host_table_sql(table))?;
                        let n = copy_table(src, &tx, table, "id")?;
                        out.rows.push((table.to_string(), n));
                    }
                }
                link_superseded_pins(src, &tx)?;
                advance_identities(&tx)?;
                out.steps_rebuilt = check_replay(src, &tx)?;
                Ok(out)
            })
            .and_then(|out| {
                tx.commit()?;
                Ok(out)
            })
    })
}

/// The demo's host table on the target (as `create_demo_tables` makes it).
fn host_table_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, \
         idempotency_key TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT NOT NULL)"
    )
}

/// The column names of `table` in the source.
fn columns(src: &Connection, table: &str) -> Result<Vec<String>> {
    let mut st = src.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
    let v = st.query_map([], |r| r.get(0))?;
    Ok(v.collect::<rusqlite::Result<_>>()?)
}

/// Copies every row of `table`, in `key` order; pins without their
/// `superseded_by` and `superseded_at` (set by [`link_superseded_pins`]).
fn copy_table(src: &Connection, dst: &Connection, table: &str, key: &str) -> Result<i64> {
    let cols = columns(src, table)?;
    let placeholders: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
    let insert = format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        cols.join(", "),
        placeholders.join(", ")
    );
    let later = |c: &str| table == "pins" && (c == "superseded_by" || c == "superseded_at");
    let mut st = src.prepare(&format!(
        "SELECT {} FROM {table} ORDER BY {key}",
        cols.join(", ")
    ))?;
    let rows = st.query_map([], |r| {
        (0..cols.len())
            .map(|i| r.get::<_, Value>(i))
            .collect::<rusqlite::Result<Vec<Value>>>()
    })?;
    let mut ins = dst.prepare(&insert)?;
    let mut n = 0;
    for row in rows {
        let mut row = row?;
        for (i, c) in cols.iter().enumerate() {
            if later(c) {
                row[i] = Value::Null;
            }
        }
        let params: Vec<&dyn rusqlite::ToSql> =
            row.iter().map(|v| v as &dyn rusqlite::ToSql).collect();
        ins.execute(params.as_slice())?;
        n += 1;
    }
    Ok(n)
}

/// Marks the superseded pins as the source has them (the one update a pin
/// takes, which its trigger allows).
fn link_superseded_pins(src: &Connection, dst: &Connection) -> Result<()> {
    let mut st = src.prepare(
        "SELECT id, superseded_by, superseded_at FROM pins \
         WHERE superseded_by IS NOT NULL ORDER BY id",
    )?;
    let rows = st.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut up =
        dst.prepare("UPDATE pins SET superseded_by = ?2, superseded_at = ?3 WHERE id = ?1")?;
    for row in rows {
        let (id, by, at) = row?;
        up.execute([id, by, at])?;
    }
    Ok(())
}

/// Moves each identity past the ids copied, so the next row inserted
/// without an id takes a new one.
fn advance_identities(dst: &Connection) -> Result<()> {
    for (table, _) in TABLES
        .iter()
        .filter(|(t, _)| !["redacted_rows", "approval_grants"].contains(t))
    {
        dst.query_row(
            &format!(
                "SELECT setval(pg_get_serial_sequence('{table}', 'id'), \
                 coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
            ),
            [],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// Rebuilds every executed step on the target: each must give the bytes it
/// gives from the file (so what held there, its recorded hash above all,
/// holds on the server). The count, or the first step that differs.
fn check_replay(src: &Connection, dst: &Connection) -> Result<i64> {
    let mut n = 0;
    for id in crate::store::executed_step_ids(src, None)? {
        let there = crate::replay::rebuild_step(dst, id)?;
        let here = crate::replay::rebuild_step(src, id)?;
        if there.sha256 != here.sha256 {
            return Err(Error::Config(format!(
                "step {} rebuilds to sha256 {} on the target, not to {} as from the file: \
                 nothing was migrated",
                id.0, there.sha256, here.sha256
            )));
        }
        n += 1;
    }
    Ok(n)
}
