//! Whole-database checks of the guarantees G1-G8.
//!
//! Each check reads the store and lists its violations; [`verify`] runs them all.
//! Used by `abridge verify`, by the chaos harness at the end of every run, and by
//! the tests. A host that keeps its own record of tool effects (rows its
//! transactional tools write, an outside service's log) adds its checks to G5
//! with [`verify_with`] and an [`EffectCheck`].

use crate::error::Result;
use crate::ids::TurnId;
use crate::message::sha256_hex;
use crate::replay::rebuild_step;
use crate::store::Connection;
use crate::store::{self, CompactionStatus};
use serde::Serialize;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Name, prefixed with the guarantee it checks.
    pub name: String,
    /// True when no violation was found.
    pub ok: bool,
    /// How many things were checked.
    pub checked: i64,
    /// What was wrong, one line each.
    pub violations: Vec<String>,
    /// Of the things checked, how many hold as a redaction left them (a
    /// step whose messages rebuild with the marker, a summary with the
    /// marker in it), not as they were first recorded.
    pub redacted: i64,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// True when every check holds.
    pub ok: bool,
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// What is worth a look but breaks no guarantee (a session compacting
    /// in consecutive turns), one line each.
    pub notes: Vec<String>,
    /// `full`, or `incremental` (the rows since [`Report::since`]).
    pub mode: Mode,
    /// The verified point an incremental run started from.
    pub since: Option<VerifiedPoint>,
    /// Where this run leaves off: what [`record_point`] stores when every
    /// check holds, for the next incremental run.
    pub point: VerifiedPoint,
}

/// How much of the store a run checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every row.
    Full,
    /// The rows that changed since a verified point: the steps executed and
    /// the compactions completed since, with the store-wide checks that are
    /// cheap (G1, G4, G5, the history's gaps); the file's own
    /// `integrity_check` is left to a full run.
    Incremental,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Incremental => "incremental",
        }
    }
}

/// Where a verification left off, as recorded in the store's
/// `verified_points` (schema version 12): every executed step below
/// `steps_from` and every completed compaction below `compactions_from`
/// held at `at_ms`. Those rows never change but by a redaction or an
/// erasure, whose newest record ids are kept to see one that came after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VerifiedPoint {
    /// The row's id (0 for a point not recorded yet).
    pub id: i64,
    /// When (the store's clock, ms since the epoch).
    pub at_ms: i64,
    /// The smallest step id not yet checked.
    pub steps_from: i64,
    /// The smallest compaction id not yet checked.
    pub compactions_from: i64,
    /// The newest redaction record's id then (0: none).
    pub redactions: i64,
    /// The newest erasure record's id then (0: none).
    pub erasures: i64,
    /// Steps the run rebuilt.
    pub steps_checked: i64,
    /// Completed compactions the run checked.
    pub compactions_checked: i64,
}

/// How a long run reports its progress: the check's name, how many of its
/// things are done, of how many.
pub type Progress<'a> = &'a (dyn Fn(&str, u64, u64) + 'a);

/// What [`verify_opts`] runs.
#[derive(Default, Clone, Copy)]
pub struct Options<'a> {
    /// The host's effect checks, added to G5.
    pub effect_checks: &'a [&'a dyn EffectCheck],
    /// Check only what changed since this point ([`last_point`]); None:
    /// every row. A point older than a redaction or an erasure gives a full
    /// run (said in the notes).
    pub since: Option<VerifiedPoint>,
    /// Called as the step rebuilds go (every 1,000 steps and at the end).
    pub progress: Option<Progress<'a>>,
}

fn check(name: &str, checked: i64, violations: Vec<String>) -> Check {
    Check {
        name: name.into(),
        ok: violations.is_empty(),
        checked,
        violations,
        redacted: 0,
    }
}

fn redacted(mut c: Check, n: i64, notes: &mut Vec<String>, what: &str) -> Check {
    if n > 0 {
        notes.push(format!(
            "{}: {n} {what} as a redaction left them (the recorded hash is of the text before)",
            c.name
        ));
    }
    c.redacted = n;
    c
}

