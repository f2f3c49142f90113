//! Compaction settings, validated when built.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// When a session's context counts as outgrown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Never compact automatically (manual compaction still works, and existing
    /// compactions are still read).
    Off,
    /// Compact when the context reaches this many tokens (> 0).
    Tokens(u64),
    /// Compact at this fraction, in (0, 1], of the model's context window. A
    /// model with no known window is refused when the runner is built (for
    /// the models it is told of) and when a session is created
    /// ([`crate::Error::UnknownWindow`]); a session stored with one before
    /// runs uncompacted, said once in a warning event.
    Fraction(f64),
}

impl Threshold {
    /// Parses `off`, an integer token count, or a fraction such as `0.9`.
    pub fn parse(s: &str) -> Result<Threshold> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") {
            return Ok(Threshold::Off);
        }
        if let Ok(n) = s.parse::<u64>() {
            let t = Threshold::Tokens(n);
            t.validate()?;
            return Ok(t);
        }
        match s.parse::<f64>() {
            Ok(f) => {
                let t = Threshold::Fraction(f);
                t.validate()?;
                Ok(t)
            }
            Err(_) => Err(Error::Config(format!(
                "threshold {s:?} is neither `off`, a token count nor a fraction"
            ))),
        }
    }

    /// Refuses out-of-range values.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Threshold::Off => Ok(()),
            Threshold::Tokens(0) => Err(Error::Config("Tokens threshold must be > 0".into())),
            Threshold::Tokens(_) => Ok(()),
            Threshold::Fraction(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(()),
            Threshold::Fraction(f) => Err(Error::Config(format!(
                "Fraction threshold must be in (0, 1], got {f}"
            ))),
        }
    }

    /// The threshold in tokens for a model with `window`; None when off.
    ///
    /// A fraction is taken as the decimal it is written as (`0.57` is 57/100,
    /// not the binary float just below it) and applied in integer arithmetic:
    /// `Fraction(0.57)` of 100 tokens is 57.
    pub fn tokens(&self, window: Option<u64>) -> Option<u64> {
        match *self {
            Threshold::Off => None,
            Threshold::Tokens(n) => Some(n),
            Threshold::Fraction(f) => window.map(|w| fraction_of(f, w).max(1)),
        }
    }
}

/// `floor(f * w)` with `f` read as the shortest decimal that prints it, in
/// integer arithmetic (at most 18 decimal places are used).
fn fraction_of(f: f64, w: u64) -> u64 {
    // Display of an f64 is its shortest round-trip decimal, never exponential.
    let text = format!("{f}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = &frac[..frac.len().min(18)];
    let (Ok(int), Ok(num)) = (
        int.parse::<u128>(),
        if frac.is_empty() {
            Ok(0)
        } else {
            frac.parse::<u128>()
        },
    ) else {
        return ((w as f64) * f).floor() as u64;
    };
    let den = 10u128.pow(frac.len() as u32);
    let tokens = (w as u128) * int + (w as u128) * num / den;
    u64::try_from(tokens).unwrap_or(u64::MAX)
}

/// What a step does when its compaction fails after the last attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Fail the turn with [`Error::CompactionFailed`].
    FailTurn,
    /// Go on with the last completed compaction (or none); the boundary stays
    /// failed and is not tried again in this turn.
    #[default]
    ProceedUncompacted,
}

