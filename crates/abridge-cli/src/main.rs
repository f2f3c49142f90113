//! The `abridge` command: run the demo, look inside a store, verify it, and run
//! the chaos harness. One file per verb; each holds its arguments and its run.

mod verbs;

#[cfg(unix)]
use verbs::chaos;
use verbs::{
    approve, args, chat, common, compact, demo, erase, export, fork, inspect, migrate, rekey,
    replay, report, serve, upgrade, verify,
};

use clap::{Parser, Subcommand};
use common::Failure;
use std::process::ExitCode;

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
    /// Talk to a real model in one durable session: one turn, or interactively.
    #[command(
        after_help = "Examples:\n  abridge chat --session notes --provider openai --model gpt-4o-mini \"What did we decide?\"\n  \
        OPENAI_BASE_URL=http://127.0.0.1:8080/v1 abridge chat --session local --provider openai --model llama3\n  \
        abridge chat --db team.db --session s1 --provider anthropic --model claude-sonnet-4-5 --compact-at 0.7\n\n\
        Keys and endpoints from OPENAI_API_KEY, OPENAI_BASE_URL, ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL. \
        Interactive commands: /context, /compact [focus], /quit. A chat killed mid-answer is finished by the session's next chat."
    )]
    Chat(chat::Args),
    /// Run scripted customer-support sessions on an embedded store and watch them compact.
    #[command(
        after_help = "Example:\n  abridge demo --sessions 3 --turns 40 --compact-at 4000\n\n\
        Killed (Ctrl-C, kill -9) and run again with the same arguments, it resumes where it stopped."
    )]
    Demo(demo::Args),
    /// List sessions, or show one session's turns and compactions.
    #[command(
        after_help = "Examples:\n  abridge inspect --db abridge-demo.db\n  abridge inspect --db abridge-demo.db demo-42-0 --json"
    )]
    Inspect(inspect::Args),
    /// Branch a session at one of its turns, keeping the original.
    #[command(
        after_help = "Examples:\n  abridge fork --db agent.db --session user-42 --at-turn 11 --as user-42-retry\n  \
        abridge chat --db agent.db --session user-42-retry --provider openai --model gpt-4o-mini \"Try it another way\"\n\n\
        The fork reads the session's turns up to the fork point where they are (nothing is copied) \
        and continues with its own; the session is unchanged. Rewinding turn N is a fork at N - 1."
    )]
    Fork(fork::Args),
    /// Rebuild an executed step's messages and compare with the recorded hash.
    #[command(
        after_help = "Examples:\n  abridge replay --db abridge-demo.db --step 12\n  abridge replay --db abridge-demo.db --step 12 --raw | sha256sum"
    )]
    Replay(replay::Args),
    /// Compact a session now (manual), from outside any running host.
    #[command(
        after_help = "Examples:\n  abridge compact --db abridge-demo.db --session demo-42-0 --focus \"order numbers\"\n  \
                      abridge compact --db agent.db --session user-42 --summary-provider anthropic --summary-model claude-haiku-4-5"
    )]
    Compact(compact::Args),
    /// Print a session's full, uncompacted transcript with compaction points marked.
    #[command(
        after_help = "Example:\n  abridge export --db abridge-demo.db --session demo-42-0 --format jsonl"
    )]
    Export(export::Args),
    /// Kill, freeze and race worker processes on one database; check nothing is lost.
    #[cfg(unix)]
    #[command(
        after_help = "Examples:\n  abridge chaos --db chaos.db --workers 4 --kills 200 --seed 1\n  abridge chaos --db enum.db --enumerate --sessions 2 --turns 4\n\n\
        Exit status 0 only when every guarantee holds and every session matches the control run."
    )]
    Chaos(chaos::Args),
    /// (internal) One chaos worker process.
    #[cfg(unix)]
    #[command(hide = true)]
    ChaosWorker(chaos::WorkerArgs),
    /// (internal) Holds the write lock now and then.
    #[cfg(unix)]
    #[command(hide = true)]
    ChaosLocker(chaos::LockerArgs),
    /// Delete a session whole, its text overwritten in the file.
    #[command(
        after_help = "Example:\n  abridge delete --db agent.db --session user-42 --vacuum\n\n        Every row of the session goes in one transaction; a host still running it is refused at its next write."
    )]
    Delete(erase::DeleteArgs),
    /// Delete the sessions idle for longer than an age.
    #[command(
        after_help = "Examples:\n  abridge prune --db agent.db --idle-for 30d --dry-run\n  abridge prune --db agent.db --idle-for 30d --vacuum"
    )]
    Prune(erase::PruneArgs),
    /// Replace a secret wherever a session stores it by the marker [redacted].
    #[command(
        after_help = "Examples:\n  abridge redact --db agent.db --session user-42 --text 'sk-live-51Hx...'\n  \
        abridge redact --db agent.db --session user-42 --regex 'sk-live-[A-Za-z0-9]+'\n  \
        printf '%s\\n' \"$SECRET\" | abridge redact --db agent.db --session user-42 --text -\n\n\
        One transaction, the old bytes overwritten; recorded, so verify and replay report the steps it changed as redacted."
    )]
    Redact(erase::RedactArgs),
    /// Copy a store under a new key (encrypt, change the key, or decrypt).
    #[command(
        after_help = "Examples:\n  ABRIDGE_NEW_KEY=... abridge rekey --db plain.db --to encrypted.db\n  \
        ABRIDGE_KEY=old ABRIDGE_NEW_KEY=new abridge rekey --db encrypted.db --to rekeyed.db\n\n\
        Needs a build with the encryption feature. The source is only read; the copy is a new file."
    )]
    Rekey(rekey::Args),
    /// Move an SQLite store to a PostgreSQL server, every row with its id.
    #[command(
        after_help = "Example:\n  abridge migrate --from agent.db --to postgres://postgres@127.0.0.1/agents?schema=team_a\n\n\
        One transaction on the server; every executed step is rebuilt there to the bytes it rebuilds to from the file before it commits. The file is only read."
    )]
    Migrate(migrate::Args),
    /// Draw a session (or the whole store) as a self-contained HTML page.
    #[command(
        after_help = "Examples:\n  abridge report --db abridge-demo.db --session demo-42-0 --compact-at 4000 --soft-share 0.8 -o session.html\n  abridge report --db abridge-demo.db -o report.html"
    )]
    Report(report::Args),
    /// Finish a store's pending compactions (background compaction served by
    /// another process, or summaries left by a crash).
    #[command(
        after_help = "Examples:\n  abridge serve --db host.db\n  abridge serve --db host.db --watch --poll-ms 200\n  \
                      abridge serve --db host.db --watch --summary-provider openai --summary-model gpt-4o-mini\n\n\
        Exit status 0 when every pending compaction it took was completed."
    )]
    Serve(serve::Args),
    /// List the tool calls that wait for a decision or a delivered result.
    #[command(
        after_help = "Examples:\n  abridge pending --db agent.db\n  abridge pending --db agent.db --session user-42 --json"
    )]
    Pending(approve::PendingArgs),
    /// Approve a waiting tool call (optionally with edited arguments), once.
    #[command(
        after_help = "Examples:\n  abridge approve --db agent.db --call 7\n  abridge approve --db agent.db --call 7 --input '{\"amount\": 50}' --by alice\n\n\
        The first decision for a call wins; another is refused naming it. The turn goes on when its host resumes it."
    )]
    Approve(approve::ApproveArgs),
    /// Reject a waiting tool call: the model sees the reason as its result.
    #[command(
        after_help = "Example:\n  abridge reject --db agent.db --call 7 --reason \"refunds above 100 EUR need a manager\""
    )]
    Reject(approve::RejectArgs),
    /// Deliver the result of a deferred tool's call, once.
    #[command(
        after_help = "Examples:\n  abridge deliver --db agent.db --call 9 --result 'report ready: https://...'\n  job-output | abridge deliver --db agent.db --call 9 --result -"
    )]
    Deliver(approve::DeliverArgs),
    /// Check guarantees G1-G8 on a whole database; exit 0 only when all hold.
    #[command(after_help = "Example:\n  abridge verify --db abridge-demo.db --json")]
    Verify(verify::Args),
    /// Migrate a store written by an older abridge to this build's schema.
    #[command(
        after_help = "Examples:\n  abridge upgrade --db agent.db\n  abridge upgrade --db postgres://postgres@127.0.0.1/agents?schema=team_a\n\n\
        A file or a PostgreSQL store is upgraded in one transaction; the store opens as it was if any step fails."
    )]
    Upgrade(upgrade::Args),
}

