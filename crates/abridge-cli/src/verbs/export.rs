//! `abridge export`: a session's full, uncompacted transcript.

use crate::common::Failure;
use abridge::inspect::{self, ExportFormat};
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge export`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id.
    #[arg(long)]
    pub session: String,
    /// markdown or jsonl.
    #[arg(long, default_value = "markdown")]
    pub format: String,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        session,
        format,
    } = args;
    let format = match format.as_str() {
        "markdown" | "md" => ExportFormat::Markdown,
        "jsonl" => ExportFormat::Jsonl,
        other => {
            return Err(Failure::usage(format!(
                "unknown format {other:?}: use markdown or jsonl"
            )))
        }
    };
    let text = crate::common::read_only(&db, |c| inspect::export(c, &session, format))
        .map_err(|e| Failure::session(&session, e))?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}