/// A host's check of its own tool effects, run as part of "G5 effects once".
///
/// ```
/// use abridge::verify::EffectCheck;
/// use abridge::store::Connection;
///
/// /// Every order my `place_order` tool wrote, once per idempotency key.
/// struct OrdersOnce;
///
/// impl EffectCheck for OrdersOnce {
///     fn check(&self, conn: &Connection) -> abridge::Result<(i64, Vec<String>)> {
///         let n: i64 = conn.query_row("SELECT count(*) FROM orders", [], |r| r.get(0))?;
///         let mut st = conn.prepare(
///             "SELECT key, count(*) FROM orders GROUP BY key HAVING count(*) > 1",
///         )?;
///         let dups = st
///             .query_map([], |r| Ok(format!("order {} placed {} times", r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
///             .collect::<Result<Vec<_>, _>>()?;
///         Ok((n, dups))
///     }
/// }
/// ```
pub trait EffectCheck {
    /// Reads the host's effects (read-only) and returns how many were checked
    /// and one line per violation.
    fn check(&self, conn: &Connection) -> Result<(i64, Vec<String>)>;
}

/// Runs every check of the store's own rows. Read-only.
pub fn verify(conn: &Connection) -> Result<Report> {
    verify_with(conn, &[])
}

/// [`verify`], with the host's effect checks added to G5. Read-only.
pub fn verify_with(conn: &Connection, effect_checks: &[&dyn EffectCheck]) -> Result<Report> {
    verify_opts(
        conn,
        &Options {
            effect_checks,
            ..Options::default()
        },
    )
}

/// The newest verified point recorded in the store (None: none yet, or a
/// store older than schema version 12).
pub fn last_point(conn: &Connection) -> Result<Option<VerifiedPoint>> {
    if !conn.has_table("verified_points")? {
        return Ok(None);
    }
    let mut st = conn.prepare(
        "SELECT id, at, steps_from, compactions_from, redactions, erasures, steps_checked, \
         compactions_checked FROM verified_points ORDER BY id DESC LIMIT 1",
    )?;
    let mut rows = st.query_map([], |r| {
        Ok(VerifiedPoint {
            id: r.get(0)?,
            at_ms: r.get(1)?,
            steps_from: r.get(2)?,
            compactions_from: r.get(3)?,
            redactions: r.get(4)?,
            erasures: r.get(5)?,
            steps_checked: r.get(6)?,
            compactions_checked: r.get(7)?,
        })
    })?;
    Ok(rows.next().transpose()?)
}

/// Records where `report` left off, for the next incremental run: only a
/// report whose every check holds ([`crate::Error::Config`] otherwise).
/// A write; returns the new point.
pub fn record_point(conn: &Connection, report: &Report) -> Result<VerifiedPoint> {
    if !report.ok {
        return Err(crate::Error::Config(
            "a verified point is recorded only when every check holds".into(),
        ));
    }
    let p = report.point;
    let id: i64 = conn.query_row(
        "INSERT INTO verified_points (at, mode, steps_from, compactions_from, redactions, \
         erasures, steps_checked, compactions_checked) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
        rusqlite::params![
            p.at_ms,
            report.mode.as_str(),
            p.steps_from,
            p.compactions_from,
            p.redactions,
            p.erasures,
            p.steps_checked,
            p.compactions_checked
        ],
        |r| r.get(0),
    )?;
    Ok(VerifiedPoint { id, ..p })
}

/// Where a run that starts now leaves off: read before any check, so a row
/// written while the checks run is at or after it (checked next time).
fn point_now(conn: &Connection) -> Result<VerifiedPoint> {
    let one = |sql: &str| -> Result<i64> { conn.query_row(sql, [], |r| r.get(0)) };
    // A step can still be executed while it is running without a hash; a
    // compaction can still complete while it is pending or failed (a failed
    // row is re-armed): the first such row is where the next run starts.
    let steps_from = one(
        "SELECT coalesce((SELECT min(id) FROM steps WHERE status = 'running' \
         AND messages_sha256 IS NULL), (SELECT max(id) FROM steps) + 1, 0)",
    )?;
    let compactions_from = one(
        "SELECT coalesce((SELECT min(id) FROM compactions WHERE status <> 'completed'), \
         (SELECT max(id) FROM compactions) + 1, 0)",
    )?;
    let newest = |table: &str| -> Result<i64> {
        if !conn.has_table(table)? {
            return Ok(0);
        }
        one(&format!("SELECT coalesce(max(id), 0) FROM {table}"))
    };
    Ok(VerifiedPoint {
        id: 0,
        at_ms: conn.now_ms(),
        steps_from,
        compactions_from,
        redactions: newest("redactions")?,
        erasures: newest("erasures")?,
        steps_checked: 0,
        compactions_checked: 0,
    })
}

