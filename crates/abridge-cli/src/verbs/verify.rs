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
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args { db, json } = args;
    let report = crate::common::read_only(&db, |c| {
        abridge::verify::verify_with(c, &[&abridge_testkit::demo_tables::DemoEffects])
    })?;
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