/// Background compaction: the row is claimed at a soft threshold, below the
/// hard one, and summarised while the session's steps go on.
///
/// While the summary is pending, steps read the last completed compaction as
/// before (G4); the new one is read from the first turn that begins after it
/// completes, so a turn never changes context mid-way, unless the context
/// reaches the hard threshold first: that step waits for the pending summary
/// (the inline path, exactly-once as ever). The boundary is fixed when the row
/// is claimed; the turns that run meanwhile stay verbatim after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Background {
    /// The soft threshold, as a share of the hard one (`compact_at`), in
    /// (0, 1). Default 0.8.
    pub soft_share: f64,
    /// Who summarises a row claimed at the soft threshold.
    pub worker: BackgroundWorker,
    /// The compactor's pool of background workers
    /// ([`BackgroundWorker::Task`]): how many background summaries it makes
    /// at once. A row claimed while every worker is busy waits its turn, in
    /// claim order, its lease kept; the steps of its session go on reading
    /// the previous summary meanwhile. Default None: the summariser's own
    /// [`Summariser::parallelism`](crate::compaction::Summariser::parallelism)
    /// (16 unless the summariser says otherwise).
    pub workers: Option<usize>,
    /// Claim earlier for a session whose turns are large for the headroom
    /// above the soft threshold (default true): the soft threshold comes down
    /// to leave room, under the hard one, for as many turns as the
    /// session's pace says run while a summary is made (one, and one more
    /// per recent turn's time in its newest background summary's, at most
    /// [`MAX_HEADROOM_TURNS`]), each as large as the largest growth of its
    /// context in one of its last 8 turns; never below half the hard
    /// threshold, never above `soft_share`. A step then waits for a summary
    /// only when a single turn outgrows that headroom. Under a threshold it
    /// brought down, a claim also waits until the context has grown, since
    /// the summary it reads, by at least that largest growth: a summary
    /// that folds less buys less room than the turn it keeps room for, and
    /// leaves the context where the next turn would claim again.
    pub adaptive: bool,
}

/// The most turns of room the adaptive soft threshold leaves under the
/// hard one.
pub const MAX_HEADROOM_TURNS: i64 = 4;

impl Default for Background {
    fn default() -> Self {
        Background {
            soft_share: DEFAULT_SOFT_SHARE,
            worker: BackgroundWorker::Task,
            workers: None,
            adaptive: true,
        }
    }
}

/// The soft threshold's default share of the hard one.
pub const DEFAULT_SOFT_SHARE: f64 = 0.8;

impl Background {
    /// The soft threshold in tokens for a hard threshold of `hard` tokens
    /// (at least 1, at most `hard`).
    pub fn soft_tokens(&self, hard: u64) -> u64 {
        ((hard as f64 * self.soft_share) as u64).clamp(1, hard)
    }

    /// The soft threshold for a session of this pace (see
    /// [`Background::adaptive`]): `growth`, the largest growth of its
    /// context in one recent turn; `summary_ms` and `turn_ms`, its newest
    /// background summary's time and its recent turns' mean time.
    pub fn adaptive_soft_tokens(
        &self,
        hard: u64,
        growth: Option<i64>,
        summary_ms: Option<i64>,
        turn_ms: Option<i64>,
    ) -> u64 {
        let soft = self.soft_tokens(hard);
        let Some(growth) = growth.filter(|g| *g > 0).filter(|_| self.adaptive) else {
            return soft;
        };
        // The turn that claims, and the turns that run while it is made.
        let during = match (summary_ms, turn_ms) {
            (Some(s), Some(t)) if t > 0 && s >= 0 => (s + t - 1) / t,
            _ => 1,
        };
        let turns = (1 + during).clamp(1, MAX_HEADROOM_TURNS) as u64;
        let room = (growth as u64).saturating_mul(turns);
        hard.saturating_sub(room).max(hard / 2).min(soft).max(1)
    }
}

/// Who summarises a compaction claimed in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackgroundWorker {
    /// A task of the runner that claimed it, spawned on the caller's tokio
    /// runtime; a task that dies with its process leaves a pending row that
    /// any runner (or [`crate::Compactor::serve_pending`]) finishes.
    #[default]
    Task,
    /// Another process: the runner only records the pending row, unleased,
    /// and [`crate::Compactor::serve_pending`] (`abridge serve`) summarises
    /// it. A step that reaches the hard threshold first summarises it itself.
    Elsewhere,
}