/// Runs the checks `opts` asks for: every row, or what changed since a
/// verified point. Read-only.
pub fn verify_opts(conn: &Connection, opts: &Options<'_>) -> Result<Report> {
    let mut notes = Vec::new();
    let mut point = point_now(conn)?;
    let since = match opts.since {
        Some(p) if p.redactions != point.redactions || p.erasures != point.erasures => {
            notes.push(format!(
                "full run: a redaction or an erasure came after the verified point {} \
                 (rows it checked may have changed)",
                p.id
            ));
            None
        }
        other => other,
    };
    let mode = match since {
        Some(_) => Mode::Incremental,
        None => Mode::Full,
    };
    let (steps_from, compactions_from) =
        since.map_or((0, 0), |p| (p.steps_from, p.compactions_from));
    let all_compactions = store::all_compactions(conn)?;
    let compactions: Vec<_> = all_compactions
        .iter()
        .filter(|c| c.id.0 >= compactions_from)
        .cloned()
        .collect();
    let steps: Vec<_> = store::executed_step_ids(conn, None)?
        .into_iter()
        .filter(|s| s.0 >= steps_from)
        .collect();
    let summaries = summaries(conn, &compactions)?;
    let mut checks = vec![one_row_per_boundary(conn, &all_compactions)?];
    checks.push(redacted(
        summaries.g2,
        summaries.redacted,
        &mut notes,
        "summaries hold",
    ));
    let (g3, steps_redacted) = replays(conn, &steps, opts.progress)?;
    point.steps_checked = g3.checked;
    point.compactions_checked = summaries.g7.checked;
    checks.push(redacted(g3, steps_redacted, &mut notes, "steps rebuild"));
    checks.push(no_draft_read(conn, steps.len() as i64)?);
    checks.push(effects_once(conn, opts.effect_checks)?);
    checks.push(decisions_once(conn)?);
    checks.extend(nothing_lost(conn, mode)?);
    if mode == Mode::Incremental {
        notes.push(
            "incremental run: G6 integrity_check (the whole file) is left to a full run".into(),
        );
    }
    checks.push(summaries.g7);
    let (pairs, g8, pins_redacted) = pins_carried(conn, &compactions)?;
    checks.push(redacted(
        check("G8 no pinned fact lost", pairs, g8),
        pins_redacted,
        &mut notes,
        "pinned facts are carried",
    ));

    notes.extend(compacting_often(&all_compactions));
    notes.extend(pins_filled_their_share(&all_compactions));
    notes.extend(stalled_turns(conn, conn.now_ms())?);
    notes.extend(parked_turns(conn, conn.now_ms())?);
    Ok(Report {
        ok: checks.iter().all(|c| c.ok),
        checks,
        notes,
        mode,
        since,
        point,
    })
}

