//! `abridge migrate`: an SQLite store moved to a PostgreSQL server.

use crate::common::{key, must_exist, print_json, Failure};
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge migrate`.
#[derive(clap::Args)]
pub struct Args {
    /// The SQLite store to move (opened read-only, with the key in
    /// ABRIDGE_KEY if any).
    #[arg(long)]
    pub from: Location,
    /// The PostgreSQL store to move it into: postgres://USER@HOST/DB,
    /// optionally ?schema=NAME. It must hold no session yet.
    #[arg(long)]
    pub to: Location,
    /// Print what was moved as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    must_exist(&args.from)?;
    let from_key = key()?;
    let (from, to) = (args.from.clone(), args.to.clone());
    let moved = tokio::task::spawn_blocking(move || {
        abridge::admin::migrate_store(&from, from_key.as_ref(), &to)
    })
    .await
    .map_err(|e| abridge::Error::Task(e.to_string()))??;
    if args.json {
        print_json(&moved);
    } else {
        let rows: Vec<String> = moved
            .rows
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(t, n)| format!("{n} {t}"))
            .collect();
        println!(
            "{} moved to {}: {}; {} executed steps rebuild there to the same bytes",
            args.from.display(),
            moved.target,
            rows.join(", "),
            moved.steps_rebuilt
        );
    }
    Ok(ExitCode::SUCCESS)
}