/// The summariser's rules.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PromptStyle {
    /// Dense prose: facts, figures, ids, commitments, decisions, open items.
    #[default]
    Prose,
    /// Goal; Constraints & Preferences; Progress (Done / In Progress / Blocked);
    /// Key Decisions; Next Steps; Critical Context.
    Structured,
    /// The host's own rules, replacing the built-in ones wholesale.
    Custom(String),
}

/// Counts tokens deterministically (the same text always gives the same count).
pub trait TokenCounter: Send + Sync {
    /// Tokens in `text`.
    fn count(&self, text: &str) -> u64;

    /// Tokens in any text of `chars` characters, for a counter that depends
    /// on nothing else (the default [`CharsPerFour`]): a step's estimate then
    /// needs no text at all. None (the default) makes the runner render the
    /// step's messages as text and [`count`](Self::count) them.
    fn count_chars(&self, chars: u64) -> Option<u64> {
        let _ = chars;
        None
    }
}

/// The default counter: characters / 4, rounded up.
#[derive(Debug, Clone, Copy, Default)]
pub struct CharsPerFour;

impl TokenCounter for CharsPerFour {
    fn count(&self, text: &str) -> u64 {
        (text.chars().count() as u64).div_ceil(4)
    }

    fn count_chars(&self, chars: u64) -> Option<u64> {
        Some(chars.div_ceil(4))
    }
}

/// Built-in context windows, by exact model id. A dated or versioned
/// snapshot of a listed id (`gpt-4o-2024-08-06`, `claude-sonnet-4-20250514`,
/// `gemini-1.5-pro-002`, `claude-3-5-sonnet-latest`) has the window of the id
/// it snapshots; nothing else matches by prefix (`gpt-4.5` is not `gpt-4`).
/// A host registers others with [`CompactionConfig::with_context_window`].
pub const CONTEXT_WINDOWS: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-3.5-turbo", 16_385),
    ("gpt-4", 8_192),
    ("gpt-4-32k", 32_768),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-turbo-preview", 128_000),
    ("gpt-4o", 128_000),
    ("gpt-4o-mini", 128_000),
    ("chatgpt-4o", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.1-mini", 1_047_576),
    ("gpt-4.1-nano", 1_047_576),
    ("gpt-4.5-preview", 128_000),
    ("gpt-5", 400_000),
    ("gpt-5-mini", 400_000),
    ("gpt-5-nano", 400_000),
    ("gpt-5-codex", 400_000),
    ("gpt-5.1", 400_000),
    ("o1", 200_000),
    ("o1-mini", 128_000),
    ("o1-pro", 200_000),
    ("o3", 200_000),
    ("o3-mini", 200_000),
    ("o3-pro", 200_000),
    ("o4-mini", 200_000),
    // Anthropic
    ("claude-3-haiku", 200_000),
    ("claude-3-sonnet", 200_000),
    ("claude-3-opus", 200_000),
    ("claude-3-5-haiku", 200_000),
    ("claude-3-5-sonnet", 200_000),
    ("claude-3-7-sonnet", 200_000),
    ("claude-sonnet-4", 200_000),
    ("claude-sonnet-4-0", 200_000),
    ("claude-opus-4", 200_000),
    ("claude-opus-4-0", 200_000),
    ("claude-opus-4-1", 200_000),
    ("claude-sonnet-4-5", 200_000),
    ("claude-haiku-4-5", 200_000),
    ("claude-opus-4-5", 200_000),
    // Google
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-2.0-flash", 1_048_576),
    ("gemini-2.0-flash-lite", 1_048_576),
    ("gemini-2.5-pro", 1_048_576),
    ("gemini-2.5-flash", 1_048_576),
    ("gemini-2.5-flash-lite", 1_048_576),
    // Others served under their own ids
    ("deepseek-chat", 128_000),
    ("deepseek-reasoner", 128_000),
    ("mistral-large", 128_000),
    ("mistral-medium", 128_000),
    ("mistral-small", 128_000),
];