/// G5 for parked calls: every decision was taken once and recorded whole
/// (a decided call has its time, a pending one none; the schema refuses a
/// second decision); an approved call ran under the effect mode it was
/// approved with and the arguments approved, in its one invocation row
/// (UNIQUE per call: it runs at most once as its mode allows); a call that
/// was not approved (rejected, delivered, abandoned, pending) had no effect
/// of its own: its invocation, if any, is the recorded answer.
fn decisions_once(conn: &Connection) -> Result<Check> {
    const NAME: &str = "G5 a decision is taken once and an approved call runs at most once";
    if !conn.has_table("approvals")? {
        return Ok(check(NAME, 0, Vec::new()));
    }
    let mut st = conn.prepare(
        "SELECT a.id, a.tool_name, a.status, a.effect, a.decided_at, a.input, a.arguments, \
         i.effect, i.arguments, i.status \
         FROM approvals a LEFT JOIN tool_invocations i \
         ON i.step_id = a.step_id AND i.tool_call_id = a.tool_call_id ORDER BY a.id",
    )?;
    #[allow(clippy::type_complexity)]
    let rows: Vec<(
        i64,
        String,
        String,
        String,
        Option<i64>,
        Option<String>,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
    )> = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut violations = Vec::new();
    for (id, tool, status, effect, decided_at, input, args, i_effect, i_args, i_status) in &rows {
        let call = format!("call {id} ({tool})");
        let pending = status == "pending";
        if pending == decided_at.is_some() {
            violations.push(format!("{call}: {status} but decided_at is {decided_at:?}"));
        }
        match (status.as_str(), i_effect.as_deref()) {
            ("pending", Some(_)) => violations.push(format!("{call}: ran while pending")),
            ("approved", Some(e)) => {
                if e != effect {
                    violations.push(format!("{call}: approved as {effect} but ran as {e}"));
                }
                let want = input.as_deref().unwrap_or(args);
                if i_args.as_deref() != Some(want) {
                    violations.push(format!("{call}: ran with other arguments than approved"));
                }
            }
            ("rejected" | "delivered" | "abandoned", Some(e)) if e != "none" => {
                violations.push(format!("{call}: {status}, yet the tool ran ({e})"))
            }
            _ => {}
        }
        if i_status.as_deref() == Some("started") && status != "approved" {
            violations.push(format!("{call}: {status} with a started invocation"));
        }
    }
    Ok(check(NAME, rows.len() as i64, violations))
}

/// The turns parked on calls that wait for a decision or a result, and for
/// how long the oldest has waited.
fn parked_turns(conn: &Connection, now: i64) -> Result<Vec<String>> {
    if !conn.has_table("approvals")? {
        return Ok(Vec::new());
    }
    let mut q = conn.prepare(
        "SELECT s.external_id, t.idx, count(*), min(a.created_at) \
         FROM approvals a JOIN turns t ON t.id = a.turn_id JOIN sessions s ON s.id = t.session_id \
         WHERE a.status = 'pending' GROUP BY s.external_id, t.idx ORDER BY s.external_id, t.idx",
    )?;
    let rows = q
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(rows
        .into_iter()
        .map(|(session, idx, calls, since)| {
            format!(
                "turn {idx} of session {session} is parked: {calls} tool call(s) wait for a \
                 decision or a result (for {}; abridge pending)",
                crate::text::human_duration_ms(now - since)
            )
        })
        .collect())
}

/// G1: no (session, boundary) holds two compaction rows.
fn one_row_per_boundary(
    conn: &Connection,
    compactions: &[crate::store::CompactionRow],
) -> Result<Check> {
    let dups = store::duplicate_boundaries(conn)?;
    Ok(check(
        "G1 one row per boundary",
        compactions.len() as i64,
        dups.iter()
            .map(|d| {
                format!(
                    "session {} boundary {} has {} compaction rows",
                    d.session_id, d.boundary, d.rows
                )
            })
            .collect(),
    ))
}

/// What the completed summaries say of G2 (unchanged since completion) and
/// G7 (smaller than what they folded), and how many a redaction changed.
struct Summaries {
    g2: Check,
    g7: Check,
    redacted: i64,
}

