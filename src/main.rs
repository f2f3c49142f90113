//! The `abridge` command: run the demo, look inside a store, verify it, and run
//! the chaos harness.

use abridge::demo::{run_demo, DemoOptions};
use abridge::inspect::{self, ExportFormat};
use abridge::{Error, Threshold};
use clap::{Parser, Subcommand};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "abridge",
    version,
    about = "Durable, exactly-once context compaction for LLM agent hosts, on embedded SQLite",
    after_help = "Examples:\n  abridge demo\n  abridge inspect --db abridge-demo.db\n  abridge verify --db abridge-demo.db"
)]
struct Cli {
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run scripted customer-support sessions on an embedded store and watch them compact.
    #[command(
        after_help = "Example:\n  abridge demo --sessions 3 --turns 40 --compact-at 4000\n\n\
        Killed (Ctrl-C, kill -9) and run again with the same arguments, it resumes where it stopped."
    )]
    Demo {
        /// Database file (created if missing).
        #[arg(long, default_value = "abridge-demo.db")]
        db: PathBuf,
        /// Sessions, run concurrently.
        #[arg(long, default_value_t = 3, allow_negative_numbers = true, value_parser = at_least_one)]
        sessions: u64,
        /// Turns per session.
        #[arg(long, default_value_t = 40, allow_negative_numbers = true, value_parser = at_least_one)]
        turns: u64,
        /// Threshold: a token count (4000), a fraction of the window (0.9), or off.
        #[arg(long, default_value = "4000")]
        compact_at: String,
        /// Seed of the script.
        #[arg(long, default_value_t = 42, allow_negative_numbers = true, value_parser = whole)]
        seed: u64,
        /// Simulated model latency, ms.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole)]
        model_latency: u64,
        /// Simulated summariser latency, ms.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole)]
        summary_latency: u64,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Print a line per turn even when stdout is not a terminal.
        #[arg(long)]
        progress: bool,
    },
    /// List sessions, or show one session's turns and compactions.
    #[command(
        after_help = "Examples:\n  abridge inspect --db abridge-demo.db\n  abridge inspect --db abridge-demo.db demo-42-0 --json"
    )]
    Inspect {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Session id or external id.
        session: Option<String>,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Rebuild an executed step's messages and compare with the recorded hash.
    #[command(
        after_help = "Examples:\n  abridge replay --db abridge-demo.db --step 12\n  abridge replay --db abridge-demo.db --step 12 --raw | sha256sum"
    )]
    Replay {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Step id.
        #[arg(long, allow_negative_numbers = true, value_parser = row_id)]
        step: i64,
        /// Print exactly the hashed bytes, nothing else.
        #[arg(long)]
        raw: bool,
    },
    /// Compact a session now (manual), from outside any running host.
    #[command(
        after_help = "Example:\n  abridge compact --db abridge-demo.db --session demo-42-0 --focus \"order numbers\""
    )]
    Compact {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Session id or external id.
        #[arg(long)]
        session: String,
        /// What the summary should give priority to.
        #[arg(long)]
        focus: Option<String>,
        /// Most recent turns kept verbatim.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole_u32)]
        keep_last_turns: u32,
    },
    /// Print a session's full, uncompacted transcript with compaction points marked.
    #[command(
        after_help = "Example:\n  abridge export --db abridge-demo.db --session demo-42-0 --format jsonl"
    )]
    Export {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// Session id or external id.
        #[arg(long)]
        session: String,
        /// markdown or jsonl.
        #[arg(long, default_value = "markdown")]
        format: String,
    },
    /// Kill, freeze and race worker processes on one database; check nothing is lost.
    #[cfg(unix)]
    #[command(
        after_help = "Examples:\n  abridge chaos --db chaos.db --workers 4 --kills 200 --seed 1\n  abridge chaos --db enum.db --enumerate --sessions 2 --turns 4\n\n\
        Exit status 0 only when every guarantee holds and every session matches the control run."
    )]
    Chaos {
        /// Database file (replaced).
        #[arg(long, default_value = "abridge-chaos.db")]
        db: PathBuf,
        /// Worker processes.
        #[arg(long, default_value_t = 4, allow_negative_numbers = true, value_parser = at_least_one)]
        workers: u64,
        /// Kills to land before the run may end.
        #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = whole)]
        kills: u64,
        /// Seed of the workload and the faults.
        #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = whole)]
        seed: u64,
        /// Sessions per epoch.
        #[arg(long, default_value_t = 12, allow_negative_numbers = true, value_parser = at_least_one)]
        sessions: u64,
        /// Turns per session.
        #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = at_least_one)]
        turns: u64,
        /// Self-kill probability per fault point reached.
        #[arg(long, default_value_t = 0.01, allow_negative_numbers = true, value_parser = probability)]
        point_kill_p: f64,
        /// Compaction threshold, tokens (low, so most turns compact).
        #[arg(long, default_value_t = 1200, allow_negative_numbers = true, value_parser = at_least_one)]
        compact_at: u64,
        /// Kill at point 1, 2, 3, … of the workload in turn, until none is left.
        #[arg(long)]
        enumerate: bool,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 1800, allow_negative_numbers = true, value_parser = at_least_one)]
        max_seconds: u64,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// (internal) One chaos worker process.
    #[cfg(unix)]
    #[command(hide = true)]
    ChaosWorker {
        #[arg(long)]
        db: PathBuf,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        sessions: u64,
        #[arg(long)]
        turns: u64,
        #[arg(long)]
        epochs: u64,
        #[arg(long)]
        worker: u64,
        #[arg(long)]
        compact_at: u64,
    },
    /// (internal) Holds the write lock now and then.
    #[cfg(unix)]
    #[command(hide = true)]
    ChaosLocker {
        #[arg(long)]
        db: PathBuf,
        #[arg(long)]
        seed: u64,
    },
    /// Check guarantees G1-G7 on a whole database; exit 0 only when all hold.
    #[command(after_help = "Example:\n  abridge verify --db abridge-demo.db --json")]
    Verify {
        /// Database file.
        #[arg(long)]
        db: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// A count that must be at least 1 (`--turns`, `--sessions`, `--workers`).
fn at_least_one(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a whole number of at least 1".to_string()),
    }
}