/// The id `model` is a snapshot of: `model` less a snapshot suffix (a date
/// `-YYYY-MM-DD`, `-YYYYMMDD` or `-MMDD`, a version `-NNN`, or `-latest`),
/// or None.
fn snapshot_of(model: &str) -> Option<&str> {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(base) = model.strip_suffix("-latest") {
        return Some(base);
    }
    let (base, last) = model.rsplit_once('-')?;
    if digits(last, 8) || digits(last, 4) || digits(last, 3) {
        return Some(base);
    }
    // -YYYY-MM-DD
    let (base, dd) = (base, last);
    let (base, mm) = base.rsplit_once('-')?;
    let (base, yyyy) = base.rsplit_once('-')?;
    (digits(yyyy, 4) && digits(mm, 2) && digits(dd, 2)).then_some(base)
}

/// The built-in window of `model`: its exact id, else the id it is a
/// snapshot of.
pub fn builtin_context_window(model: &str) -> Option<u64> {
    let exact = |id: &str| {
        CONTEXT_WINDOWS
            .iter()
            .find(|(m, _)| *m == id)
            .map(|(_, w)| *w)
    };
    exact(model).or_else(|| snapshot_of(model).and_then(exact))
}

/// How compaction behaves. Build with [`CompactionConfig::default`] and the
/// `with_*` methods; [`CompactionConfig::validate`] runs when the runner is built.
#[derive(Clone)]
#[non_exhaustive]
pub struct CompactionConfig {
    /// When to compact. Default `Fraction(0.9)`.
    pub compact_at: Threshold,
    /// Most recent completed turns kept verbatim. Default 0.
    pub keep_last_turns: u32,
    /// Background compaction at a soft threshold. Default on: at 80 % of the
    /// hard threshold, by a task of the runner. None compacts only inline,
    /// when a step reaches the hard threshold.
    pub background: Option<Background>,
    /// Context windows registered by the host, by exact model name (these win
    /// over the built-in table).
    pub context_windows: HashMap<String, u64>,
    /// Counts tokens where the provider reports none, and for G7.
    pub token_counter: Arc<dyn TokenCounter>,
    /// The summariser's rules.
    pub style: PromptStyle,
    /// Cap on one text block in the summariser's transcript (chars). Default 4,000.
    pub text_cap: usize,
    /// Cap on one tool result in the transcript (chars). Default 2,000.
    pub tool_result_cap: usize,
    /// Cap on a summary (chars); a longer one is cut. Default 6,000.
    /// The pinned-facts block the guard appends comes on top.
    pub max_summary_chars: usize,
    /// A summary's share of the threshold: its cap is also this share of
    /// the threshold's tokens (at 4 chars a token, and at least 800 chars),
    /// so that a compaction leaves room (see [`CompactionConfig::summary_chars`]).
    /// In (0, 1]; None caps by `max_summary_chars` alone. Default 0.25.
    pub max_summary_share: Option<f64>,
    /// Recent turns kept verbatim by size: the turns before the current one
    /// whose stored text (input, responses, tool results; chars / 4) adds up
    /// to at most this many tokens stay out of the compaction, beside the
    /// `keep_last_turns` most recent ones (the larger window wins). 0 (the
    /// default) keeps none by this count; see also `keep_recent_share`.
    pub keep_recent_tokens: u64,
    /// Recent turns kept verbatim as a share of the threshold: the tail
    /// `keep_recent_tokens` sets is at least this share of the session's
    /// threshold in tokens (0.15 of a 4,000-token threshold: the newest
    /// turns up to 600 tokens stay as they were said). In [0, 0.5]; None or
    /// 0 keeps none by share. Default 0.15 (docs/fidelity.md measures it: a
    /// few percent more context per step, no extra compaction; a step finds
    /// the tail's boundary by reading the tail's turns, rows that grow with
    /// the tail, not with the session). A manual compaction
    /// ([`crate::Runner::compact_now`]) that the tail would leave with
    /// nothing to fold keeps `keep_last_turns` alone.
    pub keep_recent_share: Option<f64>,
    /// Largest summariser request (tokens); larger spans go in chunks. Default 100,000.
    pub input_budget_tokens: u64,
    /// Summariser attempts per claim and the delays between them (doubling,
    /// capped, jittered). Default: 3 attempts, 500 ms doubling to at most
    /// 30 s, 20 % jitter.
    pub retry: crate::retry::RetryPolicy,
    /// Timeout of one summariser call. Default 120 s.
    pub attempt_timeout: Duration,
    /// Lease on a pending row; renewed while summarising. Default 60 s.
    pub lease_ttl: Duration,
    /// How long to wait for a live other's pending row. Default 300 s.
    pub wait_timeout: Duration,
    /// What a step does after the last failed attempt.
    pub on_failure: FailurePolicy,
    /// Chars the guard's pinned-facts block should stay within: past it the
    /// pins' sentences are left out, and past it still a
    /// [`crate::EventKind::PinsOverBudget`] event is sent (every live pin is
    /// kept regardless). Default 4,000.
    pub pins_budget_chars: usize,
    /// How many of the newest facts *mentioned in passing* count as live
    /// pins: facts without a slot found in tool results or the assistant's
    /// text, and what the user mentions without stating it for a slot (an
    /// id, an amount, a date, a name, an address, a path). What the user
    /// states for a slot ("my order number is..."), rules and the host's
    /// pins always stay live. Keeps a long, tool-heavy session's summary
    /// bounded. Recorded on each compaction. Default
    /// [`crate::pins::DEFAULT_PINS_WINDOW`] (100).
    pub pins_window: usize,
    /// The pinned facts' share of the threshold: the live pins' block,
    /// without sentences, is kept within this share of the threshold's
    /// tokens (4 chars a token) by folding the oldest facts mentioned in
    /// passing (a smaller window, recorded on the compaction, so `verify`
    /// checks G8 with it; a line in the block says how many). What the user
    /// stated for a slot, rules and the host's pins never fold: when they
    /// alone fill the share, a [`crate::EventKind::PinsOverShare`] event is
    /// sent, `verify` notes it, and they are all kept. The block also counts
    /// inside the summary's share: the summariser is asked for at most
    /// `max_summary_share` of the threshold less the block's size. In
    /// (0, 1]; None folds nothing. Default 0.10.
    pub pins_max_share: Option<f64>,
    /// The user's own words' share of the threshold: with the guard on,
    /// each summary ends its text with the newest of the user's messages it
    /// folds, verbatim (one line each, quoted), whole messages newest first
    /// within this share of the threshold's tokens (4 chars a token, at
    /// least 400 chars), the previous summary's lines after them, so what
    /// no pattern pins still reaches the model as the user said it. Counts
    /// inside the summary's share like the pinned block; where it would
    /// leave the summary no smaller than what it replaces (G7) it is halved
    /// first. In (0, 1]; None writes no section. Default 0.05.
    pub user_words_max_share: Option<f64>,
    /// The pins guard (G8): a summary as stored carries every live pin its
    /// text lacks. Default true. Off, nothing checks what a summary keeps and
    /// `verify` does not check G8 for the compactions made so (their
    /// `pins_live` is NULL); for measuring a summariser on its own.
    pub guard_pins: bool,
    /// Ask the summariser once more, naming the pinned facts its summary
    /// left out, before the guard appends what is still missing. Costs one
    /// more summariser call when something is missing. Default false.
    pub reask_missing_pins: bool,
}

