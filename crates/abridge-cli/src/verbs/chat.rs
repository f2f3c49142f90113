//! `abridge chat`: a real model from the terminal, one durable session.
//!
//! With a message: one turn of the session (created on first use), the
//! answer alone on stdout, notes on stderr. Without: an interactive session
//! (`/compact [focus]`, `/context`, `/quit`). Every turn is a runner's turn,
//! numbered by the session's own count: a `chat` killed mid-turn leaves the
//! turn running, and the next `chat` of the session finishes that same turn
//! (once) before it takes a new message. Ctrl-C during an answer drops the
//! request: the turn stays resumable, nothing of it half-written.
//!
//! With `--stream on` (the default when stdout is a terminal) the answer's
//! text is printed as it arrives; what is stored is the same either way. On a
//! terminal the interactive session reads lines with editing and history
//! (`rustyline`; the history is kept beside the store, in `DB.history`).

pub use crate::common::Provider;
use crate::common::{open_store, provider_client, Failure};
use abridge::store::{Location, TurnStatus};
use abridge::{CompactionConfig, ModelSummariser, Runner, SessionId, Threshold, TurnOutcome};
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

/// Whether the answer streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stream {
    /// Print the answer's text as it arrives.
    On,
    /// Print the answer once it is whole.
    Off,
}

/// Arguments of `abridge chat`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file or PostgreSQL URL (created if missing).
    #[arg(long, default_value = "abridge-chat.db")]
    pub db: Location,
    /// The session, by the name you give it (created on first use).
    #[arg(long)]
    pub session: String,
    /// Which API the model is behind.
    #[arg(long, value_enum)]
    pub provider: Provider,
    /// The model, as the provider names it.
    #[arg(long)]
    pub model: String,
    /// Threshold: a token count (4000), a fraction of the model's window
    /// (0.8), or off. Default: 0.8 of the window the built-in table knows for
    /// the model, else 100000 tokens.
    #[arg(long)]
    pub compact_at: Option<String>,
    /// The system prompt of a new session (an existing one keeps its own).
    #[arg(long)]
    pub system: Option<String>,
    /// The model that writes the summaries (default: the chat's own).
    #[arg(long)]
    pub summary_model: Option<String>,
    /// Print the answer as it arrives (on) or once whole (off). Default: on
    /// when stdout is a terminal.
    #[arg(long, value_enum)]
    pub stream: Option<Stream>,
    /// An MCP server run as this command line (split as a shell splits
    /// words), whose tools the chat offers the model; repeatable.
    #[arg(long = "mcp", value_name = "COMMAND")]
    pub mcp: Vec<String>,
    /// An MCP server at this URL, over streamable HTTP; repeatable.
    #[arg(long = "mcp-url", value_name = "URL")]
    pub mcp_url: Vec<String>,
    /// A header sent to every `--mcp-url` server (`Name: value`, e.g.
    /// `Authorization: Bearer …`); repeatable.
    #[arg(long = "mcp-header", value_name = "HEADER")]
    pub mcp_header: Vec<String>,
    /// The effect mode of one MCP tool: `TOOL=idempotent` or
    /// `TOOL=at-most-once` (the default for every MCP tool); repeatable.
    #[arg(long = "mcp-effect", value_name = "TOOL=MODE")]
    pub mcp_effect: Vec<String>,
    /// Follow the MCP servers' tool annotations: a tool marked read-only or
    /// idempotent is idempotent (sent again after a crash, with the same
    /// idempotency key).
    #[arg(long = "mcp-trust-annotations")]
    pub mcp_trust_annotations: bool,
    /// One message: run one turn and print the answer. Without it, an
    /// interactive session.
    pub message: Option<String>,
}

const DEFAULT_SYSTEM: &str = "You are a helpful assistant.";

