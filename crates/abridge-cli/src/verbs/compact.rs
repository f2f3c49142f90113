//! `abridge compact`: manual compaction from outside any running host.

use crate::args::whole_u32;
use crate::common::{compaction_line, must_exist, Failure, NoModel, SummariserArgs};
use abridge::inspect;
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge compact`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id.
    #[arg(long)]
    pub session: String,
    /// What the summary should give priority to.
    #[arg(long)]
    pub focus: Option<String>,
    /// Most recent turns kept verbatim.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole_u32)]
    pub keep_last_turns: u32,
    /// Show what would be compacted (turns, tokens before and expected after,
    /// the pinned facts carried) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: JSON output.
    #[arg(long)]
    pub json: bool,
    /// Who writes the summary.
    #[command(flatten)]
    pub summariser: SummariserArgs,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        session,
        focus,
        keep_last_turns,
        dry_run,
        json,
        summariser,
    } = args;
    must_exist(&db)?;
    if dry_run {
        return preview(&db, &session, focus, keep_last_turns, json);
    }
    let store = crate::common::open_store(&db)?;
    let key = session.clone();
    let s = store
        .call(move |c| inspect::resolve_session(c, &key))
        .await?;
    let typed = session.clone();
    let mut cfg = abridge::RunnerConfig::default()
        .with_owner(abridge::owner::process_owner("abridge-compact"));
    cfg.compaction.keep_last_turns = keep_last_turns;
    let mut builder =
        abridge::Runner::builder(store, std::sync::Arc::new(NoModel("compact"))).config(cfg);
    if let Some(s) = summariser.summariser()? {
        builder = builder.summariser_arc(s);
    }
    let runner = builder.build()?;
    let asked_at = abridge::store::now_ms();
    let row = runner
        .compact_now(s.id, focus)
        .await
        .map_err(|e| Failure::session(&typed, e))?;
    let earlier = row.completed_at.is_some_and(|t| t < asked_at);
    println!(
        "{}{}",
        compaction_line(&row, &s.external_id),
        if earlier {
            " - already compacted up to here earlier; a completed summary never changes"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// `--dry-run`: the preview, read through a snapshot that writes nothing.
fn preview(
    db: &Location,
    session: &str,
    focus: Option<String>,
    keep_last_turns: u32,
    json: bool,
) -> Result<ExitCode, Failure> {
    let mut cfg = abridge::CompactionConfig::default();
    cfg.keep_last_turns = keep_last_turns;
    let p = crate::common::read_only(db, |c| {
        let s = inspect::resolve_session(c, session)?;
        abridge::compaction::preview(&cfg, c, s.id, focus.as_deref())
    })
    .map_err(|e| Failure::session(session, e))?;
    if json {
        println!("{}", serde_json::to_string(&p)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(id) = p.already_compacted {
        println!(
            "already compacted up to turn {} (compaction {id}): nothing would change",
            p.boundary
        );
        return Ok(ExitCode::SUCCESS);
    }
    let turns = match (p.folds_from_turn, p.boundary) {
        (a, b) if a == b => format!("turn {a}"),
        (a, b) => format!("turns {a} to {b}"),
    };
    println!(
        "would fold {turns}{} into one summary (nothing written)",
        if p.previous_compaction.is_some() {
            " and the previous summary"
        } else {
            ""
        }
    );
    println!(
        "tokens: {} before, about {} after (offline summariser; the summary is capped at {} chars plus the pinned facts)",
        p.tokens_before, p.expected_tokens_after, p.summary_cap_chars
    );
    println!("pinned facts carried: {}", p.pins.len());
    for pin in &p.pins {
        println!("  {}", pin.line(true).trim_start_matches("- "));
    }
    Ok(ExitCode::SUCCESS)
}