impl std::fmt::Debug for CompactionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactionConfig")
            .field("compact_at", &self.compact_at)
            .field("keep_last_turns", &self.keep_last_turns)
            .field("keep_recent_tokens", &self.keep_recent_tokens)
            .field("keep_recent_share", &self.keep_recent_share)
            .field("style", &self.style)
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            compact_at: Threshold::Fraction(0.9),
            keep_last_turns: 0,
            background: Some(Background::default()),
            context_windows: HashMap::new(),
            token_counter: Arc::new(CharsPerFour),
            style: PromptStyle::Prose,
            text_cap: 4_000,
            tool_result_cap: 2_000,
            max_summary_chars: 6_000,
            max_summary_share: Some(0.25),
            keep_recent_tokens: 0,
            keep_recent_share: Some(0.15),
            input_budget_tokens: 100_000,
            retry: crate::retry::RetryPolicy::default(),
            attempt_timeout: Duration::from_secs(120),
            lease_ttl: Duration::from_secs(60),
            wait_timeout: Duration::from_secs(300),
            on_failure: FailurePolicy::ProceedUncompacted,
            pins_budget_chars: 4_000,
            guard_pins: true,
            pins_window: crate::pins::DEFAULT_PINS_WINDOW,
            pins_max_share: Some(0.10),
            user_words_max_share: Some(0.05),
            reask_missing_pins: false,
        }
    }
}

