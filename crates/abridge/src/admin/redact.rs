//! Redacting a secret from a session: the second exception to append-only
//! history (deleting a session whole, `erase`, is the first).
//!
//! Every stored occurrence of a pattern in one session (its system prompt,
//! turn inputs, outputs and errors, step responses and errors, tool arguments
//! and results, summaries, focus and error texts of compactions, pinned facts)
//! is replaced by [`REDACTION_MARKER`] in one IMMEDIATE transaction behind the
//! `erasing` gate (schema version 7), with `secure_delete` on and the WAL
//! checkpointed after, so the secret's bytes are gone from the file.
//!
//! The redaction is recorded with what each changed row verifies against
//! since: an executed step whose messages now rebuild to other bytes gets the
//! hash of its redacted messages (`verify` and `replay` report it as
//! redacted, not as a G3 violation), a changed summary the hash of its
//! redacted text (G2), a changed turn input the hash of its input before (a
//! host re-submitting that input is recognised).

use crate::error::{Error, Result};
use crate::ids::{SessionId, StepId};
use crate::message::sha256_hex;
use crate::store::{session_redaction, Connection};
use crate::store::{RedactedRows, SessionRow, REDACTION_MARKER};
use rusqlite::params;
use std::collections::HashMap;

/// What to redact: a literal text or a regular expression (Rust `regex`
/// syntax), matched against each stored text (and each string inside the
/// JSON abridge stores: a response, a tool call's arguments).
#[derive(Debug, Clone)]
pub enum Pattern {
    /// Every occurrence of this text, byte for byte.
    Text(String),
    /// Every match of this expression.
    Regex(regex::Regex),
}

impl Pattern {
    /// A literal text; refused when empty.
    pub fn text(text: impl Into<String>) -> Result<Pattern> {
        let text = text.into();
        if text.is_empty() {
            return Err(Error::Config("the text to redact must not be empty".into()));
        }
        Ok(Pattern::Text(text))
    }

    /// A regular expression; refused when it does not compile or matches
    /// the empty text (it would put a marker between every two characters).
    pub fn regex(expr: &str) -> Result<Pattern> {
        let re = regex::Regex::new(expr)
            .map_err(|e| Error::Config(format!("the pattern to redact does not compile: {e}")))?;
        if re.is_match("") {
            return Err(Error::Config(format!(
                "the pattern {expr:?} matches the empty text; redact something that has a length"
            )));
        }
        Ok(Pattern::Regex(re))
    }

