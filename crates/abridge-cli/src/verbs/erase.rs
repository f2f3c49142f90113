//! `abridge delete` and `abridge prune`: deleting sessions whole;
//! `abridge redact`: replacing a secret wherever a session stores it.

use crate::common::{must_exist, print_json, Failure};
use abridge::admin::{Deleted, Pattern};
use abridge::store::Location;
use abridge::store::REDACTION_MARKER;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `abridge delete`.
#[derive(clap::Args)]
pub struct DeleteArgs {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id.
    #[arg(long)]
    pub session: String,
    /// Then rewrite the file without its free pages (VACUUM), returning the
    /// space to the file system.
    #[arg(long)]
    pub vacuum: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `abridge prune`.
#[derive(clap::Args)]
pub struct PruneArgs {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Delete the sessions with no turn begun for this long: `30d`, `12h`,
    /// `90m`, `45s`, `2w`.
    #[arg(long)]
    pub idle_for: String,
    /// List the sessions it would delete, and delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Then VACUUM (see `delete`).
    #[arg(long)]
    pub vacuum: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `30d` as 30 days; `s`, `m`, `h`, `d`, `w`.
pub fn parse_age(s: &str) -> Result<Duration, Failure> {
    let s = s.trim();
    let bad = || {
        Failure::usage(format!(
            "{s:?} is not an age: a whole number and a unit (s, m, h, d, w), as 30d"
        ))
    };
    let unit = s.chars().last().ok_or_else(bad)?;
    let n: u64 = s[..s.len() - unit.len_utf8()].parse().map_err(|_| bad())?;
    let secs = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        'w' => 604_800,
        _ => return Err(bad()),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(bad)
}

fn say(d: &Deleted) {
    println!(
        "deleted session {} (id {}): {} turns, {} steps, {} tool calls, {} compactions, {} pins{}",
        d.external_id,
        d.session_id,
        d.turns,
        d.steps,
        d.tool_invocations,
        d.compactions,
        d.pins,
        if d.checkpointed {
            ""
        } else {
            " (a reader held the write-ahead log: its copy goes at the next checkpoint)"
        }
    );
    if !d.children.is_empty() {
        println!(
            "  with its delegated children (the sessions its tool calls ran): {}",
            d.children.join(", ")
        );
    }
}

/// The store at `db` (which must exist) and the session named `typed`, as
/// `inspect` names it (id, external id, `id:`/`ext:`).
async fn open_session(
    db: &Location,
    typed: &str,
) -> Result<(abridge::Store, abridge::store::SessionRow), Failure> {
    must_exist(db)?;
    let store = crate::common::open_store(db)?;
    let key = typed.to_string();
    let session = store
        .call(move |c| abridge::inspect::resolve_session(c, &key))
        .await
        .map_err(|e| Failure::session(typed, e))?;
    Ok((store, session))
}

/// Runs `delete`.
pub async fn delete(args: DeleteArgs) -> Result<ExitCode, Failure> {
    let (store, session) = open_session(&args.db, &args.session).await?;
    let fail = |e| Failure::session(&args.session, e);
    let deleted = store.delete_session(session.id).await.map_err(fail)?;
    if args.vacuum {
        store.vacuum().await?;
    }
    if args.json {
        print_json(&deleted);
    } else {
        say(&deleted);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `prune`.
pub async fn prune(args: PruneArgs) -> Result<ExitCode, Failure> {
    must_exist(&args.db)?;
    let age = parse_age(&args.idle_for)?;
    let store = crate::common::open_store(&args.db)?;
    if args.dry_run {
        let idle = store.idle_sessions(age).await?;
        if args.json {
            print_json(&idle);
        } else {
            let now = abridge::store::now_ms();
            for s in &idle {
                println!(
                    "would delete session {} (id {}), idle for {}, since {}",
                    s.external_id,
                    s.session_id,
                    abridge::text::human_duration_ms(now - s.last_activity),
                    crate::common::utc(s.last_activity),
                );
            }
            println!("{} sessions idle for {}", idle.len(), args.idle_for);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let deleted = store.prune(age).await?;
    if args.vacuum {
        store.vacuum().await?;
    }
    if args.json {
        print_json(&deleted);
    } else {
        for d in &deleted {
            say(d);
        }
        println!("{} sessions deleted", deleted.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `abridge redact`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("pattern").required(true).args(["text", "regex"])))]
pub struct RedactArgs {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id.
    #[arg(long)]
    pub session: String,
    /// The text to redact, byte for byte (`-`: read it from standard input,
    /// so it is in neither the shell's history nor the process list).
    #[arg(long)]
    pub text: Option<String>,
    /// A regular expression to redact every match of (Rust `regex` syntax;
    /// `-`: read it from standard input).
    #[arg(long)]
    pub regex: Option<String>,
    /// Say what it would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// `value`, or standard input's first line when it is `-`.
fn from_arg(value: String) -> abridge::Result<String> {
    if value != "-" {
        return Ok(value);
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

/// Runs `redact`.
pub async fn redact(args: RedactArgs) -> Result<ExitCode, Failure> {
    must_exist(&args.db)?;
    let pattern = match (args.text, args.regex) {
        (Some(t), _) => Pattern::text(from_arg(t)?)?,
        (None, Some(r)) => Pattern::regex(&from_arg(r)?)?,
        (None, None) => unreachable!("clap requires one"),
    };
    let (store, session) = open_session(&args.db, &args.session).await?;
    let fail = |e| Failure::session(&args.session, e);
    let r = if args.dry_run {
        store.redaction_preview(session.id, pattern).await
    } else {
        store.redact(session.id, pattern).await
    }
    .map_err(fail)?;
    if args.json {
        print_json(&r);
        return Ok(ExitCode::SUCCESS);
    }
    match (r.occurrences, r.redaction_id) {
        (0, _) => println!(
            "nothing to redact in session {} (id {}): no stored text matches",
            r.external_id, r.session_id
        ),
        (_, id) => {
            let n = &r.rows;
            println!(
                "{} session {} (id {}): {} occurrences replaced by {REDACTION_MARKER} in \
                 {} turns, {} steps, {} tool calls, {} compactions, {} pins{}{}",
                if r.dry_run {
                    "would redact"
                } else {
                    "redacted"
                },
                r.external_id,
                r.session_id,
                r.occurrences,
                n.turns,
                n.steps,
                n.tool_invocations,
                n.compactions,
                n.pins,
                if n.sessions > 0 {
                    " and the system prompt"
                } else {
                    ""
                },
                id.map_or(String::new(), |id| format!(" (redaction {id})")),
            );
            println!(
                "{} executed steps {} with the marker (verify and replay report them as redacted)",
                r.steps_rebuilt,
                if r.dry_run {
                    "would rebuild"
                } else {
                    "now rebuild"
                }
            );
            if r.turns_fenced > 0 {
                println!(
                    "{} running turn {}: its runner is refused at its next write; resume it",
                    r.turns_fenced,
                    if r.dry_run {
                        "would be fenced"
                    } else {
                        "fenced"
                    }
                );
            }
            if r.dry_run {
                println!("dry run: nothing was changed");
            } else if !r.checkpointed {
                println!("a reader held the write-ahead log: its copy goes at the next checkpoint");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
