//! `abridge serve`: the background compaction of hosts that leave it to
//! another process: finishes the pending compactions of a store.

use crate::common::{compaction_line, must_exist, Failure, NoModel, SummariserArgs};
use abridge::store::Location;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `abridge serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Keep serving: look for pending compactions every `--poll-ms` until
    /// stopped (a serve killed mid-summary leaves its row to the next one
    /// once its lease expires).
    #[arg(long)]
    pub watch: bool,
    /// With --watch: milliseconds between looks.
    #[arg(long, default_value_t = 500, allow_negative_numbers = true, value_parser = crate::args::at_least_one)]
    pub poll_ms: u64,
    /// Who writes the summaries.
    #[command(flatten)]
    pub summariser: SummariserArgs,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        watch,
        poll_ms,
        summariser,
    } = args;
    must_exist(&db)?;
    let summariser = summariser.summariser()?;
    let store = crate::common::open_store(&db)?;
    let cfg =
        abridge::RunnerConfig::default().with_owner(abridge::owner::process_owner("abridge-serve"));
    let mut builder =
        abridge::Runner::builder(store.clone(), std::sync::Arc::new(NoModel("serve"))).config(cfg);
    if let Some(s) = summariser {
        builder = builder.summariser_arc(s);
    }
    let runner = builder.build()?;
    let (mut completed, mut failed) = (0usize, 0usize);
    loop {
        let served = runner.serve_pending().await?;
        for row in &served.completed {
            let sid = row.session_id;
            let session = store.session(sid).await?;
            println!("{}", compaction_line(row, &session.external_id));
        }
        for (id, message) in &served.failed {
            println!("compaction {id}: failed ({message})");
        }
        completed += served.completed.len();
        failed += served.failed.len();
        if !watch {
            break;
        }
        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
    }
    println!("served {completed} pending compaction(s), {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