impl CompactionConfig {
    /// Sets the threshold.
    pub fn with_compact_at(mut self, t: Threshold) -> Self {
        self.compact_at = t;
        self
    }
    /// Sets `keep_last_turns`.
    pub fn with_keep_last_turns(mut self, n: u32) -> Self {
        self.keep_last_turns = n;
        self
    }
    /// Sets background compaction (None: inline only).
    pub fn with_background(mut self, b: Option<Background>) -> Self {
        self.background = b;
        self
    }
    /// Registers a model's context window.
    pub fn with_context_window(mut self, model: impl Into<String>, tokens: u64) -> Self {
        self.context_windows.insert(model.into(), tokens);
        self
    }
    /// Sets the prompt style.
    pub fn with_style(mut self, style: PromptStyle) -> Self {
        self.style = style;
        self
    }
    /// Sets the failure policy.
    pub fn with_on_failure(mut self, p: FailurePolicy) -> Self {
        self.on_failure = p;
        self
    }
    /// Sets the token counter.
    pub fn with_token_counter(mut self, c: impl TokenCounter + 'static) -> Self {
        self.token_counter = Arc::new(c);
        self
    }

    /// Sets `keep_recent_share` (None or 0: no tail by share).
    pub fn with_keep_recent_share(mut self, share: Option<f64>) -> Self {
        self.keep_recent_share = share;
        self
    }

    /// The verbatim tail in tokens for a session whose threshold is
    /// `threshold` tokens: the larger of `keep_recent_tokens` and
    /// `keep_recent_share` of the threshold.
    pub fn recent_tokens(&self, threshold: Option<u64>) -> u64 {
        let by_share = match (self.keep_recent_share, threshold) {
            (Some(share), Some(t)) if share > 0.0 => (t as f64 * share) as u64,
            _ => 0,
        };
        self.keep_recent_tokens.max(by_share)
    }

    /// Sets `keep_recent_tokens`.
    pub fn with_keep_recent_tokens(mut self, n: u64) -> Self {
        self.keep_recent_tokens = n;
        self
    }

    /// The cap on a summary for a session of `model`, chars: the smaller of
    /// `max_summary_chars` and `max_summary_share` of the threshold (4 chars
    /// a token, at least 800 chars). With no threshold (off, or an unknown
    /// window) `max_summary_chars`. The pinned-facts block the guard appends
    /// comes on top (a live pin is never cut).
    pub fn summary_chars(&self, model: &str) -> usize {
        match (
            self.compact_at.tokens(self.context_window(model)),
            self.max_summary_share,
        ) {
            (Some(t), Some(share)) => {
                let chars = (t as f64 * share * 4.0) as usize;
                self.max_summary_chars.min(chars.max(800))
            }
            _ => self.max_summary_chars,
        }
    }