fn summaries(conn: &Connection, compactions: &[crate::store::CompactionRow]) -> Result<Summaries> {
    let (mut g2, mut g7) = (Vec::new(), Vec::new());
    let (mut completed, mut summaries_redacted) = (0, 0);
    for c in compactions
        .iter()
        .filter(|c| c.status == CompactionStatus::Completed)
    {
        completed += 1;
        let summary = c.summary.as_deref().unwrap_or("");
        if summary.trim().is_empty() {
            g2.push(format!(
                "compaction {} is completed with an empty summary",
                c.id
            ));
        }
        let sha = sha256_hex(summary.as_bytes());
        match &c.summary_sha256 {
            Some(h) if *h == sha => {}
            Some(_)
                if store::redaction_mark(conn, "compactions", c.id.0)?
                    .is_some_and(|m| m.sha256 == sha) =>
            {
                summaries_redacted += 1
            }
            Some(_) => g2.push(format!(
                "compaction {} summary changed after completion (hash differs)",
                c.id
            )),
            None => g2.push(format!("compaction {} has no recorded summary hash", c.id)),
        }
        match (c.tokens_before, c.tokens_after) {
            (Some(b), Some(a)) if a < b && a > 0 => {}
            (b, a) => g7.push(format!(
                "compaction {} did not shrink: tokens_before {:?}, tokens_after {:?}",
                c.id, b, a
            )),
        }
    }
    Ok(Summaries {
        g2: check("G2 completed summaries never change", completed, g2),
        g7: check("G7 compaction shrinks", completed, g7),
        redacted: summaries_redacted,
    })
}

/// G3: every executed step rebuilds to its recorded hash (or to the one a
/// redaction recorded: counted apart).
fn replays(
    conn: &Connection,
    steps: &[crate::ids::StepId],
    progress: Option<Progress<'_>>,
) -> Result<(Check, i64)> {
    const NAME: &str = "G3 byte-identical replay";
    let (mut g3, mut steps_redacted) = (Vec::new(), 0);
    let total = steps.len() as u64;
    for (n, id) in steps.iter().enumerate() {
        if let Some(p) = progress {
            if n % 1_000 == 0 && n > 0 {
                p(NAME, n as u64, total);
            }
        }
        match rebuild_step(conn, *id) {
            Ok(r) if r.holds() => steps_redacted += i64::from(r.redaction.is_some()),
            Ok(r) => g3.push(format!(
                "step {id}: rebuilt {} but recorded {}{}",
                &r.sha256[..16],
                &r.recorded[..r.recorded.len().min(16)],
                r.redaction.as_ref().map_or(String::new(), |m| format!(
                    " (and redaction {} recorded {})",
                    m.redaction_id,
                    &m.sha256[..m.sha256.len().min(16)]
                ))
            )),
            Err(e) => g3.push(format!("step {id}: {e}")),
        }
    }
    if let Some(p) = progress {
        p(NAME, total, total);
    }
    Ok((check(NAME, steps.len() as i64, g3), steps_redacted))
}

/// G4: no executed step read a compaction that was not completed.
fn no_draft_read(conn: &Connection, steps: i64) -> Result<Check> {
    let drafts = store::steps_reading_non_completed(conn)?;
    Ok(check(
        "G4 no step read a draft",
        steps,
        drafts
            .iter()
            .map(|d| {
                format!(
                    "step {} read compaction {}, which is {}",
                    d.step_id, d.compaction_id, d.status
                )
            })
            .collect(),
    ))
}

/// G5: every invocation of a completed step finished, none recorded twice,
/// and the host's own effect checks.
fn effects_once(conn: &Connection, effect_checks: &[&dyn EffectCheck]) -> Result<Check> {
    let anomalies = store::invocation_anomalies(conn)?;
    let invocations = store::invocation_count(conn)?;
    let mut g5: Vec<String> = anomalies
        .unfinished
        .iter()
        .map(|i| format!("invocation {i} of a completed step never finished"))
        .chain(
            anomalies
                .duplicated
                .iter()
                .map(|(s, c)| format!("step {s} recorded tool call {c} more than once")),
        )
        .collect();
    let mut effects = 0;
    for c in effect_checks {
        let (checked, violations) = c.check(conn)?;
        effects += checked;
        g5.extend(violations);
    }
    Ok(check("G5 effects once", invocations + effects, g5))
}

/// G6's four checks: the database's own integrity, a history with no gaps
/// or orphans, running turns that can resume, deletions that left nothing.
fn nothing_lost(conn: &Connection, mode: Mode) -> Result<Vec<Check>> {
    let (files, g6) = match mode {
        Mode::Full => {
            let integrity = store::integrity_check(conn)?;
            (1, integrity.into_iter().filter(|l| l != "ok").collect())
        }
        Mode::Incremental => (0, Vec::new()),
    };
    let (rows, gaps) = history_gaps(conn)?;
    let (running, stuck) = unreadable_running_turns(conn)?;
    let (deleted, left) = store::deletions_left_behind(conn)?;
    Ok(vec![
        check("G6 integrity_check", files, g6),
        check("G6 history has no gaps or orphans", rows, gaps),
        check("G6 running turns can resume", running, stuck),
        check("G6 deleted sessions left nothing behind", deleted, left),
    ])
}

