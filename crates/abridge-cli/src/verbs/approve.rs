//! `abridge pending`, `approve`, `reject` and `deliver`: the tool calls that
//! wait for a human's decision (or a delivered result), and taking that
//! decision from outside any running host, once.

use crate::common::{must_exist, open_store, print_json, Failure};
use abridge::store::{ApprovalRow, Decision, Location};
use abridge::CallId;
use serde::Serialize;
use std::process::ExitCode;

/// Arguments of `abridge pending`.
#[derive(clap::Args)]
pub struct PendingArgs {
    /// Database file (or postgres:// URL).
    #[arg(long)]
    pub db: Location,
    /// Only this session's calls (id or external id).
    #[arg(long)]
    pub session: Option<String>,
    /// JSON output: `{"calls": [{"call", "session", "turn", "tool", "input", ...}]}`.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `abridge approve`.
#[derive(clap::Args)]
pub struct ApproveArgs {
    /// Database file (or postgres:// URL).
    #[arg(long)]
    pub db: Location,
    /// The call's id (as `abridge pending` lists it).
    #[arg(long)]
    pub call: i64,
    /// Run it with these arguments (a JSON object) instead of the model's;
    /// recorded as edited.
    #[arg(long)]
    pub input: Option<String>,
    /// Also allow every later call of this tool in this session without asking.
    #[arg(long)]
    pub always: bool,
    /// Who decides, for the record.
    #[arg(long)]
    pub by: Option<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `abridge reject`.
#[derive(clap::Args)]
pub struct RejectArgs {
    /// Database file (or postgres:// URL).
    #[arg(long)]
    pub db: Location,
    /// The call's id (as `abridge pending` lists it).
    #[arg(long)]
    pub call: i64,
    /// What the model is told, as the tool's result.
    #[arg(long)]
    pub reason: String,
    /// Who decides, for the record.
    #[arg(long)]
    pub by: Option<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `abridge deliver`.
#[derive(clap::Args)]
pub struct DeliverArgs {
    /// Database file (or postgres:// URL).
    #[arg(long)]
    pub db: Location,
    /// The deferred call's id (as `abridge pending` lists it).
    #[arg(long)]
    pub call: i64,
    /// The result the model sees (`-` reads it from standard input).
    #[arg(long)]
    pub result: String,
    /// Deliver it as an error result.
    #[arg(long)]
    pub error: bool,
    /// Who delivers, for the record.
    #[arg(long)]
    pub by: Option<String>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// One parked call as the command line shows it (`--json`'s `calls` list).
#[derive(Serialize)]
struct Shown {
    call: i64,
    session: String,
    session_id: i64,
    turn: i64,
    turn_id: i64,
    step_id: i64,
    tool: String,
    input: serde_json::Value,
    effect: String,
    kind: String,
    status: String,
    waited_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    approved_input: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decided_by: Option<String>,
}

async fn shown(store: &abridge::Store, rows: Vec<ApprovalRow>) -> Result<Vec<Shown>, Failure> {
    let now = store.now_ms();
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let session = store.session(r.session_id).await?;
        let tid = r.turn_id;
        let turn = store.call(move |c| abridge::inspect::turn(c, tid)).await?;
        let json = |s: &str| serde_json::from_str(s).unwrap_or(serde_json::Value::String(s.into()));
        out.push(Shown {
            call: r.id.get(),
            session: session.external_id,
            session_id: r.session_id.get(),
            turn: turn.idx,
            turn_id: tid.get(),
            step_id: r.step_id.get(),
            tool: r.tool_name.clone(),
            input: json(&r.arguments),
            effect: r.effect.clone(),
            kind: r.kind.to_string(),
            status: r.status.to_string(),
            waited_ms: r.waited_ms(now),
            approved_input: r.input.as_deref().map(json),
            note: r.note.clone(),
            decided_by: r.decided_by.clone(),
        });
    }
    Ok(out)
}

/// Runs `pending`.
pub async fn pending(args: PendingArgs) -> Result<ExitCode, Failure> {
    must_exist(&args.db)?;
    let store = open_store(&args.db)?;
    let session = match &args.session {
        None => None,
        Some(typed) => {
            let key = typed.clone();
            let s = store
                .call(move |c| abridge::inspect::resolve_session(c, &key))
                .await
                .map_err(|e| Failure::session(typed, e))?;
            Some(s.id)
        }
    };
    let calls = shown(&store, store.pending_calls(session).await?).await?;
    if args.json {
        print_json(&serde_json::json!({ "calls": calls }));
        return Ok(ExitCode::SUCCESS);
    }
    if calls.is_empty() {
        println!("no tool call waits");
        return Ok(ExitCode::SUCCESS);
    }
    for c in &calls {
        let what = match c.kind.as_str() {
            "result" => "waits for a result",
            _ => "waits for approval",
        };
        println!(
            "call {}  session {} turn {}  {} {}  ({}, {what}, {} s)",
            c.call,
            c.session,
            c.turn,
            c.tool,
            c.input,
            c.effect,
            c.waited_ms / 1000
        );
    }
    println!(
        "{} call(s) wait: abridge approve|reject --db {} --call ID",
        calls.len(),
        args.db
    );
    Ok(ExitCode::SUCCESS)
}

async fn decide(
    db: &Location,
    call: i64,
    decision: Decision,
    by: Option<&str>,
    json: bool,
) -> Result<ExitCode, Failure> {
    must_exist(db)?;
    let store = open_store(db)?;
    let row = store.decide(CallId(call), decision, by).await?;
    let shown = shown(&store, vec![row]).await?.remove(0);
    if json {
        print_json(&shown);
    } else {
        println!(
            "call {} ({} in session {} turn {}): {}; the turn goes on when it is resumed",
            shown.call, shown.tool, shown.session, shown.turn, shown.status
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `approve`.
pub async fn approve(args: ApproveArgs) -> Result<ExitCode, Failure> {
    let input = match &args.input {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<serde_json::Value>(text)
                .map_err(|e| Failure::usage(format!("--input is not JSON: {e}")))?,
        ),
    };
    let d = Decision::Approve {
        input,
        always: args.always,
    };
    decide(&args.db, args.call, d, args.by.as_deref(), args.json).await
}

/// Runs `reject`.
pub async fn reject(args: RejectArgs) -> Result<ExitCode, Failure> {
    let d = Decision::reject(args.reason.clone());
    decide(&args.db, args.call, d, args.by.as_deref(), args.json).await
}

/// Runs `deliver`.
pub async fn deliver(args: DeliverArgs) -> Result<ExitCode, Failure> {
    let result = match args.result.as_str() {
        "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
            s
        }
        r => r.to_string(),
    };
    let d = Decision::Deliver {
        result,
        ok: !args.error,
    };
    decide(&args.db, args.call, d, args.by.as_deref(), args.json).await
}
