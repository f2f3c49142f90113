//! `abridge replay`: rebuild an executed step's messages and compare with the recorded hash.

use crate::args::row_id;
use crate::common::Failure;
use abridge::store::Location;
use std::io::Write;
use std::process::ExitCode;

/// Arguments of `abridge replay`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Step id.
    #[arg(long, allow_negative_numbers = true, value_parser = row_id)]
    pub step: i64,
    /// Print exactly the rebuilt bytes, nothing else (after a redaction,
    /// the bytes with the marker, whose hash the redaction recorded).
    #[arg(long)]
    pub raw: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args { db, step, raw } = args;
    let r = crate::common::read_only(&db, |c| {
        abridge::replay::rebuild_step(c, abridge::StepId(step))
    })?;
    if raw {
        let mut out = std::io::stdout().lock();
        out.write_all(&r.bytes)?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", serde_json::to_string_pretty(&r.messages)?);
    println!("\nrebuilt  sha256 {}", r.sha256);
    println!("recorded sha256 {}", r.recorded);
    if let Some(m) = &r.redaction {
        println!(
            "redacted sha256 {} (redaction {} at {} ms: the step's text holds the marker {}; \
             the recorded hash is of the bytes before)",
            m.sha256,
            m.redaction_id,
            m.at,
            abridge::store::REDACTION_MARKER
        );
    }
    println!(
        "{}",
        match (r.holds(), r.redaction.is_some()) {
            (true, false) => "match",
            (true, true) => "match (redacted)",
            (false, _) => "MISMATCH",
        }
    );
    Ok(if r.holds() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