    /// The summariser's cap for a session of `model` when the pinned block
    /// will take `block_chars`: [`CompactionConfig::summary_chars`], and
    /// within `max_summary_share` of the threshold with the block counted
    /// inside it (never below 800 chars, nor a quarter of the cap).
    pub fn summary_chars_beside(&self, model: &str, block_chars: usize) -> usize {
        let cap = self.summary_chars(model);
        match (
            self.compact_at.tokens(self.context_window(model)),
            self.max_summary_share,
        ) {
            (Some(t), Some(share)) if block_chars > 0 => {
                let whole = (t as f64 * share * 4.0) as usize;
                cap.min(whole.saturating_sub(block_chars).max(800).max(cap / 4))
            }
            _ => cap,
        }
    }

    /// The pinned facts' share for a session of `model`, chars
    /// ([`CompactionConfig::pins_max_share`]); None folds nothing.
    pub fn pins_share_chars(&self, model: &str) -> Option<usize> {
        let t = self.compact_at.tokens(self.context_window(model))?;
        self.pins_max_share
            .map(|share| ((t as f64 * share * 4.0) as usize).max(400))
    }

    /// The user's own words' share for a session of `model`, chars
    /// ([`CompactionConfig::user_words_max_share`]); None writes no section.
    pub fn user_words_chars(&self, model: &str) -> Option<usize> {
        let t = self.compact_at.tokens(self.context_window(model))?;
        self.user_words_max_share
            .map(|share| ((t as f64 * share * 4.0) as usize).max(400))
    }

    /// The context window of `model`: registered, else the built-in table
    /// ([`CONTEXT_WINDOWS`], exact ids and their snapshots).
    pub fn context_window(&self, model: &str) -> Option<u64> {
        if let Some(w) = self.context_windows.get(model) {
            return Some(*w);
        }
        builtin_context_window(model)
    }

    /// Refuses a model whose window is unknown while the threshold is a
    /// fraction of the window ([`Error::UnknownWindow`]): compaction could
    /// never trigger for it.
    pub fn check_model(&self, model: &str) -> Result<()> {
        if matches!(self.compact_at, Threshold::Fraction(_)) && self.context_window(model).is_none()
        {
            return Err(Error::UnknownWindow {
                model: model.to_string(),
            });
        }
        Ok(())
    }

    /// Tokens of a summariser request that are not transcript: the rules, the
    /// running summary at its largest, and the framing.
    pub(crate) fn fixed_request_tokens(&self, rules: &str) -> u64 {
        self.token_counter.count(rules) + self.max_summary_chars as u64 + 64
    }