    fn kind(&self) -> &'static str {
        match self {
            Pattern::Text(_) => "text",
            Pattern::Regex(_) => "regex",
        }
    }

    fn source(&self) -> &str {
        match self {
            Pattern::Text(t) => t,
            Pattern::Regex(r) => r.as_str(),
        }
    }

    /// `s` with every occurrence replaced, and how many; None when none.
    /// `found`: the whole matches of a regex in the session's texts, whose
    /// forms cut by a truncation (a pinned fact's sentence, a capped block)
    /// are redacted too, as a text pattern's are.
    fn replace(&self, s: &str, found: &[String]) -> Option<(String, i64)> {
        let (out, n) = match self {
            Pattern::Text(t) => {
                // As written, and as written inside a JSON string (a tool's
                // JSON result, quoted in a summary): `"` as `\"`, and so on.
                let escaped = serde_json::to_string(t).unwrap_or_default();
                let escaped = &escaped[1..escaped.len().max(2) - 1];
                let forms: Vec<&str> = std::iter::once(t.as_str())
                    .chain((escaped != t).then_some(escaped))
                    .collect();
                replace_forms(std::borrow::Cow::Borrowed(s), &forms)
            }
            Pattern::Regex(re) => {
                let n = re.find_iter(s).count() as i64;
                let out = re.replace_all(s, regex::NoExpand(REDACTION_MARKER));
                let forms: Vec<&str> = found.iter().map(String::as_str).collect();
                let (out, cut) = replace_forms(out, &forms);
                (out, n + cut)
            }
        };
        (n > 0).then(|| (out.into_owned(), n))
    }

    /// A stored text: when it is a JSON object or array (a tool's JSON
    /// result), first inside its strings, decoded (see `replace_in_json`),
    /// then as written.
    fn replace_in_text(&self, text: &str, found: &[String]) -> Option<(String, i64)> {
        let inner = if is_json_container(text) {
            self.replace_in_json(text, found).ok().flatten()
        } else {
            None
        };
        let (text, n) = match &inner {
            Some((t, n)) => (t.as_str(), *n),
            None => (text, 0),
        };
        match self.replace(text, found) {
            Some((t, k)) => Some((t, n + k)),
            None => inner,
        }
    }

    /// JSON text with the pattern replaced inside every string (decoded, so
    /// an escaped occurrence is found, and re-encoded) and in what lies
    /// between them (a number, as a string holding the marker). The result
    /// must still be JSON: a pattern that matches the structure is refused.
    fn replace_in_json(
        &self,
        json: &str,
        found: &[String],
    ) -> std::result::Result<Option<(String, i64)>, String> {
        let b = json.as_bytes();
        let (mut out, mut last, mut i, mut n) = (String::new(), 0, 0, 0);
        let bare = |out: &mut String, seg: &str, n: &mut i64| match self.replace(seg, found) {
            Some((s, k)) => {
                out.push_str(&s.replace(REDACTION_MARKER, &format!("\"{REDACTION_MARKER}\"")));
                *n += k;
            }
            None => out.push_str(seg),
        };
        while i < b.len() {
            if b[i] != b'"' {
                i += 1;
                continue;
            }
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            let end = (i + 1).min(b.len());
            bare(&mut out, &json[last..start], &mut n);
            let literal = &json[start..end];
            // A string that is itself JSON (a tool call's arguments kept as
            // the exact text received) is redacted as JSON, so it stays JSON.
            let replaced = match serde_json::from_str::<String>(literal) {
                Ok(s) if is_json_container(&s) => self.replace_in_json(&s, found)?,
                Ok(s) => self.replace(&s, found),
                Err(_) => None,
            };
            match replaced {
                Some((s, k)) => {
                    out.push_str(&serde_json::to_string(&s).map_err(|e| e.to_string())?);
                    n += k;
                }
                None => out.push_str(literal),
            }
            last = end;
            i = end;
        }
        bare(&mut out, &json[last..], &mut n);
        if n == 0 {
            return Ok(None);
        }
        serde_json::from_str::<serde_json::Value>(&out).map_err(|_| {
            "the pattern matches the JSON's structure, not only its text".to_string()
        })?;
        Ok(Some((out, n)))
    }
}

/// `out` with every occurrence of each form, whole or cut by a truncation
/// ([`cut_ranges`]), replaced by the marker, and how many.
fn replace_forms<'s>(
    mut out: std::borrow::Cow<'s, str>,
    forms: &[&str],
) -> (std::borrow::Cow<'s, str>, i64) {
    let mut n = 0;
    for form in forms {
        let k = out.matches(form).count();
        if k > 0 {
            n += k as i64;
            out = std::borrow::Cow::Owned(out.replace(form, REDACTION_MARKER));
        }
        let cuts = cut_ranges(&out, form);
        if !cuts.is_empty() {
            n += cuts.len() as i64;
            let mut o = out.into_owned();
            for r in cuts.into_iter().rev() {
                o.replace_range(r, REDACTION_MARKER);
            }
            out = std::borrow::Cow::Owned(o);
        }
    }
    (out, n)
}