/// The threshold when `--compact-at` is not given and the window is unknown.
const FALLBACK_COMPACT_AT: u64 = 100_000;

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let client = provider_client(args.provider)?;
    let window = abridge::compaction::builtin_context_window(&args.model);
    let compact_at = match &args.compact_at {
        Some(s) => match Threshold::parse(s)? {
            Threshold::Fraction(f) if window.is_none() => {
                return Err(Failure::usage(format!(
                    "--compact-at {f} is a share of the model's window, and the built-in table \
                     does not know {}'s: give a token count (--compact-at 6000)",
                    args.model
                )))
            }
            t => t,
        },
        None if window.is_some() => Threshold::Fraction(0.8),
        None => Threshold::Tokens(FALLBACK_COMPACT_AT),
    };
    let summary_model = args.summary_model.clone().unwrap_or(args.model.clone());
    let stream = match args.stream {
        Some(s) => s == Stream::On,
        None => std::io::stdout().is_terminal(),
    };
    let tools = mcp_tools(&args).await?;
    let exporting = crate::verbs::otlp::from_env()?;
    let store = open_store(&args.db)?;
    #[allow(unused_mut)]
    let mut builder = Runner::builder(store, client.clone())
        .tools(tools)
        .stream(stream)
        .summariser(ModelSummariser::new(client, summary_model))
        .compaction(CompactionConfig::default().with_compact_at(compact_at));
    #[cfg(feature = "otel")]
    if let Some((telemetry, _)) = &exporting {
        builder = builder.telemetry(telemetry.clone());
    }
    let runner = builder.build()?;
    let result = converse(runner, &args, stream).await;
    if let Some((_, exporting)) = exporting {
        exporting.finish();
    }
    result
}

/// The chat's turns, on a built runner.
async fn converse(runner: Runner, args: &Args, stream: bool) -> Result<ExitCode, Failure> {
    let session = match runner.session(args.session.as_str()).await {
        Ok(s) => s,
        Err(abridge::Error::UnknownSession(_)) => {
            let system = args.system.as_deref().unwrap_or(DEFAULT_SYSTEM);
            runner
                .create_session(&args.session, &args.model, system)
                .await?
        }
        Err(e) => return Err(Failure::session(&args.session, e)),
    };
    if session.model != args.model {
        eprintln!(
            "note: session {} runs on {}; --model {} is used for its new turns' requests only as its model name",
            args.session, session.model, args.model
        );
    }
    let chat = Chat {
        runner,
        session: session.id,
        name: args.session.clone(),
        model: session.model.clone(),
        stream,
        history: history_path(&args.db),
    };
    chat.finish_interrupted().await?;
    let code = match &args.message {
        Some(message) => {
            chat.say(message).await?;
            ExitCode::SUCCESS
        }
        None => chat.interactive().await?,
    };
    // Summaries started in the background are finished before the exit
    // (a kill leaves them pending: the next chat finishes them).
    chat.runner.finish_background().await;
    Ok(code)
}