/// A count or duration that may be 0 but not negative.
fn whole(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| "expected a whole number (0 or more)".into())
}

/// [`whole`], as a `u32`.
fn whole_u32(s: &str) -> Result<u32, String> {
    whole(s)?
        .try_into()
        .map_err(|_| "expected a whole number below 2^32".into())
}

/// A row id (`--step`): at least 1.
fn row_id(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("expected a row id (a whole number of at least 1)".into()),
    }
}

/// A probability in [0, 1].
fn probability(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err("expected a number from 0 to 1".into()),
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "error",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour codes only on a terminal: a log piped to a file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

fn main() -> ExitCode {
    // `abridge export … | head -1`: a closed pipe ends the process quietly, as
    // it does any Unix filter, instead of a panic from println!.
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default before any thread
    // starts; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // One line, like every other error; --help has the rest.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "abridge: error: {} (see --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    init_tracing(cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("abridge: error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(cli.cmd)) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("abridge: error: {f}");
            ExitCode::FAILURE
        }
    }
}

/// An error of a verb, with the session as the user typed it when the verb
/// was about one (errors never show a session by its row id alone).
struct Failure {
    session: Option<String>,
    error: Error,
}

impl Failure {
    fn session(typed: &str, error: Error) -> Failure {
        Failure {
            session: Some(typed.to_string()),
            error,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure {
            session: None,
            error,
        }
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Failure {
        Error::from(e).into()
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Error::from(e).into()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.session, &self.error) {
            // These name the key as typed already.
            (_, Error::UnknownSession(_) | Error::AmbiguousSession { .. }) | (None, _) => {
                write!(f, "{}", self.error)
            }
            (Some(s), e) => write!(f, "session {s}: {e}"),
        }
    }
}

/// `s` padded with spaces to `width` columns of a terminal (wide characters
/// take two columns, combining marks none).
fn pad(s: &str, width: usize) -> String {
    let w = unicode_width::UnicodeWidthStr::width(s);
    format!("{s}{}", " ".repeat(width.saturating_sub(w)))
}

fn print_sessions(all: &[inspect::SessionSummary]) {
    println!(
        "{:>4}  {} {} {:>6} {:>6} {:>6} {:>11} {:>9}",
        "id",
        pad("external id", 20),
        pad("model", 20),
        "turns",
        "steps",
        "tools",
        "compactions",
        "context"
    );
    for s in all {
        println!(
            "{:>4}  {} {} {:>6} {:>6} {:>6} {:>11} {:>9}",
            s.session.id,
            pad(&s.session.external_id, 20),
            pad(&s.session.model, 20),
            s.counts.turns,
            s.counts.steps,
            s.counts.tool_calls,
            s.counts.compactions_completed,
            s.counts
                .context_tokens
                .map_or("-".into(), |t| t.to_string())
        );
    }
}

fn print_session(d: &inspect::SessionDetail) {
    let s = &d.summary.session;
    println!("session {} (id {}), model {}", s.external_id, s.id, s.model);
    println!("\nturns:");
    println!(
        "  {:>4}  {} {:<13}  input",
        "turn",
        pad("status", 9),
        "step ids"
    );
    for t in &d.turns {
        let ids = match t.step_ids.as_slice() {
            [] => "-".to_string(),
            [one] => one.to_string(),
            [first, .., last] if last.0 - first.0 + 1 == t.step_ids.len() as i64 => {
                format!("{first}-{last}")
            }
            many => many
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        };
        println!(
            "  {:>4}  {} {:<13}  {}",
            t.turn.idx,
            pad(&t.turn.status.to_string(), 9),
            ids,
            abridge::compaction::truncate_chars(&t.turn.input.replace('\n', " "), 60)
        );
    }
    println!("\ncompactions:");
    for c in &d.compactions {
        println!(
            "  up to turn {:>4}  {} attempts {} trigger {} tokens {} -> {}  {}",
            c.up_to_turn_index,
            pad(&c.status.to_string(), 9),
            c.attempts,
            pad(&c.trigger, 6),
            c.tokens_before.map_or("-".into(), |t| t.to_string()),
            c.tokens_after.map_or("-".into(), |t| t.to_string()),
            abridge::compaction::truncate_chars(
                &c.summary.clone().unwrap_or_default().replace('\n', " "),
                60
            )
        );
    }
}

fn must_exist(db: &Path) -> abridge::Result<()> {
    abridge::store::check_path(db)?;
    if db.exists() {
        Ok(())
    } else {
        Err(Error::NotFound { path: db.into() })
    }
}

fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn run(cmd: Cmd) -> Result<ExitCode, Failure> {
    match cmd {
        Cmd::Demo {
            db,
            sessions,
            turns,
            compact_at,
            seed,
            model_latency,
            summary_latency,
            json,
            progress,
        } => {
            let opts = DemoOptions {
                db,
                sessions,
                turns,
                compact_at: Threshold::parse(&compact_at)?,
                seed,
                model_latency: Duration::from_millis(model_latency),
                summary_latency: Duration::from_millis(summary_latency),
                owner: None,
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
            .await?;
            if json {
                print_json(&report);
            } else {
                print_demo_table(&report);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Inspect { db, session, json } => {
            match session {
                None => {
                    let all = abridge::store::read_only(&db, inspect::sessions)?;
                    if json {
                        print_json(&all);
                    } else {
                        print_sessions(&all);
                    }
                }
                Some(key) => {
                    let d = abridge::store::read_only(&db, |c| inspect::session_detail(c, &key))
                        .map_err(|e| Failure::session(&key, e))?;
                    if json {
                        print_json(&d);
                    } else {
                        print_session(&d);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Replay { db, step, raw } => {
            let r = abridge::store::read_only(&db, |c| {
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
            println!("{}", if r.matches() { "match" } else { "MISMATCH" });
            Ok(if r.matches() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Compact {
            db,
            session,
            focus,
            keep_last_turns,
        } => {
            must_exist(&db)?;
            let store = abridge::Store::open(&db)?;
            let key = session.clone();
            let s = store
                .call(move |c| inspect::resolve_session(c, &key))
                .await?;
            let typed = session.clone();
            let mut cfg = abridge::RunnerConfig::default()
                .with_owner(abridge::owner::process_owner("abridge-compact"));
            cfg.compaction.keep_last_turns = keep_last_turns;
            let runner = abridge::Runner::builder(store, std::sync::Arc::new(NoModel))
                .config(cfg)
                .build()?;
            let row = runner
                .compact_now(s.id, focus)
                .await
                .map_err(|e| Failure::session(&typed, e))?;
            println!(
                "compaction {} of session {} up to turn {}: {} (tokens {} -> {})",
                row.id,
                s.external_id,
                row.up_to_turn_index,
                row.status,
                row.tokens_before.unwrap_or(0),
                row.tokens_after.unwrap_or(0)
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Export {
            db,
            session,
            format,
        } => {
            let format = match format.as_str() {
                "markdown" | "md" => ExportFormat::Markdown,
                "jsonl" => ExportFormat::Jsonl,
                other => {
                    return Err(Error::Config(format!(
                        "unknown format {other:?}: use markdown or jsonl"
                    ))
                    .into())
                }
            };
            let text = abridge::store::read_only(&db, |c| inspect::export(c, &session, format))
                .map_err(|e| Failure::session(&session, e))?;
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(unix)]
        Cmd::Chaos {
            db,
            workers,
            kills,
            seed,
            sessions,
            turns,
            point_kill_p,
            compact_at,
            enumerate,
            max_seconds,
            json,
        } => {
            let opts = abridge::chaos::ChaosOptions {
                db,
                workers,
                kills,
                seed,
                sessions,
                turns,
                point_kill_p,
                compact_at,
                max_duration: Duration::from_secs(max_seconds),
                exe: None,
                ..Default::default()
            };
            let report = if enumerate {
                abridge::chaos::run_enumerate(&opts).await?
            } else {
                abridge::chaos::run_chaos(&opts).await?
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
        #[cfg(unix)]
        Cmd::ChaosWorker {
            db,
            seed,
            sessions,
            turns,
            epochs,
            worker,
            compact_at,
        } => {
            let w = abridge::chaos::Workload {
                seed,
                sessions,
                turns,
                epochs,
                compact_at,
            };
            abridge::chaos::worker_main(&db, &w, worker).await?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(unix)]
        Cmd::ChaosLocker { db, seed } => {
            tokio::task::spawn_blocking(move || abridge::chaos::locker_main(&db, seed))
                .await
                .map_err(|e| Error::Task(e.to_string()))??;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Verify { db, json } => {
            let report = abridge::store::read_only(&db, |c| {
                abridge::verify::verify_with(c, &[&abridge::store::demo::DemoEffects])
            })?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                for c in &report.checks {
                    println!(
                        "{:<4} {:<40} checked {:>7}  violations {}",
                        if c.ok { "ok" } else { "FAIL" },
                        c.name,
                        c.checked,
                        c.violations.len()
                    );
                    for v in c.violations.iter().take(20) {
                        println!("       - {v}");
                    }
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
    }
}

fn print_demo_table(r: &abridge::demo::DemoReport) {
    println!("\nabridge demo: {}", r.db);
    println!("  sessions               {}", r.sessions);
    println!(
        "  turns                  {} ({} failed)",
        r.turns, r.turns_failed
    );
    println!("  steps                  {}", r.steps);
    println!("  tool calls             {}", r.tool_calls);
    println!(
        "  compactions            {} completed, {} failed",
        r.compactions_completed, r.compactions_failed
    );
    println!("  wall time              {:.2} s", r.wall_seconds);
    if !r.compactions.is_empty() {
        println!(
            "\n  {:<16} {:>10} {:>10} {:>14} {:>13}",
            "session", "up to turn", "status", "tokens before", "tokens after"
        );
        for c in &r.compactions {
            println!(
                "  {:<16} {:>10} {:>10} {:>14} {:>13}",
                c.session,
                c.up_to_turn,
                c.status,
                c.tokens_before.map_or("-".into(), |t| t.to_string()),
                c.tokens_after.map_or("-".into(), |t| t.to_string())
            );
        }
    }
}

#[cfg(unix)]
fn print_chaos(r: &abridge::chaos::ChaosReport) {
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
    println!("  compactions            {}", r.compactions);
    println!(
        "  at-most-once unknown   {} session(s)",
        r.at_most_once_unknown_sessions
    );
    println!("  violations             {}", r.violations.len());
    for v in r.violations.iter().take(30) {
        println!("    - {v}");
    }
}

/// The model of `abridge compact`: it never runs a step, only summarises
/// (with the offline summariser).
struct NoModel;

#[async_trait::async_trait]
impl abridge::ModelClient for NoModel {
    async fn complete(
        &self,
        _: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        Err(abridge::ModelError::Permanent(
            "abridge compact runs no model steps".into(),
        ))
    }
}