/// Every whole match of `pattern` (a regex) in the session's stored texts,
/// as written and inside their JSON strings decoded, each once, with its
/// JSON-escaped form: what its cut forms are looked for as. Empty for a text
/// pattern (its cut forms are its own).
fn regex_matches(tx: &Connection, sid: SessionId, pattern: &Pattern) -> Result<Vec<String>> {
    let Pattern::Regex(re) = pattern else {
        return Ok(Vec::new());
    };
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => {
                out.push(s.clone());
                if is_json_container(s) {
                    if let Ok(inner) = serde_json::from_str(s) {
                        strings(&inner, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let mut found = std::collections::BTreeSet::new();
    for t in COLUMNS {
        let mut st = tx.prepare(t.select)?;
        let mut rows = st.query([sid])?;
        while let Some(r) = rows.next()? {
            for i in 0..t.columns.len() {
                let Some(text) = r.get::<_, Option<String>>(i + 1)? else {
                    continue;
                };
                let mut texts = vec![text.clone()];
                if is_json_container(&text) {
                    if let Ok(v) = serde_json::from_str(&text) {
                        strings(&v, &mut texts);
                    }
                }
                for x in &texts {
                    for m in re.find_iter(x) {
                        found.insert(m.as_str().to_string());
                    }
                }
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for m in found {
        let escaped = serde_json::to_string(&m).unwrap_or_default();
        let escaped = escaped[1..escaped.len().max(2) - 1].to_string();
        if escaped != m {
            out.push(escaped);
        }
        out.push(m);
    }
    // Longest first: a cut form of a longer match is not taken for a
    // shorter one's.
    out.sort_by_key(|m| std::cmp::Reverse(m.len()));
    Ok(out)
}

/// True when `text` is a JSON object or array.
fn is_json_container(text: &str) -> bool {
    matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['))
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// A cut occurrence is redacted when at least this many bytes of it are left.
const MIN_CUT: usize = 6;

/// Where `text` holds `form` cut short by a truncation: a prefix of it (at
/// least [`MIN_CUT`] bytes, not all of it) at the end of the text or right
/// before an ellipsis `…` (a pinned fact's sentence, a capped block's
/// `\n[… n chars omitted …]\n`), a suffix of it at the start of the text or
/// right after one. Sorted, not overlapping.
fn cut_ranges(text: &str, form: &str) -> Vec<std::ops::Range<usize>> {
    let cuts = |len: usize| {
        form.char_indices()
            .map(|(i, _)| i)
            .filter(move |&i| i >= MIN_CUT.min(len) && i < len)
    };
    let prefix_before = |end: usize| {
        let mut best = None;
        for k in cuts(form.len()) {
            if text[..end].ends_with(&form[..k]) {
                best = Some(end - k..end);
            }
        }
        best
    };
    let suffix_after = |start: usize| {
        let mut best = None;
        for k in cuts(form.len()) {
            let from = form.len() - k;
            if form.is_char_boundary(from) && text[start..].starts_with(&form[from..]) {
                best = Some(start..start + k);
            }
        }
        best
    };
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    if form.len() <= MIN_CUT {
        return ranges;
    }
    ranges.extend(suffix_after(0));
    for (i, _) in text.match_indices('…') {
        let before = text[..i].strip_suffix("\n[").map_or(i, str::len);
        ranges.extend(prefix_before(before));
        let after = i + '…'.len_utf8();
        let after = if text[after..].starts_with("]\n") {
            after + 2
        } else {
            after
        };
        ranges.extend(suffix_after(after));
    }
    ranges.extend(prefix_before(text.len()));
    ranges.sort_by_key(|r| r.start);
    ranges.dedup();
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for r in ranges {
        if out.last().is_none_or(|l| r.start >= l.end) {
            out.push(r);
        }
    }
    out
}
/// What a redaction did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Redacted {
    /// Its record in `redactions`; None when nothing matched (nothing is
    /// changed or recorded then) and in a preview.
    pub redaction_id: Option<i64>,
    /// A preview ([`crate::Store::redaction_preview`]): what a redaction
    /// would do now; nothing was changed.
    pub dry_run: bool,
    /// The session's row id.
    pub session_id: SessionId,
    /// Its external id.
    pub external_id: String,
    /// Occurrences replaced.
    pub occurrences: i64,
    /// Rows changed, by table.
    pub rows: RedactedRows,
    /// Executed steps whose messages now rebuild with the marker (their
    /// recorded hashes are of the bytes before; the redaction records the
    /// hash they rebuild to now).
    pub steps_rebuilt: i64,
    /// Running turns fenced: a runner holding one is refused at its next
    /// write; the turn resumes from the redacted rows.
    pub turns_fenced: i64,
    /// The write-ahead log was checkpointed and truncated after (see
    /// [`crate::admin::Deleted::checkpointed`]).
    pub checkpointed: bool,
}
/// What an executed step rebuilds to, and whether that is the hash it is
/// checked against (the newest redaction's, or the one it recorded).
fn rebuilt_before(conn: &Connection, step: StepId) -> Result<(String, bool)> {
    match crate::replay::rebuild_step(conn, step) {
        Ok(r) => {
            let held = r.holds();
            Ok((r.sha256, held))
        }
        // A step whose rows do not read back is left as it is reported.
        Err(e) if !e.is_resumable() => Ok((String::new(), false)),
        Err(e) => Err(e),
    }
}

/// One changed row: table, id, the columns' new values, the hash to record.
struct Change {
    tbl: &'static str,
    id: i64,
    values: Vec<Option<String>>,
    sha256: Option<String>,
}

/// The text columns of one table a redaction rewrites (`json`: stored JSON).
struct Columns {
    tbl: &'static str,
    select: &'static str,
    columns: &'static [(&'static str, bool)],
}

const COLUMNS: &[Columns] = &[
    Columns {
        tbl: "sessions",
        select: "SELECT id, system_prompt FROM sessions WHERE id = ?1",
        columns: &[("system_prompt", false)],
    },
    Columns {
        tbl: "turns",
        select: "SELECT id, input, output, error FROM turns WHERE session_id = ?1 ORDER BY id",
        columns: &[("input", false), ("output", false), ("error", false)],
    },
    Columns {
        tbl: "steps",
        select: "SELECT s.id, s.response, s.error FROM steps s JOIN turns t ON t.id = s.turn_id \
                 WHERE t.session_id = ?1 ORDER BY s.id",
        columns: &[("response", true), ("error", false)],
    },
    Columns {
        tbl: "tool_invocations",
        select: "SELECT i.id, i.arguments, i.result FROM tool_invocations i \
                 JOIN steps s ON s.id = i.step_id JOIN turns t ON t.id = s.turn_id \
                 WHERE t.session_id = ?1 ORDER BY i.id",
        columns: &[("arguments", true), ("result", false)],
    },
    Columns {
        tbl: "compactions",
        select:
            "SELECT id, summary, focus, error FROM compactions WHERE session_id = ?1 ORDER BY id",
        columns: &[("summary", false), ("focus", false), ("error", false)],
    },
    Columns {
        tbl: "pins",
        select: "SELECT id, value, sentence FROM pins WHERE session_id = ?1 ORDER BY id",
        columns: &[("value", false), ("sentence", false)],
    },
    // Recorded in the redaction's counts only: no hash is kept of them.
    Columns {
        tbl: "approvals",
        select: "SELECT id, arguments, input, note FROM approvals WHERE session_id = ?1 \
                 ORDER BY id",
        columns: &[("arguments", true), ("input", true), ("note", false)],
    },
];

/// Every row of the session the pattern changes, with its new values, and
/// the occurrences replaced.
fn scan(tx: &Connection, sid: SessionId, pattern: &Pattern) -> Result<(Vec<Change>, i64)> {
    let found = regex_matches(tx, sid, pattern)?;
    let mut changes = Vec::new();
    let mut occurrences = 0;
    for t in COLUMNS {
        let mut st = tx.prepare(t.select)?;
        let mut rows = st.query([sid])?;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            let mut values = Vec::with_capacity(t.columns.len());
            let (mut changed, mut before_input) = (false, None);
            for (i, (name, json)) in t.columns.iter().enumerate() {
                let old: Option<String> = r.get(i + 1)?;
                let new = match old.as_deref() {
                    None => None,
                    Some(text) if *json => {
                        let refuse = |why: &str| {
                            Error::Config(format!(
                                "cannot redact {} {id}'s {name}: {why}; give a narrower pattern",
                                t.tbl
                            ))
                        };
                        let new = pattern
                            .replace_in_json(text, &found)
                            .map_err(|why| refuse(&why))?;
                        // A response must still read back as one: a pattern
                        // that takes a number abridge reads (its usage) is
                        // refused, not left to break the session.
                        if let (Some((r, _)), "steps") = (&new, t.tbl) {
                            serde_json::from_str::<crate::message::ModelResponse>(r).map_err(
                                |_| refuse("the pattern matches a value abridge reads back"),
                            )?;
                        }
                        new
                    }
                    Some(text) => pattern.replace_in_text(text, &found),
                };
                match new {
                    Some((text, n)) => {
                        occurrences += n;
                        changed = true;
                        if t.tbl == "turns" && *name == "input" {
                            before_input = old.as_deref().map(|s| sha256_hex(s.as_bytes()));
                        }
                        values.push(Some(text));
                    }
                    None => values.push(old),
                }
            }
            if changed {
                let sha256 = match t.tbl {
                    "compactions" => values[0].as_deref().map(|s| sha256_hex(s.as_bytes())),
                    "turns" => before_input,
                    _ => None,
                };
                changes.push(Change {
                    tbl: t.tbl,
                    id,
                    values,
                    sha256,
                });
            }
        }
    }
    Ok((changes, occurrences))
}

/// Redacts `pattern` from every stored text of `session` in one IMMEDIATE
/// transaction (see the module's comment), then checkpoints the WAL.
pub(crate) fn redact(
    conn: &mut Connection,
    session: &SessionRow,
    pattern: &Pattern,
    dry_run: bool,
) -> Result<Redacted> {
    conn.secure_delete()?;
    let sid = session.id;
    // What each executed step rebuilds to now, and whether that is what it
    // is checked against (a step that did not verify before is left to
    // `verify` to report: a redaction never hides a violation). Read before
    // the write lock is taken, so other writers wait for half the rebuilds
    // only: an executed step's bytes are built from rows that never change
    // but by a redaction, so these hold while the session's newest
    // redaction is the same when the lock is taken.
    let (seen_redaction, mut before) = crate::store::in_read_tx(conn, |c| {
        let mut before = HashMap::new();
        if scan(c, sid, pattern)?.0.is_empty() {
            return Ok((-1, before)); // nothing to rebuild for (checked again below)
        }
        for id in crate::store::executed_step_ids(c, Some(sid))? {
            before.insert(id, rebuilt_before(c, id)?);
        }
        Ok((session_redaction(c, sid)?, before))
    })?;
    let tx = conn.write_tx()?;
    crate::store::get_session(&tx, sid)?;
    // The rows it would change are also the history of the forks that read
    // them: refused while there are any (checked inside the write lock).
    let forks = crate::store::forks_reading(&tx, sid)?;
    if !forks.is_empty() {
        return Err(crate::Error::HasForks {
            session_id: sid,
            forks,
        });
    }
    if session_redaction(&tx, sid)? != seen_redaction {
        before.clear();
    }

    let (changes, occurrences) = scan(&tx, sid, pattern)?;
    if changes.is_empty() {
        tx.commit()?;
        return Ok(Redacted {
            redaction_id: None,
            dry_run,
            session_id: sid,
            external_id: session.external_id.clone(),
            occurrences: 0,
            rows: RedactedRows::default(),
            steps_rebuilt: 0,
            turns_fenced: 0,
            checkpointed: false,
        });
    }

    // Steps executed since the read above, rebuilt now.
    let steps = crate::store::executed_step_ids(&tx, Some(sid))?;
    for id in &steps {
        if !before.contains_key(id) {
            before.insert(*id, rebuilt_before(&tx, *id)?);
        }
    }

    tx.execute("INSERT INTO erasing (session_id) VALUES (?1)", [sid])?;
    let mut rows = RedactedRows::default();
    for c in &changes {
        let t = COLUMNS
            .iter()
            .find(|t| t.tbl == c.tbl)
            .expect("a known table");
        let sets: Vec<String> = t
            .columns
            .iter()
            .enumerate()
            .map(|(i, (name, _))| format!("{name} = ?{}", i + 2))
            .collect();
        let sql = format!("UPDATE {} SET {} WHERE id = ?1", c.tbl, sets.join(", "));
        let mut args: Vec<&dyn rusqlite::ToSql> = vec![&c.id];
        args.extend(c.values.iter().map(|v| v as &dyn rusqlite::ToSql));
        tx.execute(&sql, args.as_slice())?;
        *match c.tbl {
            "sessions" => &mut rows.sessions,
            "turns" => &mut rows.turns,
            "steps" => &mut rows.steps,
            "tool_invocations" => &mut rows.tool_invocations,
            "compactions" => &mut rows.compactions,
            "approvals" => &mut rows.approvals,
            _ => &mut rows.pins,
        } += 1;
    }
    // A runner still holding a running turn sent, or is sending, the text
    // before: its next write is refused, and the turn resumes from here.
    let turns_fenced = tx.execute(
        "UPDATE turns SET lease_epoch = lease_epoch + 1, lease_owner = NULL, \
         lease_expires_at = NULL WHERE session_id = ?1 AND status = 'running'",
        [sid],
    )? as i64;

    let mut rebuilt = Vec::new();
    for id in &steps {
        let (was, held) = &before[id];
        if !*held {
            continue; // it did not verify before: verify goes on reporting it
        }
        let now = crate::replay::rebuild_step(&tx, *id)?.sha256;
        if now != *was {
            rebuilt.push((*id, now));
        }
    }
    let redaction_id = tx.insert_returning_id(
        "INSERT INTO redactions (session_id, pattern_kind, pattern_sha256, marker, occurrences, \
         rows, steps_rebuilt, turns_fenced, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            sid,
            pattern.kind(),
            sha256_hex(pattern.source().as_bytes()),
            REDACTION_MARKER,
            occurrences,
            serde_json::to_string(&rows)?,
            rebuilt.len() as i64,
            turns_fenced,
            tx.now_ms()
        ],
    )?
    .ok_or(crate::error::Error::NoRow)?;
    {
        let mut ins = tx.prepare(
            "INSERT INTO redacted_rows (redaction_id, tbl, row_id, sha256) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for c in changes.iter().filter(|c| c.tbl != "approvals") {
            ins.execute(params![redaction_id, c.tbl, c.id, c.sha256])?;
        }
        for (id, sha) in &rebuilt {
            ins.execute(params![redaction_id, "step_messages", id.0, sha])?;
        }
    }
    tx.execute("DELETE FROM erasing", [])?;
    // A dry run: everything above, measured, and nothing of it kept.
    let (redaction_id, checkpointed) = if dry_run {
        tx.rollback()?;
        (None, false)
    } else {
        tx.commit()?;
        (Some(redaction_id), crate::store::checkpoint(conn)?)
    };
    Ok(Redacted {
        redaction_id,
        dry_run,
        session_id: sid,
        external_id: session.external_id.clone(),
        occurrences,
        rows,
        steps_rebuilt: rebuilt.len() as i64,
        turns_fenced,
        checkpointed,
    })
}

impl crate::Store {
    /// Replaces every stored occurrence of `pattern` in a session (system
    /// prompt, turn inputs and outputs, responses, tool arguments and
    /// results, summaries, pinned facts, error texts) by
    /// [`REDACTION_MARKER`], in one transaction, the old bytes overwritten
    /// (`secure_delete`, then a WAL checkpoint). Recorded in `redactions`
    /// (when, the pattern's SHA-256, which rows); the steps whose messages
    /// now rebuild with the marker are reported as redacted by
    /// [`crate::verify::verify`] and [`crate::replay::rebuild_step`]
    /// ([`crate::replay::Rebuilt::redaction`]), not as broken. A turn
    /// running on the session (in any process) is fenced: its runner gets
    /// [`crate::Error::LeaseLost`] at its next write, and the turn resumes
    /// from the redacted rows; a summary being made from the text before is
    /// made again at its completion. The session's external id is not
    /// redacted (it is the session's key).
    pub async fn redact(
        &self,
        key: impl Into<crate::inspect::SessionKey>,
        pattern: Pattern,
    ) -> Result<Redacted> {
        self.redact_session(key.into(), pattern, false).await
    }

    /// What [`crate::Store::redact`] would do now (occurrences, rows, steps
    /// that would rebuild with the marker, turns it would fence), with
    /// nothing changed: the redaction is made inside a transaction that is
    /// rolled back (it holds the write lock as long as a redaction).
    pub async fn redaction_preview(
        &self,
        key: impl Into<crate::inspect::SessionKey>,
        pattern: Pattern,
    ) -> Result<Redacted> {
        self.redact_session(key.into(), pattern, true).await
    }

    async fn redact_session(
        &self,
        key: crate::inspect::SessionKey,
        pattern: Pattern,
        dry_run: bool,
    ) -> Result<Redacted> {
        self.call(move |c| {
            let session = crate::inspect::session(c, &key)?;
            redact(c, &session, &pattern, dry_run)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_replaced_every_time_and_counted() {
        let p = Pattern::text("sk-123").unwrap();
        assert_eq!(
            p.replace("a sk-123 b sk-123", &[]),
            Some((format!("a {REDACTION_MARKER} b {REDACTION_MARKER}"), 2))
        );
        assert_eq!(p.replace("nothing", &[]), None);
    }

    #[test]
    fn a_text_cut_by_a_truncation_is_redacted_too() {
        let p = Pattern::text("sk-live-4f9a8b7c").unwrap();
        let m = REDACTION_MARKER;
        // A pinned fact's sentence, cut on both sides.
        assert_eq!(
            p.replace("…4f9a8b7c and more… key sk-live-4f9…", &[])
                .unwrap()
                .0,
            format!("…{m} and more… key {m}…")
        );
        // A capped block, and a text cut at its end.
        assert_eq!(
            p.replace("head sk-live-4\n[… 10 chars omitted …]\nf9a8b7c tail", &[])
                .unwrap()
                .0,
            format!("head {m}\n[… 10 chars omitted …]\n{m} tail")
        );
        assert_eq!(
            p.replace("ends with sk-live", &[]).unwrap().0,
            format!("ends with {m}")
        );
        // Fewer than six bytes left is not taken for it.
        assert_eq!(p.replace("the sk-l… …8b7c", &[]), None);
    }

    /// Exotic text never panics, and what comes back is what it claims:
    /// JSON stays JSON, and no decoded string or plain text still holds
    /// the pattern.
    #[test]
    fn exotic_text_and_patterns_never_panic_and_leave_no_occurrence() {
        let pieces = [
            "é", "日本", "🙂", "\u{301}", "\"", "\\", "…", "]\n", "\n[", "x", "sk-", "\u{0}", " ",
        ];
        let seed = std::cell::Cell::new(0x9e37_79b9_7f4a_7c15_u64);
        let next = |n: usize| {
            let mut x = seed.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            seed.set(x);
            (x % n as u64) as usize
        };
        let word =
            |len: usize| -> String { (0..len).map(|_| pieces[next(pieces.len())]).collect() };
        for _ in 0..3_000 {
            let secret = word(1 + next(6));
            let text = word(next(24));
            let p = Pattern::text(secret.clone()).unwrap();
            // A secret with a bracket can be made again by the marker's own
            // brackets next to what is left ("\n[" before "[redacted]"):
            // only checked for panics.
            let checked = !secret.contains(['[', ']']);
            if let Some((out, n)) = p.replace(&text, &[]) {
                assert!(n > 0, "{text:?} / {secret:?}");
                assert!(
                    !checked || !out.contains(secret.as_str()),
                    "{text:?} / {secret:?}"
                );
            }
            let _ = p.replace_in_text(&text, &[]);
            let json = serde_json::json!({ "k": text, "n": [text.clone(), 1] }).to_string();
            if let Ok(Some((out, _))) = p.replace_in_json(&json, &[]) {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                for s in [&v["k"], &v["n"][0]] {
                    if let (Some(s), true) = (s.as_str(), checked) {
                        assert!(!s.contains(secret.as_str()), "{json} / {secret:?} -> {out}");
                    }
                }
            }
        }
    }

    #[test]
    fn regex_replacement_is_literal_and_empty_matches_are_refused() {
        let p = Pattern::regex(r"sk-\d+").unwrap();
        assert_eq!(
            p.replace("x sk-1 $1 sk-22", &[]),
            Some((format!("x {REDACTION_MARKER} $1 {REDACTION_MARKER}"), 2))
        );
        assert!(matches!(Pattern::regex("a*"), Err(Error::Config(_))));
        assert!(matches!(Pattern::regex("("), Err(Error::Config(_))));
        assert!(matches!(Pattern::text(""), Err(Error::Config(_))));
    }

    #[test]
    fn json_strings_are_matched_decoded_and_stay_json() {
        let p = Pattern::text("pa\"ss").unwrap();
        let (out, n) = p
            .replace_in_json(r#"{"k":"my pa\"ss here","n":1}"#, &[])
            .unwrap()
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(out, r#"{"k":"my [redacted] here","n":1}"#);
        // A number is replaced by a string holding the marker.
        let p = Pattern::text("4111111111111111").unwrap();
        let (out, _) = p
            .replace_in_json(r#"{"card":4111111111111111}"#, &[])
            .unwrap()
            .unwrap();
        assert_eq!(out, r#"{"card":"[redacted]"}"#);
        // JSON kept as a string (the exact arguments received) stays JSON.
        let p = Pattern::regex(r#"pa"ss"#).unwrap();
        let raw = r#"{"raw_input":"{\"pw\":\"pa\\\"ss\"}"}"#;
        let (out, n) = p.replace_in_json(raw, &[]).unwrap().unwrap();
        assert_eq!(n, 1);
        let inner: String = serde_json::from_value(
            serde_json::from_str::<serde_json::Value>(&out).unwrap()["raw_input"].clone(),
        )
        .unwrap();
        assert_eq!(inner, r#"{"pw":"[redacted]"}"#);
        // A pattern that takes the structure with it is refused.
        let p = Pattern::text(",").unwrap();
        assert!(p.replace_in_json(r#"{"a":1,"b":2}"#, &[]).is_err());
        assert_eq!(p.replace_in_json("[]", &[]).unwrap(), None);
    }
}
