//! `abridge verify`: the guarantees G1-G8 on a whole store.

use crate::common::Failure;
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge verify`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
    /// Check only what changed since the last verified point (the steps
    /// executed and compactions completed since, and the cheap store-wide
    /// checks), then record a new point when every check holds. With no
    /// point yet (or a redaction or an erasure since), a full run.
    #[arg(long)]
    pub incremental: bool,
    /// Record the point a full run leaves off at (when every check holds),
    /// for the next `--incremental`.
    #[arg(long)]
    pub record: bool,
    /// Show the step rebuilds' progress on stderr (default: when stderr is
    /// a terminal).
    #[arg(long)]
    pub progress: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    use std::io::IsTerminal;
    let Args {
        db,
        json,
        incremental,
        record,
        progress,
    } = args;
    let show = progress || std::io::stderr().is_terminal();
    let said = std::cell::Cell::new(std::time::Instant::now());
    let progress = |name: &str, done: u64, of: u64| {
        // At most every half second, and the end.
        if done == of || said.get().elapsed() >= std::time::Duration::from_millis(500) {
            said.set(std::time::Instant::now());
            eprintln!("verify: {name}: {done} of {of} steps");
        }
    };
    let report = crate::common::read_only(&db, |c| {
        let since = match incremental {
            true => abridge::verify::last_point(c)?,
            false => None,
        };
        abridge::verify::verify_opts(
            c,
            &abridge::verify::Options {
                effect_checks: &[&abridge_testkit::demo_tables::DemoEffects],
                since,
                progress: show.then_some(&progress as abridge::verify::Progress<'_>),
            },
        )
    })?;
    let recorded = match (incremental || record) && report.ok {
        true => {
            let store = crate::common::open_store(&db)?;
            Some(store.with_conn(|c| abridge::verify::record_point(c, &report))?)
        }
        false => None,
    };
    if incremental && report.since.is_none() && !json {
        println!("no verified point to start from (or one older than a redaction or an erasure): a full run");
    }
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for c in &report.checks {
            println!(
                "{:<4} {:<40} checked {:>7}  violations {}{}",
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.checked,
                c.violations.len(),
                if c.redacted > 0 {
                    format!("  redacted {}", c.redacted)
                } else {
                    String::new()
                }
            );
            for v in c.violations.iter().take(20) {
                println!("       - {v}");
            }
        }
        for n in &report.notes {
            println!("note {n}");
        }
        if let Some(p) = &report.since {
            println!(
                "incremental: since verified point {} ({}): steps from id {}, compactions from id {}",
                p.id,
                crate::common::utc(p.at_ms),
                p.steps_from,
                p.compactions_from
            );
        }
        if let Some(p) = &recorded {
            println!("recorded verified point {}", p.id);
        }
        println!(
            "{}",
            if report.ok {
                "all guarantees hold"
            } else {
                "VIOLATIONS FOUND"
            }
        );
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
