//! Bulk history for benchmarks: writes a session's past turns directly, in one
//! transaction, as a runner would have left them. Not for production use.

use super::write_tx;
use crate::error::Result;
use crate::ids::SessionId;
use crate::message::{sha256_hex, ModelResponse, ResponseBlock, Usage};
use crate::store::Connection;
use rusqlite::params;

/// What each seeded turn holds.
#[derive(Debug, Clone)]
pub struct SeedShape {
    /// Turns to write.
    pub turns: i64,
    /// Size of each tool result, bytes (cycled; a 0 entry is skipped).
    pub tool_result_bytes: Vec<usize>,
    /// A completed compaction every this many turns (None: no compaction).
    pub compact_every: Option<i64>,
    /// Tool steps per turn before the final answer (at least 1).
    pub tool_steps: usize,
}

/// The size of the n-th tool result of the peer workload: 200 B to 4 KB, and
/// 50 KB every 25th.
pub fn peer_result_size(n: u64) -> usize {
    if n % 25 == 24 {
        50_000
    } else {
        [200, 800, 2_000, 4_000, 1_200, 600][(n % 6) as usize]
    }
}

/// Writes `shape.turns` completed turns (two steps each: one tool call with its
/// result, then a final answer) after the session's existing turns.
pub fn seed_history(conn: &mut Connection, session_id: SessionId, shape: &SeedShape) -> Result<()> {
    let tx = write_tx(conn)?;
    let start: i64 = tx.query_row(
        "SELECT coalesce(max(idx) + 1, 0) FROM turns WHERE session_id = ?1",
        [session_id],
        |r| r.get(0),
    )?;
    let now = crate::store::now_ms();
    for k in 0..shape.turns {
        let idx = start + k;
        let turn_id = tx.prepare_cached(concat!(
            "INSERT INTO turns (id, session_id, idx, input, status, output, lease_epoch, created_at, \
             finished_at) VALUES (",
            crate::store::next_id!("turns"),
            ", ?1, ?2, ?3, 'completed', 'done', 1, ?4, ?4) RETURNING id"
        ))?
        .query_row(params![
            session_id,
            idx,
            format!("Turn {idx}: where is order ORD-{} and can you ship to 10{:03}?", 10_000 + idx, idx % 1000),
            now
        ], |r| r.get::<_, i64>(0))?;
        let usage = Usage {
            input_tokens: Some(1_000),
            output_tokens: Some(20),
            ..Default::default()
        };
        let k = shape.tool_steps.max(1);
        for step_idx in 0..=k {
            let resp = if step_idx < k {
                ModelResponse {
                    blocks: vec![
                        ResponseBlock::Text {
                            text: "Let me check that for you.".into(),
                        },
                        ResponseBlock::ToolUse {
                            id: format!("call_{step_idx}_0"),
                            name: "lookup_order".into(),
                            input: serde_json::json!({"order_id": format!("ORD-{}", 10_000 + idx)}),
                            raw_input: None,
                        },
                    ],
                    usage,
                    ..Default::default()
                }
            } else {
                ModelResponse {
                    blocks: vec![ResponseBlock::Text {
                        text: format!(
                            "Order ORD-{} is in transit; shipping to 10{:03} costs 7.50 EUR.",
                            10_000 + idx,
                            idx % 1000
                        ),
                    }],
                    usage,
                    ..Default::default()
                }
            };
            let json = serde_json::to_string(&resp)?;
            let step_id = tx.prepare_cached(
                "INSERT INTO steps (turn_id, idx, status, messages_sha256, response, input_tokens, \
                 output_tokens, context_tokens, created_at, responded_at, completed_at) \
                 VALUES (?1, ?2, 'completed', ?3, ?4, 1000, 20, 1000, ?5, ?5, ?5) RETURNING id",
            )?
            .query_row(
                params![turn_id, step_idx as i64, sha256_hex(json.as_bytes()), json, now],
                |r| r.get::<_, i64>(0),
            )?;
            if step_idx < k {
                let sizes = &shape.tool_result_bytes;
                let n = if sizes.is_empty() {
                    peer_result_size((idx as u64) * k as u64 + step_idx as u64)
                } else {
                    sizes[(idx as usize * k + step_idx) % sizes.len()]
                };
                let result = format!("{{\"history\":\"{}\"}}", "x".repeat(n.saturating_sub(14)));
                tx.prepare_cached(
                    "INSERT INTO tool_invocations (step_id, position, tool_call_id, tool_name, arguments, \
                     effect, idempotency_key, status, result, created_at, completed_at) \
                     VALUES (?1, 0, ?2, 'lookup_order', '{}', 'transactional', ?3, 'completed', ?4, ?5, ?5)",
                )?
                .execute(params![step_id, format!("call_{step_idx}_0"), format!("seed-{step_id}"), result, now])?;
            }
        }
        if let Some(every) = shape.compact_every {
            if every > 0 && (idx + 1) % every == 0 {
                let summary = format!(
                    "## Figures and ids\nORD-{}, 7.50\n## User facts\n{}",
                    10_000 + idx,
                    "- a fact\n".repeat(60)
                );
                tx.execute(
                    concat!(
                        "INSERT INTO compactions (id, session_id, up_to_turn_index, up_to_turn_id, status, \
                         summary, summary_sha256, trigger, attempts, tokens_before, tokens_after, \
                         summary_calls, created_at, completed_at) VALUES (",
                        crate::store::next_id!("compactions"),
                        ", ?1, ?2, ?3, 'completed', ?4, ?5, 'auto', 1, 5000, 200, 1, ?6, ?6)"
                    ),
                    params![session_id, idx, turn_id, summary, sha256_hex(summary.as_bytes()), now],
                )?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Deletes a session's turns from `from_idx` on (with their steps, invocations
/// and compactions). Benchmarks only: lets a measured turn run at a fixed history
/// length. Abridge itself never deletes history.
pub fn truncate_from(conn: &mut Connection, session_id: SessionId, from_idx: i64) -> Result<()> {
    lifting_delete_guards(conn, |tx| {
        tx.execute(
            "DELETE FROM compactions WHERE session_id = ?1 AND up_to_turn_index >= ?2",
            params![session_id, from_idx],
        )?;
        tx.execute(
            "DELETE FROM tool_invocations WHERE step_id IN (SELECT s.id FROM steps s JOIN turns t \
             ON s.turn_id = t.id WHERE t.session_id = ?1 AND t.idx >= ?2)",
            params![session_id, from_idx],
        )?;
        tx.execute(
            "DELETE FROM steps WHERE turn_id IN (SELECT id FROM turns WHERE session_id = ?1 AND idx >= ?2)",
            params![session_id, from_idx],
        )?;
        tx.execute(
            "DELETE FROM turns WHERE session_id = ?1 AND idx >= ?2",
            params![session_id, from_idx],
        )?;
        Ok(())
    })
}

/// Deletes every compaction of the store (no step may have read one).
/// Benchmarks only: lets a measured compaction be claimed afresh.
pub fn clear_compactions(conn: &mut Connection) -> Result<()> {
    lifting_delete_guards(conn, |tx| {
        tx.execute("DELETE FROM compactions", [])?;
        Ok(())
    })
}

/// Runs `f` in one write transaction with the schema's append-only delete
/// guards (the `*_never_deleted` triggers) lifted, and puts them back as
/// they were before it commits.
fn lifting_delete_guards(
    conn: &mut Connection,
    f: impl FnOnce(&crate::store::Transaction<'_>) -> Result<()>,
) -> Result<()> {
    let tx = write_tx(conn)?;
    let guards: Vec<(String, String)> = {
        let mut st = tx.prepare(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' \
             AND name LIKE '%never_deleted' ORDER BY name",
        )?;
        let v = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        v.collect::<rusqlite::Result<_>>()?
    };
    for (name, _) in &guards {
        tx.execute_batch(&format!("DROP TRIGGER {name}"))?;
    }
    f(&tx)?;
    for (_, sql) in &guards {
        tx.execute_batch(sql)?;
    }
    tx.commit()?;
    Ok(())
}