async fn run(cmd: Cmd) -> Result<ExitCode, Failure> {
    match cmd {
        Cmd::Chat(a) => chat::run(a).await,
        Cmd::Demo(a) => demo::run(a).await,
        Cmd::Inspect(a) => inspect::run(a).await,
        Cmd::Fork(a) => fork::run(a).await,
        Cmd::Replay(a) => replay::run(a).await,
        Cmd::Compact(a) => compact::run(a).await,
        Cmd::Export(a) => export::run(a).await,
        #[cfg(unix)]
        Cmd::Chaos(a) => chaos::run(a).await,
        #[cfg(unix)]
        Cmd::ChaosWorker(a) => chaos::worker(a).await,
        #[cfg(unix)]
        Cmd::ChaosLocker(a) => chaos::locker(a).await,
        Cmd::Report(a) => report::run(a).await,
        Cmd::Delete(a) => erase::delete(a).await,
        Cmd::Prune(a) => erase::prune(a).await,
        Cmd::Redact(a) => erase::redact(a).await,
        Cmd::Rekey(a) => rekey::run(a).await,
        Cmd::Migrate(a) => migrate::run(a).await,
        Cmd::Serve(a) => serve::run(a).await,
        Cmd::Verify(a) => verify::run(a).await,
        Cmd::Pending(a) => approve::pending(a).await,
        Cmd::Approve(a) => approve::approve(a).await,
        Cmd::Reject(a) => approve::reject(a).await,
        Cmd::Deliver(a) => approve::deliver(a).await,
        Cmd::Upgrade(a) => upgrade::run(a).await,
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "error",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // The PostgreSQL client's debug lines print statement parameters
        // (a conversation's text): warnings only, unless RUST_LOG says more.
        .unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(format!("{default},tokio_postgres=warn"))
        });
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
            // One line, like every other error; --help has the rest. What
            // clap says before its usage (the first line, and for a missing
            // argument the lines naming it) is kept.
            let text = e.to_string();
            let said: Vec<&str> = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                .collect();
            let said = match said.join(" ") {
                s if s.is_empty() => "invalid arguments".to_string(),
                s => s,
            };
            eprintln!(
                "abridge: error: {} (see --help)",
                said.trim_start_matches("error: ")
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
            f.exit_code()
        }
    }
}
