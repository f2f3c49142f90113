//! `abridge demo`: scripted customer-support sessions on an embedded store.

use crate::args::{at_least_one, whole};
use crate::common::{print_json, Failure};
use abridge::store::Location;
use abridge::Threshold;
use abridge_testkit::demo::{run_demo, DemoOptions};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `abridge demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file (created if missing).
    #[arg(long, default_value = "abridge-demo.db")]
    pub db: Location,
    /// Sessions, run concurrently.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = at_least_one)]
    pub sessions: u64,
    /// Turns per session.
    #[arg(long, default_value_t = 40, allow_negative_numbers = true, value_parser = at_least_one)]
    pub turns: u64,
    /// Threshold: a token count (4000), a fraction of the window (0.9), or off.
    #[arg(long, default_value = "4000")]
    pub compact_at: String,
    /// Seed of the script.
    #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = whole)]
    pub seed: u64,
    /// Simulated model latency, ms.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole)]
    pub model_latency: u64,
    /// Simulated summariser latency, ms.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole)]
    pub summary_latency: u64,
    /// Background compaction: a summary starts at 80% of the threshold and
    /// is made while the session goes on (on), or only when a step reaches
    /// the threshold, which then waits for it (off).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub background: String,
    /// Tools whose calls wait for a decision (abridge pending / approve /
    /// reject): sessions stop there, and running the same command again
    /// resumes every turn whose calls were decided.
    #[arg(long, value_delimiter = ',', value_name = "TOOL[,TOOL]")]
    pub require_approval: Vec<String>,
    /// Recent turns kept verbatim, as a share of the threshold (0 keeps none).
    #[arg(long, default_value_t = 0.15)]
    pub keep_recent_share: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print a line per turn even when stdout is not a terminal.
    #[arg(long)]
    pub progress: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        sessions,
        turns,
        compact_at,
        seed,
        model_latency,
        summary_latency,
        background,
        require_approval,
        keep_recent_share,
        json,
        progress,
    } = args;
    let exporting = crate::verbs::otlp::from_env()?;
    let opts = DemoOptions {
        db: db.as_path().to_path_buf(),
        sessions,
        turns,
        compact_at: Threshold::parse(&compact_at)?,
        seed,
        model_latency: Duration::from_millis(model_latency),
        summary_latency: Duration::from_millis(summary_latency),
        owner: None,
        background: background == "on",
        key: crate::common::key()?,
        require_approval,
        keep_recent_share: Some(keep_recent_share),
        #[cfg(feature = "otel")]
        telemetry: exporting.as_ref().map(|(t, _)| t.clone()),
        #[cfg(not(feature = "otel"))]
        telemetry: None,
    };
    let tty = (progress || std::io::stdout().is_terminal()) && !json;
    let report = run_demo(&opts, move |p| {
        if tty {
            println!(
                "{:<14} turn {:>4}  steps {}  context {:>6} tokens  compactions {}",
                p.session,
                p.turn,
                p.steps,
                p.context_tokens.map_or("-".into(), |t| t.to_string()),
                p.compactions
            );
        }
    })
    .await;
    if let Some((_, exporting)) = exporting {
        exporting.finish();
    }
    let report = report?;
    if json {
        print_json(&report);
    } else {
        print_demo_table(&report);
        if report.calls_waiting > 0 {
            println!(
                "\n{} tool call(s) wait for a decision in {} session(s): abridge pending --db {db}\n\
                 decide them (abridge approve|reject --db {db} --call ID), then run this command again",
                report.calls_waiting, report.sessions_parked
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_demo_table(r: &abridge_testkit::demo::DemoReport) {
    println!("\nabridge demo: {}", r.db);
    println!("  sessions               {}", r.sessions);
    println!(
        "  turns                  {} ({} failed)",
        r.turns, r.turns_failed
    );
    println!("  steps                  {}", r.steps);
    println!("  tool calls             {}", r.tool_calls);
    if r.calls_waiting + r.calls_decided > 0 {
        println!(
            "  awaiting a decision    {} calls ({} decided before)",
            r.calls_waiting, r.calls_decided
        );
    }
    println!(
        "  compactions            {} completed ({} in the background), {} failed",
        r.compactions_completed, r.compactions_background, r.compactions_failed
    );
    println!(
        "  waited for a summary   {} steps, {} ms in all",
        r.steps_waited_for_summary, r.summary_wait_ms
    );
    println!(
        "  pinned facts           {} stated, {} live, {} carried by the newest summaries ({} added by the guard)",
        r.pins, r.pins_live, r.pins_carried, r.pins_added
    );
    println!("  wall time              {:.2} s", r.wall_seconds);
    if !r.compactions.is_empty() {
        println!(
            "\n  {:<16} {:>10} {:>10} {:>14} {:>13} {:>6}",
            "session", "up to turn", "status", "tokens before", "tokens after", "pins"
        );
        for c in &r.compactions {
            println!(
                "  {:<16} {:>10} {:>10} {:>14} {:>13} {:>6}",
                c.session,
                c.up_to_turn,
                c.status,
                c.tokens_before.map_or("-".into(), |t| t.to_string()),
                c.tokens_after.map_or("-".into(), |t| t.to_string()),
                c.pins_live.map_or("-".into(), |t| t.to_string())
            );
        }
    }
}
