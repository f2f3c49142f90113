//! What every verb shares: the error type that names a session as typed,
//! and output helpers.

use abridge::store::Connection;
use abridge::store::Location;
use abridge::store::{Key, StoreOptions};
use abridge::{Error, Store};

/// An error of a verb: the engine's (with the session as the user typed it
/// when the verb was about one: errors never show a session by its row id
/// alone), or the command line's own, a usage error (arguments that do not
/// go together, a value out of range), which exits 2 as clap's do.
pub struct Failure {
    session: Option<String>,
    kind: Kind,
}

enum Kind {
    Engine(Error),
    Usage(String),
    Interrupted(String),
    /// Anything else that stops the verb (an MCP server that cannot be
    /// reached): said as is, exit status 1.
    #[cfg_attr(not(any(feature = "mcp", feature = "otel")), allow(dead_code))]
    Other(String),
}

impl Failure {
    pub fn session(typed: &str, error: Error) -> Failure {
        Failure {
            session: Some(typed.to_string()),
            kind: Kind::Engine(error),
        }
    }

    /// A usage error of the command line: said as is, exit status 2.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            session: None,
            kind: Kind::Usage(message.into()),
        }
    }

    /// Stopped by Ctrl-C (SIGINT): said as is, exit status 130.
    pub fn interrupted(message: impl Into<String>) -> Failure {
        Failure {
            session: None,
            kind: Kind::Interrupted(message.into()),
        }
    }

    /// A failure outside the engine (exit status 1), said as is.
    #[cfg_attr(not(any(feature = "mcp", feature = "otel")), allow(dead_code))]
    pub fn runtime(message: impl Into<String>) -> Failure {
        Failure {
            session: None,
            kind: Kind::Other(message.into()),
        }
    }

    /// The exit status: 2 for a usage error, 130 when interrupted, 1 for
    /// any other.
    pub fn exit_code(&self) -> std::process::ExitCode {
        match self.kind {
            Kind::Usage(_) => std::process::ExitCode::from(2),
            Kind::Interrupted(_) => std::process::ExitCode::from(130),
            Kind::Engine(_) | Kind::Other(_) => std::process::ExitCode::FAILURE,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure {
            session: None,
            kind: Kind::Engine(error),
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
        let error = match &self.kind {
            Kind::Usage(message) => return write!(f, "{message} (see --help)"),
            Kind::Interrupted(message) | Kind::Other(message) => return write!(f, "{message}"),
            Kind::Engine(e) => e,
        };
        match (&self.session, error) {
            // These name the key as typed already.
            (
                _,
                Error::UnknownSession(_)
                | Error::AmbiguousSession { .. }
                | Error::AlreadyCompacted { .. },
            )
            | (None, _) => {
                write!(f, "{error}")
            }
            (Some(s), e) => write!(f, "session {s}: {e}"),
        }
    }
}

/// Fails unless a database file is at `db` (a verb that must not create one);
/// for a PostgreSQL URL, unless its schema holds a store.
pub fn must_exist(db: &Location) -> abridge::Result<()> {
    let db = match db {
        Location::Postgres(_) => return abridge::store::read_only_version(db).map(|_| ()),
        Location::File(path) => path,
    };
    abridge::store::check_path(db)?;
    if db.exists() {
        Ok(())
    } else {
        Err(Error::NotFound { path: db.into() })
    }
}

pub fn print_json(v: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// The model of the verbs that only summarise (`compact`, `serve`, with the
/// offline summariser): they never run a step. Holds the verb's name.
pub struct NoModel(pub &'static str);

#[abridge::async_trait]
impl abridge::ModelClient for NoModel {
    async fn complete(
        &self,
        _: &abridge::ModelRequest,
    ) -> Result<abridge::ModelResponse, abridge::ModelError> {
        Err(abridge::ModelError::Permanent(format!(
            "abridge {} runs no model steps",
            self.0
        )))
    }
}

/// The provider a verb's model (or summariser) is behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// OpenAI's Chat Completions API (and the servers that speak it):
    /// `OPENAI_API_KEY`, `OPENAI_BASE_URL`.
    Openai,
    /// OpenAI's Responses API: `OPENAI_API_KEY`, `OPENAI_BASE_URL`.
    OpenaiResponses,
    /// Anthropic's Messages API: `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`.
    Anthropic,
}

/// The provider's client from its usual environment variables; a missing
/// key is one line naming the variable.
pub fn provider_client(
    provider: Provider,
) -> Result<std::sync::Arc<dyn abridge::ModelClient>, Failure> {
    use abridge::providers::{Anthropic, OpenAiChat, OpenAiResponses};
    Ok(match provider {
        Provider::Openai => std::sync::Arc::new(OpenAiChat::from_env()?),
        Provider::OpenaiResponses => std::sync::Arc::new(OpenAiResponses::from_env()?),
        Provider::Anthropic => std::sync::Arc::new(Anthropic::from_env()?),
    })
}

/// Who writes the summaries of a verb that only summarises (`compact`,
/// `serve`): the offline summariser, or a model behind a provider.
#[derive(clap::Args, Debug, Clone)]
pub struct SummariserArgs {
    /// Summarise with a model behind this provider (keys and endpoints from
    /// its usual variables). Default: the offline summariser.
    #[arg(long, value_enum, requires = "summary_model")]
    pub summary_provider: Option<Provider>,
    /// The model that writes the summaries (with --summary-provider).
    #[arg(long, requires = "summary_provider")]
    pub summary_model: Option<String>,
}

impl SummariserArgs {
    /// The summariser these arguments name; None: the offline one.
    pub fn summariser(&self) -> Result<Option<std::sync::Arc<dyn abridge::Summariser>>, Failure> {
        let (Some(provider), Some(model)) = (self.summary_provider, &self.summary_model) else {
            return Ok(None);
        };
        let client = provider_client(provider)?;
        Ok(Some(std::sync::Arc::new(abridge::ModelSummariser::new(
            client,
            model.clone(),
        ))))
    }
}

/// One line for a compaction a verb made or finished: `compaction ID of
/// session EXT up to turn B: STATUS (tokens A -> B, N pinned facts carried)`.
pub fn compaction_line(row: &abridge::store::CompactionRow, session: &str) -> String {
    format!(
        "compaction {} of session {} up to turn {}: {} (tokens {} -> {}, {} pinned facts carried)",
        row.id,
        session,
        row.up_to_turn_index,
        row.status,
        row.tokens_before.unwrap_or(0),
        row.tokens_after.unwrap_or(0),
        row.pins_live.unwrap_or(0),
    )
}

/// The environment variable holding an encrypted store's key.
pub const KEY_VAR: &str = "ABRIDGE_KEY";

/// The environment variable holding the key `abridge rekey` gives the copy.
pub const NEW_KEY_VAR: &str = "ABRIDGE_NEW_KEY";

/// The key of an encrypted store, from `ABRIDGE_KEY` (a passphrase, or
/// `x'` and 64 hex digits and `'` for a raw key); None when it is unset or
/// empty. Read from the environment, not a flag, so it is in neither the
/// shell's history nor the process list.
pub fn key() -> abridge::Result<Option<Key>> {
    key_from(KEY_VAR)
}

/// A key from the environment variable `var` (see [`key`]).
pub fn key_from(var: &str) -> abridge::Result<Option<Key>> {
    match std::env::var(var) {
        Ok(k) if !k.is_empty() => Ok(Some(Key::passphrase(k)?)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(Error::Config(format!("{KEY_VAR} is not valid UTF-8")))
        }
    }
}

/// Opens (creating if missing) the store at `db`, with the key of `ABRIDGE_KEY`.
pub fn open_store(db: &Location) -> abridge::Result<Store> {
    let opts = match key()? {
        Some(k) => StoreOptions::default().with_key(k),
        None => StoreOptions::default(),
    };
    Store::open_with(db, opts)
}

/// [`abridge::store::read_only`], with the key of `ABRIDGE_KEY`.
pub fn read_only<T>(
    db: &Location,
    read: impl FnMut(&Connection) -> abridge::Result<T>,
) -> abridge::Result<T> {
    abridge::store::read_only_keyed(db, key()?.as_ref(), read)
}

/// A time in ms since the epoch as the UTC date and time, to the second
/// (`2026-11-28T14:02:11Z`).
pub fn utc(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}
