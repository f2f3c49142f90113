//! `abridge chaos` (and its hidden worker and lock-holder processes): kill,
//! freeze and race processes on one database; check nothing is lost.

use crate::args::{at_least_one, probability, whole};
use crate::common::Failure;
use abridge::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `abridge chaos`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file (replaced).
    #[arg(long, default_value = "abridge-chaos.db")]
    pub db: PathBuf,
    /// Worker processes.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = at_least_one)]
    pub workers: u64,
    /// Kills to land before the run may end.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = whole)]
    pub kills: u64,
    /// Seed of the workload and the faults.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = whole)]
    pub seed: u64,
    /// Sessions per epoch.
    #[arg(long, default_value_t = 12, allow_negative_numbers = true, value_parser = at_least_one)]
    pub sessions: u64,
    /// Turns per session.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = at_least_one)]
    pub turns: u64,
    /// Self-kill probability per fault point reached.
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = probability)]
    pub point_kill_p: f64,
    /// Compaction threshold, tokens (low, so most turns compact).
    #[arg(long, default_value_t = 1200, allow_negative_numbers = true, value_parser = at_least_one)]
    pub compact_at: u64,
    /// Background compaction (on: summaries are made by tasks while steps go
    /// on, and killed there too; the comparison with the control run then
    /// leaves compaction records and step hashes out), or inline only (off:
    /// the whole transcript and every step hash must equal the control's).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub background: String,
    /// Share of the model's attempts that fail (errors, and replies later
    /// than the 200 ms timeout, eight to three), among those not spared:
    /// every third attempt a worker makes with a request is, so faults alone
    /// never fail a turn.
    #[arg(long, default_value_t = 0.055, allow_negative_numbers = true, value_parser = probability)]
    pub model_faults: f64,
    /// Kill at point 1, 2, 3, … of the workload in turn, until none is left.
    #[arg(long)]
    pub enumerate: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1800, allow_negative_numbers = true, value_parser = at_least_one)]
    pub max_seconds: u64,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    if crate::common::key()?.is_some() {
        // The environment, not the arguments: exit status 1.
        return Err(abridge::Error::Config(format!(
            "the chaos harness runs on plain stores (its workers open them without a key): unset {}",
            crate::common::KEY_VAR
        ))
        .into());
    }
    let Args {
        db,
        workers,
        kills,
        seed,
        sessions,
        turns,
        point_kill_p,
        compact_at,
        background,
        model_faults,
        enumerate,
        max_seconds,
        json,
    } = args;
    let opts = abridge_testkit::chaos::ChaosOptions {
        db,
        workers,
        kills,
        seed,
        sessions,
        turns,
        point_kill_p,
        compact_at,
        background: background == "on",
        model_faults_per_mille: (model_faults * 1000.0).round() as u64,
        max_duration: Duration::from_secs(max_seconds),
        exe: None,
        ..Default::default()
    };
    let report = if enumerate {
        abridge_testkit::chaos::run_enumerate(&opts).await?
    } else {
        abridge_testkit::chaos::run_chaos(&opts).await?
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_chaos(&report);
    }
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Arguments of `abridge chaos-worker`.
#[derive(clap::Args)]
pub struct WorkerArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub sessions: u64,
    #[arg(long)]
    pub turns: u64,
    #[arg(long)]
    pub epochs: u64,
    #[arg(long)]
    pub worker: u64,
    #[arg(long)]
    pub compact_at: u64,
    #[arg(long, value_parser = ["on", "off"])]
    pub background: String,
    #[arg(long)]
    pub model_faults_per_mille: u64,
}

/// Runs the verb.
pub async fn worker(args: WorkerArgs) -> Result<ExitCode, Failure> {
    let WorkerArgs {
        db,
        seed,
        sessions,
        turns,
        epochs,
        worker,
        compact_at,
        background,
        model_faults_per_mille,
    } = args;
    let w = abridge_testkit::chaos::Workload {
        seed,
        sessions,
        turns,
        epochs,
        compact_at,
        background: background == "on",
        model_faults_per_mille,
    };
    abridge_testkit::chaos::worker_main(&db, &w, worker).await?;
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `abridge chaos-locker`.
#[derive(clap::Args)]
pub struct LockerArgs {
    #[arg(long)]
    pub db: PathBuf,
    #[arg(long)]
    pub seed: u64,
}

/// Runs the verb.
pub async fn locker(args: LockerArgs) -> Result<ExitCode, Failure> {
    let LockerArgs { db, seed } = args;
    tokio::task::spawn_blocking(move || abridge_testkit::chaos::locker_main(&db, seed))
        .await
        .map_err(|e| Error::Task(e.to_string()))??;
    Ok(ExitCode::SUCCESS)
}

fn print_chaos(r: &abridge_testkit::chaos::ChaosReport) {
    println!(
        "abridge chaos: {:.1} s, {} epoch(s)",
        r.wall_seconds, r.epochs
    );
    println!(
        "  kills                  {} (recoveries {}, freezes {})",
        r.kills, r.recoveries, r.freezes
    );
    for (p, n) in &r.kills_by_point {
        println!("    {p:<28} {n}");
    }
    println!("  races");
    for (k, n) in &r.races {
        println!("    {k:<28} {n}");
    }
    println!("  faults injected");
    for (k, n) in &r.faults {
        println!("    {k:<28} {n}");
    }
    println!("  sessions               {}", r.sessions);
    println!(
        "  turns                  {} ({} failed by policy)",
        r.turns, r.turns_failed_by_policy
    );
    println!(
        "  compactions            {} ({} in the background; {} steps waited for a summary)",
        r.compactions, r.compactions_background, r.steps_waited_for_summary
    );
    println!(
        "  at-most-once unknown   {} session(s)",
        r.at_most_once_unknown_sessions
    );
    println!(
        "  decisions              {} parked calls decided once ({} rejected)",
        r.calls_parked, r.calls_rejected
    );
    println!(
        "  delegated children     {} (one per call, each as in the control run)",
        r.delegated_children
    );
    println!("  violations             {}", r.violations.len());
    for v in r.violations.iter().take(30) {
        println!("    - {v}");
    }
}