    /// Refuses out-of-range values with [`Error::Config`].
    pub fn validate(&self) -> Result<()> {
        self.compact_at.validate()?;
        let positive = [
            ("text_cap", self.text_cap),
            ("tool_result_cap", self.tool_result_cap),
            ("max_summary_chars", self.max_summary_chars),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(Error::Config(format!("{name} must be > 0")));
            }
        }
        self.retry.validate("compaction retry")?;
        if let Some(share) = self.max_summary_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(Error::Config(format!(
                    "max_summary_share must be in (0, 1], got {share}"
                )));
            }
        }
        if let Some(share) = self.pins_max_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(Error::Config(format!(
                    "pins_max_share must be in (0, 1], got {share}"
                )));
            }
        }
        if let Some(share) = self.user_words_max_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(Error::Config(format!(
                    "user_words_max_share must be in (0, 1], got {share}"
                )));
            }
        }
        if let Some(share) = self.keep_recent_share {
            if !(0.0..=0.5).contains(&share) {
                return Err(Error::Config(format!(
                    "keep_recent_share must be in [0, 0.5], got {share}"
                )));
            }
        }
        if let Some(b) = &self.background {
            if !(b.soft_share > 0.0 && b.soft_share < 1.0) {
                return Err(Error::Config(format!(
                    "background soft_share must be in (0, 1), got {}",
                    b.soft_share
                )));
            }
            if b.workers == Some(0) {
                return Err(Error::Config(
                    "background workers must be at least 1 (None: the summariser's own)".into(),
                ));
            }
        }
        if self.input_budget_tokens < 256 {
            return Err(Error::Config(
                "input_budget_tokens must be at least 256".into(),
            ));
        }
        if self.lease_ttl < Duration::from_millis(10) {
            return Err(Error::Config("lease_ttl must be at least 10 ms".into()));
        }
        if let PromptStyle::Custom(p) = &self.style {
            if p.trim().is_empty() {
                return Err(Error::Config(
                    "a custom summary prompt must not be empty".into(),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod fraction_tests {
    use super::*;

    #[test]
    fn a_fraction_is_applied_as_the_decimal_it_is_written_as() {
        assert_eq!(Threshold::Fraction(0.57).tokens(Some(100)), Some(57));
        assert_eq!(Threshold::Fraction(0.29).tokens(Some(100)), Some(29));
        assert_eq!(
            Threshold::Fraction(0.8).tokens(Some(200_000)),
            Some(160_000)
        );
        assert_eq!(
            Threshold::Fraction(1.0).tokens(Some(u64::MAX)),
            Some(u64::MAX)
        );
        assert_eq!(Threshold::Fraction(0.1).tokens(Some(3)), Some(1));
        assert_eq!(
            Threshold::Fraction(0.001).tokens(Some(10)),
            Some(1),
            "never 0"
        );
        assert_eq!(Threshold::Fraction(0.5).tokens(None), None);
    }
}

#[cfg(test)]
mod tail_tests {
    use super::*;

    #[test]
    fn the_tail_is_the_larger_of_its_token_count_and_its_share_of_the_threshold() {
        let c = CompactionConfig::default();
        assert_eq!(c.recent_tokens(Some(4_000)), 600, "0.15 by default");
        let c = c.with_keep_recent_share(None);
        assert_eq!(c.recent_tokens(Some(4_000)), 0, "none without a share");
        let c = c.with_keep_recent_share(Some(0.15));
        assert_eq!(c.recent_tokens(Some(4_000)), 600);
        assert_eq!(c.recent_tokens(None), 0, "no threshold, no share");
        let c = c.with_keep_recent_tokens(1_000);
        assert_eq!(c.recent_tokens(Some(4_000)), 1_000);
        assert_eq!(c.recent_tokens(Some(100_000)), 15_000);
    }

    #[test]
    fn a_tail_share_outside_zero_to_a_half_is_refused() {
        for bad in [-0.1, 0.51, f64::NAN] {
            let c = CompactionConfig::default().with_keep_recent_share(Some(bad));
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{bad}");
        }
        let c = CompactionConfig::default().with_keep_recent_share(Some(0.5));
        assert!(c.validate().is_ok());
    }
}

#[cfg(test)]
mod adaptive_tests {
    use super::*;

    #[test]
    fn the_adaptive_soft_threshold_leaves_room_for_the_turns_a_summary_takes() {
        let b = Background::default();
        // No pace known, or small turns: the configured share.
        assert_eq!(b.adaptive_soft_tokens(1_000, None, None, None), 800);
        assert_eq!(b.adaptive_soft_tokens(1_000, Some(50), None, None), 800);
        // Turns of 150: room for the claiming turn and one more.
        assert_eq!(b.adaptive_soft_tokens(1_000, Some(150), None, None), 700);
        // A summary as long as three turns: room for four.
        assert_eq!(
            b.adaptive_soft_tokens(1_000, Some(100), Some(3_000), Some(1_000)),
            600
        );
        // Never more than MAX_HEADROOM_TURNS, never below half.
        assert_eq!(
            b.adaptive_soft_tokens(1_000, Some(100), Some(60_000), Some(1_000)),
            600
        );
        assert_eq!(b.adaptive_soft_tokens(1_000, Some(400), None, None), 500);
        // Off: the configured share whatever the pace.
        let fixed = Background {
            adaptive: false,
            ..b
        };
        assert_eq!(
            fixed.adaptive_soft_tokens(1_000, Some(400), None, None),
            800
        );
    }
}