/// The tools of the `--mcp` and `--mcp-url` servers.
#[cfg(feature = "mcp")]
async fn mcp_tools(args: &Args) -> Result<abridge::Tools, Failure> {
    use abridge::mcp::{McpEffects, McpServer, McpTransport};
    use abridge::store::Effect;
    let mut effects = McpEffects::new();
    if args.mcp_trust_annotations {
        effects = effects.trust_annotations();
    }
    let mut per_tool = Vec::new();
    for e in &args.mcp_effect {
        let (tool, mode) = e.split_once('=').ok_or_else(|| {
            Failure::usage(format!(
                "--mcp-effect {e:?}: give TOOL=idempotent or TOOL=at-most-once"
            ))
        })?;
        let mode = match mode {
            "idempotent" => Effect::Idempotent,
            "at-most-once" | "at_most_once" => Effect::AtMostOnce,
            other => {
                return Err(Failure::usage(format!(
                    "--mcp-effect {tool}={other}: the mode is idempotent or at-most-once"
                )))
            }
        };
        per_tool.push((tool.to_string(), mode));
    }
    let mut headers = Vec::new();
    for h in &args.mcp_header {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| Failure::usage(format!("--mcp-header {h:?}: give Name: value")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut transports = Vec::new();
    for line in &args.mcp {
        transports
            .push(McpTransport::command_line(line).map_err(|e| Failure::usage(e.to_string()))?);
    }
    for url in &args.mcp_url {
        transports.push(McpTransport::Http {
            url: url.clone(),
            headers: headers.clone(),
        });
    }
    let mut tools = abridge::Tools::new();
    for transport in transports {
        let server = McpServer::connect(transport)
            .await
            .map_err(|e| Failure::runtime(e.to_string()))?;
        // Each server gets the modes named for its own tools.
        let mut mine = effects.clone();
        for (tool, mode) in &per_tool {
            if server.tools().iter().any(|t| &t.name == tool) {
                mine = mine.tool(tool.clone(), *mode);
            }
        }
        tools = server
            .register(tools, &mine)
            .map_err(|e| Failure::runtime(e.to_string()))?;
        eprintln!(
            "note: {} tools from the MCP server {}",
            server.tools().len(),
            server.label()
        );
    }
    for (tool, _) in &per_tool {
        if !tools.specs().iter().any(|s| &s.name == tool) {
            return Err(Failure::usage(format!(
                "--mcp-effect names {tool:?}, which no MCP server has"
            )));
        }
    }
    Ok(tools)
}

/// Without the `mcp` feature: no MCP server can be given.
#[cfg(not(feature = "mcp"))]
async fn mcp_tools(args: &Args) -> Result<abridge::Tools, Failure> {
    if args.mcp.is_empty() && args.mcp_url.is_empty() {
        return Ok(abridge::Tools::new());
    }
    Err(Failure::usage(
        "this abridge was built without the `mcp` feature: --mcp and --mcp-url need it",
    ))
}

/// What a streaming turn printed.
#[derive(Default)]
struct Shown {
    /// Some of the answer's text was printed.
    any: bool,
    /// The step and attempt the last piece belonged to.
    at: Option<(abridge::StepId, u32)>,
}

impl Shown {
    /// Prints a piece of this session's answer text on stdout; a new attempt
    /// at a step (the stream was cut and the call tried again) starts on a
    /// line of its own, said on stderr.
    fn print(&mut self, session: SessionId, e: abridge::Event) {
        let abridge::EventKind::ModelDelta {
            step_id,
            attempt,
            delta: abridge::Delta::Text { text },
            ..
        } = e.kind
        else {
            return;
        };
        if e.subject.session_id != session {
            return;
        }
        if let Some((step, a)) = self.at {
            if step == step_id && a != attempt && self.any {
                println!();
                eprintln!("note: the answer was cut short; asking again");
            }
        }
        self.at = Some((step_id, attempt));
        print!("{text}");
        let _ = std::io::stdout().flush();
        self.any |= !text.is_empty();
    }
}

/// The next event of a subscription, if there is one; a subscriber that fell
/// behind skips what it missed.
async fn next_event(
    events: &mut Option<tokio::sync::broadcast::Receiver<abridge::Event>>,
) -> Option<abridge::Event> {
    let rx = events.as_mut()?;
    loop {
        match rx.recv().await {
            Ok(e) => return Some(e),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                std::future::pending::<()>().await
            }
        }
    }
}

/// Reads lines from the terminal with editing and history, one each time
/// `asked` says, until end of input or Ctrl-D; Ctrl-C at the prompt clears
/// the line.
fn read_edited_lines(
    asked: std::sync::mpsc::Receiver<()>,
    lines: tokio::sync::mpsc::Sender<String>,
    history: Option<std::path::PathBuf>,
) {
    use rustyline::error::ReadlineError;
    let Ok(mut editor) = rustyline::DefaultEditor::new() else {
        return;
    };
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    while asked.recv().is_ok() {
        let line = loop {
            match editor.readline("> ") {
                Ok(line) => break Some(line),
                Err(ReadlineError::Interrupted) => continue,
                Err(_) => break None,
            }
        };
        let Some(line) = line else { break };
        if !line.trim().is_empty() {
            let _ = editor.add_history_entry(line.as_str());
            if let Some(h) = &history {
                let _ = editor.append_history(h);
            }
        }
        if lines.blocking_send(line).is_err() {
            break;
        }
    }
}

/// Where an interactive session on a terminal keeps its line history: beside
/// the store's file (none for a server's store).
fn history_path(db: &Location) -> Option<std::path::PathBuf> {
    match db {
        Location::File(path) => {
            let mut name = path.file_name()?.to_os_string();
            name.push(".history");
            Some(path.with_file_name(name))
        }
        Location::Postgres(_) => None,
    }
}

struct Chat {
    runner: Runner,
    session: SessionId,
    name: String,
    model: String,
    /// The runner streams, and the answer's text is printed as it comes.
    stream: bool,
    history: Option<std::path::PathBuf>,
}

impl Chat {
    /// A turn a killed (or interrupted) chat left running is finished first:
    /// the same turn, once; its answer goes to stderr, marked.
    async fn finish_interrupted(&self) -> Result<(), Failure> {
        let turns = self.runner.store().turns(self.session).await?;
        for turn in turns.iter().filter(|t| t.status == TurnStatus::Running) {
            eprintln!(
                "note: finishing turn {} of session {}, left running",
                turn.idx, self.name
            );
            let outcome = self
                .runner
                .resume_turn(turn.id)
                .await
                .map_err(|e| Failure::session(&self.name, e))?;
            eprintln!("(turn {}) {}", turn.idx, outcome.output);
        }
        Ok(())
    }

    /// One turn and its answer on stdout: printed as it arrives when the
    /// chat streams, else once whole.
    async fn say(&self, input: &str) -> Result<TurnOutcome, Failure> {
        let mut shown = Shown::default();
        let outcome = self.turn(input, &mut shown).await?;
        if shown.any {
            println!();
        } else {
            println!("{}", outcome.output);
        }
        Ok(outcome)
    }

    /// One turn, numbered after the session's last: Ctrl-C stops the
    /// request and leaves the turn resumable. A streaming chat prints the
    /// answer's text as it arrives (`shown` says whether it printed any).
    async fn turn(&self, input: &str, shown: &mut Shown) -> Result<TurnOutcome, Failure> {
        let idx = self.runner.store().turns(self.session).await?.len() as i64;
        let mut events = self.stream.then(|| self.runner.subscribe());
        let run = self.runner.run_turn_at(self.session, idx, input);
        tokio::pin!(run);
        loop {
            tokio::select! {
                outcome = &mut run => {
                    // Pieces sent before the turn ended and not yet printed.
                    while let Some(Ok(e)) = events.as_mut().map(|r| r.try_recv()) {
                        shown.print(self.session, e);
                    }
                    return outcome.map_err(|e| Failure::session(&self.name, e));
                }
                Some(e) = next_event(&mut events) => shown.print(self.session, e),
                _ = tokio::signal::ctrl_c() => {
                    if shown.any {
                        println!();
                    }
                    return Err(Failure::interrupted(format!(
                        "interrupted: turn {idx} of session {} is left running; the next chat \
                         of the session finishes it",
                        self.name
                    )));
                }
            }
        }
    }

    /// Lines from stdin until `/quit` or its end; `/compact [focus]` and
    /// `/context` are the session's own.
    async fn interactive(&self) -> Result<ExitCode, Failure> {
        let terminal = std::io::stdin().is_terminal();
        if terminal {
            eprintln!(
                "session {} on {} ({}): /context, /compact [focus], /quit",
                self.name,
                self.model,
                self.runner.store().path().display()
            );
        }
        // Lines are read on a thread of their own, one when asked for: the
        // prompt comes back only once the answer before it is printed.
        let (lines, mut rx) = tokio::sync::mpsc::channel::<String>(1);
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let history = self.history.clone();
        std::thread::spawn(move || {
            if terminal {
                read_edited_lines(asked, lines, history)
            } else {
                let stdin = std::io::stdin();
                for line in stdin.lock().lines() {
                    let Ok(line) = line else { break };
                    if asked.recv().is_err() || lines.blocking_send(line).is_err() {
                        break;
                    }
                }
            }
        });
        loop {
            if ask.send(()).is_err() {
                break;
            }
            let Some(line) = rx.recv().await else { break };
            let line = line.trim();
            match line
                .split_once(' ')
                .map_or((line, ""), |(c, r)| (c, r.trim()))
            {
                ("", _) => continue,
                ("/quit" | "/exit", _) => break,
                ("/context", _) => self.context().await?,
                ("/compact", focus) => self.compact(focus).await?,
                (c, _) if c.starts_with('/') => {
                    eprintln!("unknown command {c}: /context, /compact [focus], /quit")
                }
                _ => {
                    if let Err(e) = self.say(line).await {
                        eprintln!("abridge: error: {e}");
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }

    /// `/context`: what the next step's context holds and where it stands.
    async fn context(&self) -> Result<(), Failure> {
        let name = self.name.clone();
        let detail = self
            .runner
            .store()
            .call(move |c| abridge::inspect::session_detail(c, &name))
            .await?;
        let counts = &detail.summary.counts;
        let config = &self.runner.config().compaction;
        let window = config.context_window(&self.model);
        let threshold = config.compact_at.tokens(window);
        let show = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
        println!(
            "tokens {}  window {}  threshold {}  turns {}  compactions {}  pins {}",
            counts
                .context_tokens
                .map_or("-".to_string(), |n| n.to_string()),
            show(window),
            show(threshold),
            counts.turns,
            counts.compactions_completed,
            detail.live_pins.len()
        );
        Ok(())
    }

    /// `/compact [focus]`: a manual compaction now, exactly once per boundary.
    async fn compact(&self, focus: &str) -> Result<(), Failure> {
        let focus = (!focus.is_empty()).then(|| focus.to_string());
        match self.runner.compact_now(self.session, focus).await {
            Ok(row) => println!(
                "compacted turns up to {} ({} -> {} tokens)",
                row.up_to_turn_index,
                row.tokens_before.unwrap_or_default(),
                row.tokens_after.unwrap_or_default()
            ),
            Err(e @ abridge::Error::NothingToCompact { .. }) => eprintln!("{e}"),
            Err(e) => return Err(Failure::session(&self.name, e)),
        }
        Ok(())
    }
}