/// G8: every live pin stated at or before a completed compaction's boundary
/// is in its summary, verbatim. Compactions completed before pins existed
/// (`pins_live` NULL: a store written by an older build) are not checked.
/// A pin missing from a summary when either was redacted counts as
/// redacted (the pattern may have taken part of one and not the other).
fn pins_carried(
    conn: &Connection,
    compactions: &[store::CompactionRow],
) -> Result<(i64, Vec<String>, i64)> {
    let (mut checked, mut redacted) = (0, 0);
    let mut lost = Vec::new();
    for c in compactions
        .iter()
        .filter(|c| c.status == CompactionStatus::Completed && c.pins_live.is_some())
    {
        let summary = c.summary.as_deref().unwrap_or("");
        let window = c
            .pins_window
            .map_or(crate::pins::DEFAULT_PINS_WINDOW, |w| w.max(0) as usize);
        for pin in store::live_pins(conn, c.session_id, c.up_to_turn_index, window)? {
            checked += 1;
            let carried = pin.carried_by(summary);
            if !carried
                && (store::redaction_mark(conn, "compactions", c.id.0)?.is_some()
                    || store::row_redacted(conn, "pins", pin.id)?)
            {
                redacted += 1;
            } else if !carried {
                lost.push(format!(
                    "compaction {} (session {}, up to turn {}) lost pin {} ({}: {:?}, turn {})",
                    c.id,
                    c.session_id,
                    c.up_to_turn_index,
                    pin.id,
                    pin.label(),
                    crate::text::truncate_chars(&pin.value, 80),
                    pin.turn_index
                ));
            }
        }
    }
    Ok((checked, lost, redacted))
}

/// Turns left `running` that nothing is working on: no lease, or one expired
/// before `now`. Each makes progress only when a host resumes it
/// (`Runner::recoverable_turns` then `resume_turn`, or the same demo command
/// again); until then its session refuses new turns. Named with the last
/// error its session's pending compaction recorded, when there is one (a
/// summariser failing on every attempt).
fn stalled_turns(conn: &Connection, now: i64) -> Result<Vec<String>> {
    // A parked turn waits for a decision, not for a host (`parked_turns`).
    let not_parked = match conn.has_table("approvals")? {
        true => {
            "AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.turn_id = t.id \
                 AND a.status = 'pending')"
        }
        false => "",
    };
    let mut q = conn.prepare(&format!(
        "SELECT s.external_id, t.idx, coalesce(t.lease_expires_at, 0), \
                (SELECT c.error FROM compactions c WHERE c.session_id = t.session_id \
                  AND c.status = 'pending' AND c.error IS NOT NULL ORDER BY c.id DESC LIMIT 1) \
         FROM turns t JOIN sessions s ON s.id = t.session_id \
         WHERE t.status = 'running' AND coalesce(t.lease_expires_at, 0) < ?1 {} \
         ORDER BY s.external_id, t.idx",
        not_parked
    ))?;
    let rows = q
        .query_map([now], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(rows
        .into_iter()
        .map(|(session, idx, expired, error)| {
            let since = match expired {
                0 => String::new(),
                ms => format!(" for {}", crate::text::human_duration_ms(now - ms)),
            };
            let why = error
                .map(|e| {
                    format!(
                        "; its pending compaction last failed: {}",
                        crate::text::truncate_chars(&e, 200)
                    )
                })
                .unwrap_or_default();
            format!(
                "turn {idx} of session {session} is running with no live holder{since}: it makes \
                 no progress until a host resumes it, and the session refuses new turns{why}"
            )
        })
        .collect())
}

/// Sessions whose automatic compactions came in consecutive turns: each
/// summary left no room under the threshold. A pair whose first summary was
/// made in the background is not counted: it was read a turn or more after
/// its boundary, with the turns that ran while it was made, so the room was
/// taken by those turns, not left out by the summary.
fn compacting_often(compactions: &[store::CompactionRow]) -> Vec<String> {
    let mut by_session: std::collections::BTreeMap<i64, Vec<&store::CompactionRow>> =
        Default::default();
    for c in compactions
        .iter()
        .filter(|c| c.status == CompactionStatus::Completed)
    {
        by_session.entry(c.session_id.0).or_default().push(c);
    }
    let mut notes = Vec::new();
    for (sid, rows) in by_session {
        let close = rows
            .windows(2)
            .filter(|w| {
                w[1].trigger == "auto"
                    && !w[0].background
                    && w[1].up_to_turn_index - w[0].up_to_turn_index <= 1
            })
            .count();
        if close > 0 {
            notes.push(format!(
                "session {sid}: {close} of {} compactions came one turn after the previous one \
                 (the summaries leave no room: see docs/fidelity.md, \"No thrash\")",
                rows.len()
            ));
        }
    }
    notes
}

/// Compactions whose pins live for good filled the pinned facts' share:
/// every fact mentioned in passing folded (their recorded window is 0 while
/// the guard was on; [`crate::EventKind::PinsOverShare`] said so then).
fn pins_filled_their_share(compactions: &[store::CompactionRow]) -> Vec<String> {
    let mut by_session: std::collections::BTreeMap<i64, (usize, i64)> = Default::default();
    for c in compactions.iter().filter(|c| {
        c.status == CompactionStatus::Completed && c.pins_window == Some(0) && c.pins_live.is_some()
    }) {
        let e = by_session.entry(c.session_id.0).or_insert((0, 0));
        e.0 += 1;
        e.1 = c.up_to_turn_index;
    }
    by_session
        .into_iter()
        .map(|(sid, (n, last))| {
            format!(
                "session {sid}: {n} compaction(s) (the last at turn {last}) carried no fact \
                 mentioned in passing (window 0: pins_window, or its stated facts, rules and \
                 host pins alone filled the pinned facts' share; raise the threshold or \
                 pins_max_share: see docs/fidelity.md, \"A budget that holds\")"
            )
        })
        .collect()
}

/// Rows missing from the history: a gap in a session's turn numbering or a
/// turn's step numbering, and rows pointing at rows that are not there.
fn history_gaps(conn: &Connection) -> Result<(i64, Vec<String>)> {
    let rows: i64 = conn.query_row(
        "SELECT (SELECT count(*) FROM turns) + (SELECT count(*) FROM steps) \
              + (SELECT count(*) FROM tool_invocations) + (SELECT count(*) FROM compactions)",
        [],
        |r| r.get(0),
    )?;
    let queries = [
        (
            // A fork's own turns are numbered from after its fork point.
            "SELECT 'session ' || s.external_id || ' has ' || count(t.id) || ' turns numbered ' \
             || min(t.idx) || ' to ' || max(t.idx) FROM turns t JOIN sessions s ON s.id = t.session_id \
             GROUP BY t.session_id, s.external_id, s.parent_kind, s.parent_turn \
             HAVING min(t.idx) <> (CASE WHEN s.parent_kind = 'fork' THEN s.parent_turn + 1 ELSE 0 END) \
             OR count(t.id) <> max(t.idx) + 1 - min(t.idx)",
        ),
        (
            "SELECT 'turn ' || turn_id || ' has ' || count(*) || ' steps numbered up to ' || max(idx) \
             FROM steps GROUP BY turn_id HAVING count(*) <> max(idx) + 1",
        ),
        (
            "SELECT 'turn ' || id || ' belongs to missing session ' || session_id FROM turns \
             WHERE session_id NOT IN (SELECT id FROM sessions)",
        ),
        (
            "SELECT 'step ' || id || ' belongs to missing turn ' || turn_id FROM steps \
             WHERE turn_id NOT IN (SELECT id FROM turns)",
        ),
        (
            "SELECT 'step ' || id || ' read missing compaction ' || compaction_id FROM steps \
             WHERE compaction_id IS NOT NULL AND compaction_id NOT IN (SELECT id FROM compactions)",
        ),
        (
            "SELECT 'tool invocation ' || id || ' belongs to missing step ' || step_id \
             FROM tool_invocations WHERE step_id NOT IN (SELECT id FROM steps)",
        ),
        (
            "SELECT 'compaction ' || id || ' covers missing turn ' || up_to_turn_id FROM compactions \
             WHERE up_to_turn_id NOT IN (SELECT id FROM turns)",
        ),
        // What a fork reads is there: its ancestors, every turn up to its
        // fork point (one range each, together 0..=fork point), the fork
        // point completed, and its base a completed compaction at or before
        // it.
        (
            "SELECT 'session ' || external_id || ' names missing parent ' || parent_id FROM sessions \
             WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT id FROM sessions)",
        ),
        (
            "SELECT 'fork ' || s.external_id || ' reads missing session ' || l.owner_id \
             FROM session_lineage l JOIN sessions s ON s.id = l.session_id \
             WHERE l.owner_id NOT IN (SELECT id FROM sessions)",
        ),
        (
            "SELECT 'fork ' || s.external_id || ' reads ' \
             || coalesce((SELECT sum(l.upto_idx - l.after_idx) FROM session_lineage l \
                          WHERE l.session_id = s.id), 0) \
             || ' turns of its ancestors, not the ' || (s.parent_turn + 1) || ' up to its fork point' \
             FROM sessions s WHERE s.parent_kind = 'fork' \
             AND coalesce((SELECT sum(l.upto_idx - l.after_idx) FROM session_lineage l \
                           WHERE l.session_id = s.id), 0) <> s.parent_turn + 1",
        ),
        (
            "SELECT 'fork ' || s.external_id || ' has no completed turn ' || s.parent_turn \
             || ' to fork from' FROM sessions s WHERE s.parent_kind = 'fork' AND NOT EXISTS \
             (SELECT 1 FROM session_lineage l JOIN turns t ON t.session_id = l.owner_id \
              AND t.idx = s.parent_turn AND t.idx > l.after_idx AND t.idx <= l.upto_idx \
              WHERE l.session_id = s.id AND t.status = 'completed')",
        ),
        (
            "SELECT 'fork ' || s.external_id || ' reads compaction ' || s.base_compaction_id \
             || ', not a completed one of its ancestors at or before its fork point' \
             FROM sessions s WHERE s.base_compaction_id IS NOT NULL AND NOT EXISTS \
             (SELECT 1 FROM compactions c WHERE c.id = s.base_compaction_id \
              AND c.status = 'completed' AND c.up_to_turn_index <= s.parent_turn \
              AND (c.session_id = s.parent_id OR c.session_id IN \
                   (SELECT owner_id FROM session_lineage WHERE session_id = s.id)))",
        ),
    ];
    let mut found = Vec::new();
    for (q,) in queries {
        let mut st = conn.prepare(q)?;
        let lines = st.query_map([], |r| r.get::<_, String>(0))?;
        for l in lines {
            found.push(l?);
        }
    }
    Ok((rows, found))
}

/// Running turns whose rows do not read back (a stored response that does not
/// decode, a context that cannot be built): no runner could resume them.
fn unreadable_running_turns(conn: &Connection) -> Result<(i64, Vec<String>)> {
    let mut st = conn.prepare("SELECT id FROM turns WHERE status = 'running' ORDER BY id")?;
    let ids: Vec<TurnId> = st
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut stuck = Vec::new();
    for id in &ids {
        let readable = (|| -> Result<()> {
            let turn = store::get_turn(conn, *id)?;
            let mut next = 0;
            for step in store::list_steps(conn, *id)? {
                if let Some(r) = &step.response {
                    serde_json::from_str::<crate::message::ModelResponse>(r)?;
                }
                next = step.idx + 1;
            }
            crate::replay::build_at(conn, turn.session_id, turn.idx, next)?;
            Ok(())
        })();
        if let Err(e) = readable {
            stuck.push(format!(
                "turn {id} is running but its rows cannot be read back: {e}"
            ));
        }
    }
    Ok((ids.len() as i64, stuck))
}
