//! Pinned facts: what no compaction may lose (G8).
//!
//! Facts are extracted when a turn is stored (in the transaction that
//! finishes it), from the user's input, the assistant's text and the full tool
//! results (not the capped transcript a summariser sees), by a [`PinExtractor`]:
//! the built-in [`RuleExtractor`] unless the host brings its own. A host can pin
//! a fact itself ([`crate::Runner::pin`]). Pins are append-only: a newer value of
//! the same *slot* (the budget, the size, the ship-to address) is a new pin that
//! supersedes the older one.
//!
//! When a compaction completes, every live pin stated at or before its
//! boundary that the summariser's text does not contain is appended to the
//! stored summary in a deterministic block ([`render_block`]), so the fact stays
//! in what the model sees whatever the summariser wrote.

use crate::text::truncate_chars;
use regex::Regex;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::LazyLock;

/// How many of the newest facts mentioned in passing count as live
/// ([`crate::CompactionConfig::pins_window`]'s default, and what `inspect`
/// shows); see [`Fact::in_passing`].
pub const DEFAULT_PINS_WINDOW: usize = 100;

/// The heading of the block the guard appends to a summary.
pub const BLOCK_HEADING: &str = "## Pinned facts";

/// Longest stored sentence (chars); a rule's value is its sentence, so this
/// caps a rule too.
pub const MAX_SENTENCE_CHARS: usize = 300;

/// Longest value of a stated slot (chars).
const MAX_STATED_CHARS: usize = 80;

/// What kind of fact a pin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FactKind {
    /// An identifier: letters and digits (ORD-123, txn_8f3a2), or a number of
    /// three or more digits stated by the user (a postcode).
    Id,
    /// An amount: a figure with a currency, or with separators (1,250).
    Amount,
    /// A date (2026-12-05, 5/12/2026, December 5).
    Date,
    /// An e-mail address.
    Email,
    /// A file path.
    Path,
    /// A URL.
    Url,
    /// An environment-variable-like name (DATABASE_URL).
    EnvVar,
    /// A proper name (a person, a carrier, a language).
    Name,
    /// A sentence stating a rule or a constraint (never, always, must...),
    /// kept verbatim.
    Rule,
    /// A value stated for a slot ("my budget is 1,250 EUR").
    Stated,
    /// A sentence stating a preference without a rule word ("I'd rather
    /// you text me", "please wrap everything in brown paper"), kept
    /// verbatim; mentioned in passing.
    Preference,
    /// Pinned by the host.
    Host,
}

impl FactKind {
    /// The name stored in the `pins.kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            FactKind::Id => "id",
            FactKind::Amount => "amount",
            FactKind::Date => "date",
            FactKind::Email => "email",
            FactKind::Path => "path",
            FactKind::Url => "url",
            FactKind::EnvVar => "env",
            FactKind::Name => "name",
            FactKind::Rule => "rule",
            FactKind::Stated => "stated",
            FactKind::Preference => "preference",
            FactKind::Host => "host",
        }
    }

    /// Parses a stored kind name.
    pub fn parse(s: &str) -> Option<FactKind> {
        Some(match s {
            "id" => FactKind::Id,
            "amount" => FactKind::Amount,
            "date" => FactKind::Date,
            "email" => FactKind::Email,
            "path" => FactKind::Path,
            "url" => FactKind::Url,
            "env" => FactKind::EnvVar,
            "name" => FactKind::Name,
            "rule" => FactKind::Rule,
            "stated" => FactKind::Stated,
            "preference" => FactKind::Preference,
            "host" => FactKind::Host,
            _ => return None,
        })
    }
}

/// Who stated a fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FactSource {
    /// The user's input.
    User,
    /// The assistant's text.
    Assistant,
    /// A tool's result.
    Tool,
    /// The host ([`crate::Runner::pin`]).
    Host,
}

impl FactSource {
    /// The name stored in the `pins.source` column.
    pub fn as_str(self) -> &'static str {
        match self {
            FactSource::User => "user",
            FactSource::Assistant => "assistant",
            FactSource::Tool => "tool",
            FactSource::Host => "host",
        }
    }

    /// Parses a stored source name.
    pub fn parse(s: &str) -> Option<FactSource> {
        Some(match s {
            "user" => FactSource::User,
            "assistant" => FactSource::Assistant,
            "tool" => FactSource::Tool,
            "host" => FactSource::Host,
            _ => return None,
        })
    }
}

/// A fact found in a text (not yet stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// Its kind.
    pub kind: FactKind,
    /// The slot it fills ("budget", "size", "postcode"): a newer value of the
    /// same slot supersedes it. None for a fact that stands alone.
    pub slot: Option<String>,
    /// The fact as carried: what must appear in a summary, verbatim.
    pub value: String,
    /// The sentence it was stated in (capped at [`MAX_SENTENCE_CHARS`]).
    pub sentence: String,
}

impl Fact {
    /// A fact the host states: `value` under `slot` (a newer value of the same
    /// slot supersedes it), with `value` as its sentence.
    pub fn host(slot: Option<&str>, value: &str) -> Fact {
        Fact {
            kind: FactKind::Host,
            slot: slot.map(normalise_slot).filter(|s| !s.is_empty()),
            value: value.trim().to_string(),
            sentence: truncate_chars(value.trim(), MAX_SENTENCE_CHARS),
        }
    }

    /// What a pin is called in a summary: its slot, or its kind.
    pub fn label(&self) -> &str {
        self.slot.as_deref().unwrap_or(self.kind.as_str())
    }

    /// Whether the fact, stated by `source`, is mentioned in passing: live
    /// only while among the session's newest ones
    /// ([`crate::CompactionConfig::pins_window`]; the user's and the tools'
    /// and assistant's are counted apart). True for a fact without a
    /// slot from a tool result or the assistant's text, and for what the
    /// user mentions without stating it for a slot (an id, an amount, a
    /// date, a name, an e-mail address, a path, a URL, a key); false for
    /// what the user states for a slot, rules and the host's pins, which
    /// stay live for good. (Pins recorded by earlier builds, when a user's
    /// names, addresses, paths, URLs and keys stayed live for good too, keep
    /// the window they were recorded with.)
    pub fn in_passing(&self, source: FactSource) -> bool {
        in_passing(self.kind, self.slot.is_some(), source)
    }
}

/// See [`Fact::in_passing`].
fn in_passing(kind: FactKind, slotted: bool, source: FactSource) -> bool {
    window_group(kind, slotted, source) != 0
}

/// The window a fact counts in: 0 none (live for good), 1 what tools and the
/// assistant mention in passing, 2 what the user does (each window keeps its
/// own newest ones, so a flood of tool ids never pushes out the user's).
pub(crate) fn window_group(kind: FactKind, slotted: bool, source: FactSource) -> u8 {
    if slotted {
        return 0;
    }
    match source {
        FactSource::Tool | FactSource::Assistant => 1,
        FactSource::User if kind != FactKind::Rule => 2,
        FactSource::User | FactSource::Host => 0,
    }
}

/// Finds the facts in a text. Called with every piece of a turn when the turn
/// is stored, in order; must be deterministic (a resumed turn extracts again
/// inside its finishing transaction).
pub trait PinExtractor: Send + Sync {
    /// The facts in `text`, stated by `source`, in the order they appear.
    fn extract(&self, text: &str, source: FactSource) -> Vec<Fact>;
}

/// The built-in extractor: patterns, no model.
///
/// From every source: URLs, e-mail addresses, file paths,
/// environment-variable-like names, dates, amounts with a currency, and
/// identifiers that mix letters and digits. From the user's input also: values
/// stated for a slot ("my budget is 1,250 EUR", "change the size to L", "call
/// me Ana"), corrections naming no slot ("make it 1,000 EUR", "use brown
/// paper instead": their slot is [`LAST_SLOT`], resolved when recorded),
/// sentences stating a rule (never, always, only, must, do not, at
/// most...), preferences ("I'd rather..."), proper names, and bare numbers
/// of three or more digits. A question sets no slot unless it asks for a
/// change ("can you ship it to postal code 30742?"). Tokens inside a stated
/// value or a rule are carried by it, not pinned again.
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleExtractor;

static STATED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(my|our|the|your)\s+((?:[\p{L}-]+\s+){0,2}?[\p{L}-]+(?:\s+for\s+(?:the|my|our)\s+[\p{L}-]+)?)\s+(?:is|are|will be|should be|=)\s+(.+)$",
    )
    .expect("static regex")
});
static CHANGED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:set|change|changed|switch|switched|update|updated|make|made|move|moved|push|pushed|bring|brought)\s+(my|our|the)\s+((?:[\p{L}-]+\s+){0,2}?[\p{L}-]+)\s+to\s+(.+)$",
    )
    .expect("static regex")
});
/// What the user can spend, restated without the word budget.
static SPEND: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:can spend|can afford|spend up to|spend at most|budget of|up to .* in total)\b",
    )
    .expect("static regex")
});

/// A correction naming no slot: "make it X", "change it to X", "no wait,
/// X", "use X instead", "X instead".
static CORRECTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:\b(?:make it|make that|change it to|change that to|set it to|switch it to)\s+(.+)$|\b(?:use|take|go with)\s+(.+?)\s+instead\b)",
    )
    .expect("static regex")
});

/// The slot a correction naming none fills: resolved when it is recorded
/// ([`resolve_slot`]) to the slot last mentioned with a value of the
/// same shape; a fact with no such slot stands alone.
pub const LAST_SLOT: &str = "\u{1}last";

/// The shape of a value, to match a correction to its slot: an amount, a
/// date, a number, or words.
fn shape(v: &str) -> u8 {
    if AMOUNT.find(v).is_some_and(|m| m.len() * 2 >= v.len()) {
        1
    } else if DATE.is_match(v) {
        2
    } else if v.chars().any(|c| c.is_ascii_digit()) {
        3
    } else {
        4
    }
}

/// A slot to resolve when recorded: `hint` itself, or the newest slot
/// keyed by what it belongs to that ends with it (see [`resolve_slot`]).
pub fn hinted_slot(hint: &str) -> String {
    format!("{LAST_SLOT}:{hint}")
}

/// Whether `slot` is resolved when recorded ([`LAST_SLOT`] or a
/// [`hinted_slot`]).
pub fn is_unresolved_slot(slot: &str) -> bool {
    slot.starts_with(LAST_SLOT)
}

/// The slot `marker` ([`LAST_SLOT`] or a [`hinted_slot`]) stands for, for
/// `value`: the newest of `recent` (slot, value) pairs, newest first, whose
/// value has its shape (for words, one that shares a word of three letters
/// or more with it: "brown paper" corrects "gift paper", not the dog's
/// name), and for a hint whose name is the hint or ends with it ("the
/// deadline" is the shelves' deadline when that is the one stated). With a
/// hint and no such slot, the hint itself; with none, None.
pub fn resolve_slot<'a>(
    marker: &str,
    value: &str,
    recent: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<String> {
    let hint = marker
        .strip_prefix(LAST_SLOT)
        .and_then(|h| h.strip_prefix(':'))
        .filter(|h| !h.is_empty());
    let want = shape(value);
    let words = |v: &str| -> Vec<String> {
        v.split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.chars().count() >= 3)
            .map(str::to_lowercase)
            .collect()
    };
    let mine = words(value);
    let found = recent
        .into_iter()
        .filter(|(slot, _)| !is_unresolved_slot(slot))
        .filter(|(slot, _)| hint.is_none_or(|h| *slot == h || slot.ends_with(&format!(" {h}"))))
        .find(|(_, v)| {
            shape(v) == want
                && (want != 4 || hint.is_some() || words(v).iter().any(|w| mine.contains(w)))
        })
        .map(|(slot, _)| slot.to_string());
    found.or_else(|| hint.map(str::to_string))
}

/// Whether a sentence of the user's asks rather than states: a question
/// that is not a request to change something ("could you check if you
/// deliver to postal code 37527?", "how much would shipping to 75511
/// cost?"; but "can you ship it to postal code 30742?" asks for a change,
/// and states the postcode).
fn is_question(sentence: &str) -> bool {
    let s = sentence.trim_end();
    if !(s.ends_with('?') || s.ends_with('？')) {
        return false;
    }
    !REQUEST.is_match(s) || QUERY.is_match(s)
}

/// A question asking for a change: "can you change / ship / set ...".
static REQUEST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^\s*(?:please\s+)?(?:can|could|would|will)\s+you\s+(?:please\s+)?(?:change|ship|send|set|update|move|make|switch|deliver|book|add|use|put|cancel)\b",
    )
    .expect("static regex")
});

/// A question asking about something: "check if", "whether", "how much".
static QUERY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:check if|check whether|whether|if you|how much|how long|is it possible)\b",
    )
    .expect("static regex")
});

static CALL_ME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b(?:[Cc]all me|[Mm]y name's|I am|I'm)\s+(\p{Lu}[\p{L}'-]+(?:\s+\p{Lu}[\p{L}'-]+)?)",
    )
    .expect("static regex")
});
static RULE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?-u:\b)(?:never|always|only|must|mustn't|do not|don't|does not|at most|at least|no more than|no later than|not allowed|make sure|avoid|required|forbidden|under no circumstances)(?-u:\b)",
    )
    .expect("static regex")
});
/// The same rule words in other languages: German, Portuguese, Spanish,
/// French (on word boundaries), Japanese and Hindi (as written: their words
/// are not set apart by spaces).
static RULE_INTL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:unless|only if|only when|except when|no later than|niemals|nie|immer|nur wenn|nur|darf nicht|dürfen nicht|muss|müssen|auf keinen fall|nunca|sempre|somente|apenas|só se|não pode|jamais|toujours|seulement|uniquement|sauf si|ne jamais|il faut|siempre|solo si|sólo si|únicamente|no debe|debe)\b|絶対|必ず|決して|しないで|してはいけない|だけ|कभी नहीं|कभी भी|हमेशा|केवल|सिर्फ|मत ",
    )
    .expect("static regex")
});
/// Rules in the form of an instruction rather than a rule word: "stop
/// doing", a clause opening with "no" and a noun ("no plastic at all", not
/// "no wait" or "no problem"), a sentence opening with a condition and a
/// comma ("If nobody answers, ..."); and their forms in German, Portuguese,
/// Spanish, French, Japanese and Hindi. A question is never one (the caller
/// checks).
static RULE_FORMS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\bstop\s+\p{L}+ing\b|\bhör(?:en sie)? auf\b|\bpar[ae] de\b|\bdej[ae]n? de\b|\barr[êe]te[zr]? de\b|\bne\s+\p{L}+\s+(?:pas|plus)\b|^\s*(?:if|when|wenn|falls|se|si|quand|cuando|quando)\b[^,?]{3,},|やめて|なら、|場合は|बंद कर|अगर|यदि|नहीं चाहिए",
    )
    .expect("static regex")
});
/// A clause opening with "no" (or its German, Portuguese and French forms)
/// and a word: a rule unless the word makes it a reply ("no wait").
static NO_CLAUSE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:^|[,;:]\s*)(?:no|kein|keine|keinen|não|nada de|pas de)\s+(\p{L}{3,})")
        .expect("static regex")
});
/// Words after "no" that make a reply, not a rule.
const NOT_A_RULE_AFTER_NO: &[&str] = &[
    "wait", "problem", "problems", "worries", "thanks", "thank", "idea", "way", "doubt", "need",
    "matter", "one", "longer", "sorry", "espera", "problema", "sei", "sé", "sais",
];

/// Whether `sentence` (not a question) is a rule in the form of an
/// instruction ([`RULE_FORMS`], [`NO_CLAUSE`]).
fn instruction_rule(sentence: &str) -> bool {
    RULE_FORMS.is_match(sentence)
        || NO_CLAUSE.captures_iter(sentence).any(|c| {
            let word = c[1].to_lowercase();
            !NOT_A_RULE_AFTER_NO.contains(&word.as_str())
        })
}
/// A preference stated without a rule word: English, Portuguese, Spanish,
/// German and French forms of "I prefer", "I'd rather", "from now on",
/// "everything in...".
static PREFERENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(?:i prefer|i'd prefer|i would prefer|i'd rather|i would rather|i like it when|i'd like you to|from now on|each time|every time|everything in|whenever|prefiro|prefiero|prefería|ich möchte lieber|lieber|je préfère|je voudrais plutôt|de préférence)\b|の方がいい|がいいです|पसंद",
    )
    .expect("static regex")
});

/// An amount: a currency (its sign, `R$`, `US$`, or its code after) with a
/// figure in either notation (`1,250.50` or `1.250,50`, `2 500`).
static AMOUNT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?:(?:R\$|US\$|A\$|C\$|[$€£¥₹])\s?\d{1,3}(?:[.,]\d{3})*(?:[.,]\d{1,2})?(?:\d*)|(?-u:\b)\d{1,3}(?:[.,]\d{3})*(?:[.,]\d{1,2})?\d*\s?(?:EUR|USD|GBP|JPY|CHF|CAD|AUD|BRL|INR|€|£|₹|[万千]?円|रुपये|रुपए|euros?(?-u:\b)|dollars?(?-u:\b)|pounds?(?-u:\b)|reais(?-u:\b)))",
    )
    .expect("static regex")
});
/// Whether `text` holds a decimal digit of any script: what [`DATE`] and
/// [`AMOUNT`] (every branch of each has a `\d`, Unicode's decimal digits)
/// need to match at all. `char::is_numeric` takes in more than those (other
/// numerals too), so a text it says no to has none.
fn has_digit(text: &str) -> bool {
    text.bytes().any(|b| b.is_ascii_digit())
        || (!text.is_ascii() && text.chars().any(char::is_numeric))
}

static DATE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?-u:\b)(?:\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}|(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s+\d{1,2}(?:st|nd|rd|th)?(?:,?\s+\d{4})?|\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:january|february|march|april|may|june|july|august|september|october|november|december)(?:\s+\d{4})?)(?-u:\b)",
    )
    .expect("static regex")
});
static EMAIL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$").expect("static regex"));
static ENV: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$").expect("static regex"));

/// An environment-variable-like name (`ENV`), with the test most words fail
/// first.
fn env_like(w: &str) -> bool {
    w.as_bytes().first().is_some_and(u8::is_ascii_uppercase) && w.contains('_') && ENV.is_match(w)
}

/// Words that open sentences or are too common to be a proper name.
const NOT_NAMES: &[&str] = &[
    // Codes written in capitals that name no one: currencies, clothing
    // sizes, tax and shop abbreviations.
    "EUR",
    "USD",
    "GBP",
    "JPY",
    "CHF",
    "CAD",
    "AUD",
    "BRL",
    "INR",
    "XS",
    "XL",
    "XXL",
    "XXXL",
    "VAT",
    "SKU",
    "ETA",
    "PDF",
    "I",
    "I'm",
    "I'll",
    "I've",
    "I'd",
    "OK",
    "Ok",
    "Hi",
    "Hello",
    "Thanks",
    "Thank",
    "Please",
    "Yes",
    "No",
    "The",
    "A",
    "An",
    "It",
    "It's",
    "We",
    "You",
    "My",
    "Our",
    "Your",
    "And",
    "But",
    "Or",
    "So",
    "If",
    "Then",
    "Also",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
    "JSON",
    "API",
    "URL",
    "ID",
];

/// Slot names that mean the same thing; "the budget for the sofa" is "sofa
/// budget", a slot of its own (keyed by what it belongs to).
fn normalise_slot(raw: &str) -> String {
    let s = raw.trim().to_lowercase();
    let s = match s.split_once(" for ") {
        Some((what, of)) => {
            let of = ["the ", "my ", "our "]
                .iter()
                .find_map(|p| of.strip_prefix(p))
                .unwrap_or(of);
            format!("{of} {what}")
        }
        None => s,
    };
    let s = ["my ", "our ", "your ", "the ", "a "]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(&s)
        .to_string();
    let s = s
        .strip_prefix("new ")
        .or_else(|| s.strip_prefix("current "))
        .unwrap_or(&s)
        .to_string();
    match s.as_str() {
        "postal code" | "zip" | "zip code" | "post code" | "postcode" | "cep" | "plz"
        | "postleitzahl" | "código postal" | "code postal" => "postcode".into(),
        "e-mail" | "email address" | "e-mail address" | "mail" => "email".into(),
        "shipping address" | "delivery address" | "ship-to address" | "ship to address" => {
            "ship-to address".into()
        }
        "phone number" | "phone" | "telephone number" => "phone".into(),
        _ => s,
    }
}

/// The sentences of a text: split after `.`, `!` or `?` followed by white
/// space, and at line ends; a decimal point or a path's dot does not split.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    for (i, c) in text.char_indices() {
        let end = match c {
            '\n' => Some(i),
            '.' | '!' | '?' => {
                let next = bytes.get(i + 1).copied();
                (next.is_none() || next.is_some_and(|b| b == b' ' || b == b'\n' || b == b'\t'))
                    .then_some(i + 1)
            }
            _ => None,
        };
        if let Some(e) = end {
            let s = text[start..e].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = e;
        }
    }
    let s = text[start..].trim();
    if !s.is_empty() {
        out.push(s);
    }
    out
}

/// `value` with up to `n` chars of `text` on each side (cut between
/// grapheme clusters), or `value` alone when it is not in `text`.
fn around(text: &str, value: &str, n: usize) -> String {
    match text.find(value) {
        Some(at) => around_at(text, at, value.len(), n),
        None => value.to_string(),
    }
}

/// The `len` bytes of `text` at byte `at` with up to `n` chars on each side.
fn around_at(text: &str, at: usize, len: usize, n: usize) -> String {
    let (before, rest) = text.split_at(at);
    let (value, after) = rest.split_at(len);
    let head = &before[crate::text::tail_cut(before, n)..];
    let tail = truncate_chars(after, n);
    format!(
        "{}{head}{value}{tail}{}",
        if head.len() < before.len() { "…" } else { "" },
        if tail.len() < after.len() { "…" } else { "" }
    )
}

/// Cuts a stated value where the statement ends: at `;`, at " and "/" but "
/// (with or without a comma), and to [`MAX_STATED_CHARS`] (then at its first
/// comma).
fn stated_value(raw: &str) -> Option<String> {
    let mut v = raw;
    for stop in [
        ";",
        ", and ",
        ", but ",
        " and ",
        " but ",
        " because ",
        " so ",
        " which ",
    ] {
        if let Some(i) = v.find(stop) {
            v = &v[..i];
        }
    }
    // A comma before a lower-case word starts a new clause; one before a
    // digit or a capital stays inside the value (12 Rue X, 75001 Paris).
    if let Some((i, _)) = v
        .match_indices(", ")
        .find(|(i, _)| v[i + 2..].chars().next().is_some_and(|c| c.is_lowercase()))
    {
        v = &v[..i];
    }
    let v = v.trim().trim_end_matches(['.', '!', '?', ',', ':']).trim();
    let v = if v.chars().count() > MAX_STATED_CHARS {
        v.split(',').next().unwrap_or(v).trim()
    } else {
        v
    };
    let words = v.split_whitespace().count();
    (!v.is_empty() && v.chars().count() <= MAX_STATED_CHARS && words <= 10).then(|| v.to_string())
}

/// Slots a value is kept in, accepted after "the" ("the budget is...").
fn known_slot(slot: &str) -> bool {
    let last = slot.rsplit(' ').next().unwrap_or(slot);
    matches!(
        last,
        "budget"
            | "size"
            | "deadline"
            | "address"
            | "postcode"
            | "email"
            | "phone"
            | "name"
            | "color"
            | "colour"
            | "quantity"
            | "limit"
            | "date"
            | "carrier"
            | "language"
            | "currency"
            | "price"
            | "total"
            | "account"
            | "order"
            | "key"
            | "model"
            | "version"
            | "branch"
            | "repository"
            | "repo"
            | "region"
            | "timezone"
            | "port"
            | "host"
            | "endpoint"
            | "directory"
            | "folder"
            | "file"
            | "path"
            | "tier"
            | "plan"
    )
}

/// Slots that name *which* thing rather than a value of it: "order
/// ORD-1002" is another order, not a new value of the order ("my order
/// number is ..." still states one).
fn entity_slot(slot: &str) -> bool {
    let last = slot.rsplit(' ').next().unwrap_or(slot);
    matches!(
        last,
        "order" | "account" | "file" | "path" | "directory" | "folder" | "branch" | "key"
    )
}

/// The known slot named by the one or two words before a value, if any
/// (not one naming which thing it is: [`entity_slot`]).
fn slot_before(before: &[&str]) -> Option<String> {
    let word = |w: &&str| trim_token(w).to_lowercase();
    let n = before.len();
    let mut tries = Vec::new();
    if n >= 2 {
        tries.push(format!("{} {}", word(&before[n - 2]), word(&before[n - 1])));
    }
    if n >= 1 {
        tries.push(word(&before[n - 1]));
    }
    tries
        .into_iter()
        .map(|t| normalise_slot(&t))
        .find(|t| known_slot(t) && !entity_slot(t))
}

/// Slots too vague to supersede anything by ("the problem is...").
fn vague_slot(slot: &str) -> bool {
    matches!(
        slot,
        "problem"
            | "issue"
            | "question"
            | "thing"
            | "point"
            | "idea"
            | "answer"
            | "reason"
            | "plan"
            | "goal"
            | "result"
            | "rest"
            | "same"
            | "other"
    )
}

fn trim_token(w: &str) -> &str {
    w.trim_matches(|c: char| {
        matches!(
            c,
            '"' | '\''
                | '('
                | ')'
                | '['
                | ']'
                | '{'
                | '}'
                | ','
                | ';'
                | ':'
                | '.'
                | '!'
                | '?'
                | '<'
                | '>'
                | '`'
        )
    })
}

fn is_path(w: &str) -> bool {
    // Every path below holds a slash or a backslash, which most words do
    // not: one scan of the bytes rules them out before the tests that scan
    // again (about a tenth of an extraction's time went to this test).
    if !w.bytes().any(|b| b == b'/' || b == b'\\') {
        return false;
    }
    if w.contains("://") || w.len() < 3 || w.contains('@') {
        return false;
    }
    if w.starts_with('/') || w.starts_with("./") || w.starts_with("../") || w.starts_with("~/") {
        return w.len() > 2 && w.chars().any(|c| c.is_alphanumeric());
    }
    if w.len() > 3 && w.as_bytes()[1] == b':' && w.as_bytes()[2] == b'\\' {
        return true;
    }
    // dir/file.ext: a slash between word characters and an extension at the end.
    let last = w.rsplit(['/', '\\']).next().unwrap_or("");
    last.contains('.')
        && !last.ends_with('.')
        && w.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '/' | '\\' | '.' | '_' | '-'))
}

fn is_mixed_id(w: &str) -> bool {
    // An ASCII digit first: most words have none, and counting a word's
    // characters scans it.
    w.bytes().any(|b| b.is_ascii_digit())
        && (3..=40).contains(&w.chars().count())
        && w.chars().any(|c| c.is_alphabetic())
        && w.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '#' | '.' | '/'))
        && !w.ends_with(['.', '-'])
}

fn is_bare_number(w: &str) -> bool {
    // A postal code in two parts counts too: 01310-100 (a CEP), 1100-148.
    let mut parts = w.splitn(2, '-');
    let head = parts.next().unwrap_or("");
    let digits = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    match parts.next() {
        None => w.len() >= 3 && digits(w),
        Some(tail) => {
            head.len() >= 4 && digits(head) && (3..=4).contains(&tail.len()) && digits(tail)
        }
    }
}

impl RuleExtractor {
    fn sentence_facts(sentence: &str, source: FactSource, out: &mut Found) {
        let user = source == FactSource::User;
        let kept = truncate_chars(sentence, MAX_SENTENCE_CHARS);
        // What this sentence's facts already carry: values (a token equal to
        // one is not pinned again) and the stated values and rules a token
        // may sit inside (few per sentence).
        let mut carried: HashSet<String> = HashSet::new();
        let mut long: Vec<String> = Vec::new();
        let inside = |v: &str, carried: &HashSet<String>, long: &[String]| {
            carried.contains(v) || long.iter().any(|c| c.contains(v))
        };
        // The sentence of a fact: the sentence itself, or for a tool's result
        // (no sentence) the words around the value at `at` (a byte offset).
        let sentence_of = |value: &str, at: Option<usize>| match (source, at) {
            (FactSource::Tool, Some(at)) => around_at(sentence, at, value.len(), 40),
            (FactSource::Tool, None) => around(sentence, value, 40),
            _ => kept.clone(),
        };
        // A question asks; it never sets a slot ("could you check if you
        // deliver to postal code 37527?").
        let question = user && is_question(sentence);
        if user && !question {
            let mut stated = false;
            for re in [&*CHANGED, &*STATED] {
                if let Some(c) = re.captures(sentence) {
                    let slot = normalise_slot(&c[2]);
                    // "my X is": anything the user owns; "the X is": only
                    // the slots a conversation keeps values in.
                    let personal = !c[1].eq_ignore_ascii_case("the");
                    if !vague_slot(&slot) && (personal || known_slot(&slot)) {
                        if let Some(v) = stated_value(&c[3]) {
                            long.push(v.clone());
                            // "We moved the deadline to ...": the deadline
                            // last stated, whatever it belongs to.
                            let changed_generic = std::ptr::eq(re, &*CHANGED)
                                && c[1].eq_ignore_ascii_case("the")
                                && !slot.contains(' ');
                            let slot = if changed_generic {
                                hinted_slot(&slot)
                            } else {
                                slot
                            };
                            out.push(FactKind::Stated, Some(slot), v, kept.clone());
                            stated = true;
                            break;
                        }
                    }
                }
            }
            // A budget restated in other words ("I can spend up to 3,400
            // EUR in total"): the budget last stated.
            if !stated && SPEND.is_match(sentence) {
                if let Some(m) = AMOUNT.find(sentence) {
                    let v = m.as_str().trim().to_string();
                    long.push(v.clone());
                    out.push(
                        FactKind::Stated,
                        Some(hinted_slot("budget")),
                        v,
                        kept.clone(),
                    );
                    stated = true;
                }
            }
            // A correction that names no slot ("no wait, make it 1,000
            // EUR", "use brown paper instead"): the slot last mentioned
            // with a value of its shape, found when it is recorded.
            if !stated {
                if let Some(v) = CORRECTION
                    .captures(sentence)
                    .and_then(|c| c.get(1).or_else(|| c.get(2)))
                    .and_then(|m| stated_value(m.as_str()))
                    // "I'll make it to the office": not a value.
                    .filter(|v| !v.to_lowercase().starts_with("to "))
                {
                    long.push(v.clone());
                    out.push(FactKind::Stated, Some(LAST_SLOT.into()), v, kept.clone());
                }
            }
        }
        if user {
            if let Some(c) = CALL_ME.captures(sentence).filter(|_| !question) {
                let v = c[1].to_string();
                if !inside(&v, &carried, &long) {
                    long.push(v.clone());
                    out.push(FactKind::Stated, Some("name".into()), v, kept.clone());
                }
            }
            if RULE.is_match(sentence)
                || RULE_INTL.is_match(sentence)
                || (!question && instruction_rule(sentence))
            {
                long.push(kept.clone());
                out.push(FactKind::Rule, None, kept.clone(), kept.clone());
            } else if !question && PREFERENCE.is_match(sentence) {
                long.push(kept.clone());
                out.push(FactKind::Preference, None, kept.clone(), kept.clone());
            }
        }
        // Byte offset of a sub-slice of `sentence` within it.
        let offset = |w: &str| w.as_ptr() as usize - sentence.as_ptr() as usize;
        // Every date and every amount holds a digit (`\d`, a decimal digit of
        // any script): a sentence without one is not scanned for them.
        let scans: &[(FactKind, &Regex)] = if has_digit(sentence) {
            &[(FactKind::Date, &DATE), (FactKind::Amount, &AMOUNT)]
        } else {
            &[]
        };
        for &(kind, re) in scans {
            for m in re.find_iter(sentence) {
                if out.full() {
                    return;
                }
                let v = m.as_str().trim();
                if !inside(v, &carried, &long) {
                    carried.insert(v.to_string());
                    // Its figures are its own: "245" of "245 EUR" is not an
                    // id besides.
                    long.push(v.to_string());
                    let sentence = sentence_of(v, Some(offset(v)));
                    out.push(kind, None, v.to_string(), sentence);
                }
            }
        }
        let words: Vec<&str> = sentence
            .split(|c: char| c.is_whitespace() || matches!(c, '"' | '{' | '}' | '[' | ']'))
            .filter(|w| !w.is_empty())
            .collect();
        let mut name: Vec<&str> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (i, raw) in words.iter().enumerate() {
            if out.full() {
                return;
            }
            let w = trim_token(raw);
            if w.starts_with("http://") || w.starts_with("https://") {
                let url = raw
                    .trim_start_matches(['"', '\'', '(', '<', '['])
                    .trim_end_matches(['"', '\'', ')', '>', ']', ',', '.', ';', '!', '?']);
                if !inside(url, &carried, &long) {
                    carried.insert(url.to_string());
                    let sentence = sentence_of(url, Some(offset(url)));
                    out.push(FactKind::Url, None, url.to_string(), sentence);
                }
            } else {
                // key=value (a log line, a setting): each side on its own.
                for part in w.split('=').map(trim_token).filter(|p| !p.is_empty()) {
                    // The cheap tests first: a regex call per word is most of
                    // an extraction's time, and most words have no '@' and
                    // no capital followed by '_'.
                    let kind = if part.contains('@') && EMAIL.is_match(part) {
                        FactKind::Email
                    } else if is_path(part) {
                        FactKind::Path
                    } else if part.len() >= 4 && env_like(part) {
                        FactKind::EnvVar
                    } else if is_mixed_id(part) || (user && is_bare_number(part)) {
                        FactKind::Id
                    } else {
                        continue;
                    };
                    if !inside(part, &carried, &long) {
                        carried.insert(part.to_string());
                        // "postal code 80273": a value right after a slot's
                        // name fills that slot (the user's words only).
                        let slot = (user && !question)
                            .then(|| slot_before(&words[..i]))
                            .flatten();
                        let sentence = sentence_of(part, Some(offset(part)));
                        out.push(kind, slot, part.to_string(), sentence);
                    }
                }
            }
            // Proper names: capitalised words not opening the sentence, or
            // short all-capital words (a carrier: DHL).
            let capital = w.chars().next().is_some_and(char::is_uppercase)
                && w.chars()
                    .skip(1)
                    .all(|c| c.is_alphabetic() || c == '-' || c == '\'')
                && w.chars().count() >= 2
                && !NOT_NAMES.contains(&w)
                && !env_like(w);
            let opens = i == 0
                || words[i - 1].ends_with(['.', '!', '?', ':'])
                || words[i - 1].starts_with('-');
            if user && capital && !opens {
                name.push(w);
                if raw.ends_with([',', '.', ';', '!', '?', ':', ')']) {
                    names.push(name.join(" "));
                    name.clear();
                }
            } else if !name.is_empty() {
                names.push(name.join(" "));
                name.clear();
            }
        }
        if !name.is_empty() {
            names.push(name.join(" "));
        }
        for v in names {
            if !inside(&v, &carried, &long) {
                carried.insert(v.clone());
                out.push(FactKind::Name, None, v, kept.clone());
            }
        }
    }
}

/// The facts found in one text, each (slot, value) once, at most
/// [`MAX_FACTS_PER_TEXT`].
struct Found {
    facts: Vec<Fact>,
    seen: HashSet<(Option<String>, String)>,
}

/// Most facts one turn pins: its user's first, then the assistant's and the
/// tools' in order. A tool result listing a hundred thousand ids pins the
/// first ones, not all (only the newest `pins_window` of those are live).
pub const MAX_PINS_PER_TURN: usize = 1_000;

/// Most facts the built-in extractor returns for one text (a tool result
/// listing a hundred thousand ids gives its first ones).
pub const MAX_FACTS_PER_TEXT: usize = 1_000;

impl Found {
    fn full(&self) -> bool {
        self.facts.len() >= MAX_FACTS_PER_TEXT
    }

    fn push(&mut self, kind: FactKind, slot: Option<String>, value: String, sentence: String) {
        if self.full() || !self.seen.insert((slot.clone(), value.clone())) {
            return;
        }
        self.facts.push(Fact {
            kind,
            slot,
            value,
            sentence,
        });
    }
}

impl PinExtractor for RuleExtractor {
    fn extract(&self, text: &str, source: FactSource) -> Vec<Fact> {
        let mut out = Found {
            facts: Vec::new(),
            seen: HashSet::new(),
        };
        for s in sentences(text) {
            if out.full() {
                break;
            }
            RuleExtractor::sentence_facts(s, source, &mut out);
        }
        out.facts
    }
}

/// A stored pin (a row of the `pins` table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    /// Row id.
    pub id: i64,
    /// The turn it was stated in (a host's pin: the next turn's index).
    pub turn_index: i64,
    /// Its kind.
    pub kind: FactKind,
    /// The slot it fills, if any.
    pub slot: Option<String>,
    /// The value carried verbatim.
    pub value: String,
    /// The sentence it was stated in.
    pub sentence: String,
    /// Who stated it.
    pub source: FactSource,
    /// The pin it superseded, if any: an older value of its slot, or the
    /// same value's earlier pin (a value mentioned in passing again, which
    /// refreshes its turn).
    pub supersedes: Option<i64>,
    /// The value it replaced: the superseded pin's, when it differs.
    pub superseded_value: Option<String>,
    /// The window it counts in, as stored when it was pinned: 0 live for
    /// good, 1 mentioned in passing by a tool or the assistant, 2 by the user
    /// (see [`Fact::in_passing`]).
    pub window: u8,
}

impl Pin {
    /// What the pin is called in a summary: its slot, or its kind.
    pub fn label(&self) -> &str {
        self.slot.as_deref().unwrap_or(self.kind.as_str())
    }

    /// Whether `text` (a summary) carries this pin where the model can use
    /// it (G8): its value on token boundaries (`7` is not carried by `17`,
    /// nor `L` by `Lisbon`), on a line that names it (its label, on word
    /// boundaries, case aside: the pinned block's own line always does).
    /// A value of [`SELF_NAMING_CHARS`] or more of a pin with no slot names
    /// itself. The guard and `verify` both use this test.
    pub fn carried_by(&self, text: &str) -> bool {
        let self_naming = self.slot.is_none() && self.value.chars().count() >= SELF_NAMING_CHARS;
        if self.value.contains('\n') {
            return on_token_boundaries(text, &self.value);
        }
        let label = self.label().to_lowercase();
        text.lines().any(|line| {
            on_token_boundaries(line, &self.value)
                && (self_naming || on_token_boundaries(&line.to_lowercase(), &label))
        })
    }

    /// Whether it was mentioned in passing ([`Fact::in_passing`]), as
    /// recorded when it was pinned.
    pub fn in_passing(&self) -> bool {
        self.window != 0
    }

    /// The pin as one line of the pinned-facts block: turn, label, value,
    /// the value it replaced, and (unless `bare`) its sentence.
    pub fn line(&self, bare: bool) -> String {
        let mut s = format!(
            "- [turn {}] {}: {}",
            self.turn_index,
            self.label(),
            self.value
        );
        if let Some(old) = &self.superseded_value {
            s.push_str(&format!(" (replaces {old})"));
        }
        if !bare && self.sentence != self.value && !self.sentence.is_empty() {
            s.push_str(&format!(" | \"{}\"", self.sentence));
        }
        s
    }
}

/// The live pins a summary does not carry ([`Pin::carried_by`]): what the
/// guard appends, and what `verify`'s G8 reports of a stored summary.
pub fn missing<'p>(pins: &'p [Pin], text: &str) -> Vec<&'p Pin> {
    pins.iter().filter(|p| !p.carried_by(text)).collect()
}

/// A value at least this long, of a pin with no slot (an id, a URL, a date,
/// a rule's sentence), names itself: it counts as carried wherever it stands
/// on token boundaries. A shorter one, or any slot's value, must stand on a
/// line that names its label.
pub const SELF_NAMING_CHARS: usize = 4;

/// A character that continues a word (a value that touches one is part of a
/// larger token: `7` in `17`, `L` in `Lisbon`).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `needle` occurs in `hay` on token boundaries: neither end joined
/// to a word character, nor, for a number, to a decimal or thousands part
/// (`2` in `2.5` or `1,250`).
fn on_token_boundaries(hay: &str, needle: &str) -> bool {
    if needle.is_empty() {
        return false;
    }
    let (first, last) = (
        needle.chars().next().unwrap_or(' '),
        needle.chars().next_back().unwrap_or(' '),
    );
    hay.match_indices(needle).any(|(i, _)| {
        let mut before = hay[..i].chars().rev();
        let mut after = hay[i + needle.len()..].chars();
        let (b, bb) = (before.next(), before.next());
        let (a, aa) = (after.next(), after.next());
        let joined_before = is_word(first)
            && (b.is_some_and(is_word)
                || (first.is_ascii_digit()
                    && matches!(b, Some('.' | ','))
                    && bb.is_some_and(|c| c.is_ascii_digit())));
        let joined_after = is_word(last)
            && (a.is_some_and(is_word)
                || (last.is_ascii_digit()
                    && matches!(a, Some('.' | ','))
                    && aa.is_some_and(|c| c.is_ascii_digit())));
        !joined_before && !joined_after
    })
}

/// The live pins that fit `share_chars` as a block without sentences
/// (`- [turn N] label: value` lines, and the values mentioned in passing by
/// tools and the assistant listed by kind): every pin live for good, and of
/// those mentioned in passing the newest `w` of each window, for the largest
/// `w` up to `window` that fits (0 when the pins live for good alone fill
/// the share: they are all kept, whatever their size). `pins` are the live
/// pins at `window` ([`crate::inspect::live_pins`]); no share (None) folds
/// nothing. Returns the pins kept, in their order, `w` (`window` when
/// nothing was left out), and how many were left out: what a compaction
/// records as its window, and `verify` checks G8 with.
pub fn fold_to_share(pins: Vec<Pin>, window: usize, share_chars: Option<usize>) -> Folded {
    let Some(share_chars) = share_chars else {
        return Folded {
            pins,
            window,
            folded: 0,
            over_share: false,
        };
    };
    let mut size = BareSize::default();
    let mut groups: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
    for (i, p) in pins.iter().enumerate() {
        match p.window {
            0 => size.add(p),
            w => groups[usize::from(w != 1)].push(i),
        }
    }
    // Newest first, as the live-pins query takes them.
    for g in &mut groups {
        g.sort_by_key(|&i| std::cmp::Reverse((pins[i].turn_index, pins[i].id)));
    }
    let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
    // The pins live for good alone over the share: nothing in passing.
    let over_share = size.total > share_chars;
    let mut w = 0;
    while w < longest && !over_share {
        let mut grown = size.clone();
        for &i in groups.iter().filter_map(|g| g.get(w)) {
            grown.add(&pins[i]);
        }
        if grown.total > share_chars {
            break;
        }
        size = grown;
        w += 1;
    }
    if w >= longest && !over_share {
        return Folded {
            pins,
            window,
            folded: 0,
            over_share,
        };
    }
    let mut keep = vec![true; pins.len()];
    let mut folded = 0;
    for g in &groups {
        for &i in g.iter().skip(w) {
            keep[i] = false;
            folded += 1;
        }
    }
    let mut it = keep.into_iter();
    let pins = pins
        .into_iter()
        .filter(|_| it.next().unwrap_or(true))
        .collect();
    Folded {
        pins,
        window: w,
        folded,
        over_share,
    }
}

/// Chars of pins as block lines without sentences: a line each, and the
/// values tools and the assistant mentioned in passing listed by kind.
#[derive(Debug, Clone)]
struct BareSize {
    total: usize,
    kinds: Vec<FactKind>,
}

impl Default for BareSize {
    fn default() -> Self {
        BareSize {
            total: BLOCK_HEADING.chars().count(),
            kinds: Vec::new(),
        }
    }
}

impl BareSize {
    fn add(&mut self, p: &Pin) {
        if p.window == 1 {
            if !self.kinds.contains(&p.kind) {
                self.kinds.push(p.kind);
                self.total += PASSING_LINE.len() + p.kind.as_str().len() + 2;
            }
            self.total += p.value.chars().count() + 2;
        } else {
            self.total += p.line(true).chars().count() + 1;
        }
    }
}

/// Chars of `pins` as a block without sentences (as [`fold_to_share`]
/// counts them).
pub fn bare_block_chars(pins: &[Pin]) -> usize {
    if pins.is_empty() {
        return 0;
    }
    let mut size = BareSize::default();
    pins.iter().for_each(|p| size.add(p));
    size.total
}

/// Chars of the block the guard would append if a summary carried none of
/// `pins` ([`render_block`] within `budget_chars`): the most the block can
/// take, which the summary's share counts.
pub fn block_bound_chars(pins: &[Pin], budget_chars: usize) -> usize {
    let all: Vec<&Pin> = pins.iter().collect();
    render_block(&all, budget_chars).0.chars().count()
}

/// What [`fold_to_share`] kept.
#[derive(Debug, Clone)]
pub struct Folded {
    /// The pins kept, in their order.
    pub pins: Vec<Pin>,
    /// The window they were kept with (the one given when nothing folded).
    pub window: usize,
    /// How many live pins mentioned in passing were left out.
    pub folded: usize,
    /// Whether the pins live for good alone exceed the share.
    pub over_share: bool,
}

/// `block` (from [`render_block`]) with the line saying that `folded` facts
/// mentioned in passing are left out, when any are (under the block's
/// heading, which it starts when the block is empty).
pub fn with_folded_line(mut block: String, folded: usize) -> String {
    if folded > 0 {
        block.push_str(if block.is_empty() { BLOCK_HEADING } else { "" });
        block.push('\n');
        block.push_str(&folded_line(folded));
    }
    block
}

/// The line the guard appends when facts mentioned in passing were folded
/// to keep the pinned block within its share ([`fold_to_share`]).
pub const FOLDED_LINE: &str = "- [folded] ";

/// [`FOLDED_LINE`] for `n` facts.
pub fn folded_line(n: usize) -> String {
    format!(
        "{FOLDED_LINE}{n} older facts mentioned in passing are not listed, to keep this list \
         within its share of the context (the history keeps them)"
    )
}

/// The prefix of a block line listing the values of the pins of one kind
/// mentioned in passing: `- [in passing] id: tx_1, tx_2`.
pub const PASSING_LINE: &str = "- [in passing] ";

/// The block the guard appends for `missing` pins, and whether it had to
/// exceed `budget_chars`. A pin gets a line (turn, label, value, the value
/// replaced, the sentence), except those mentioned in passing, whose values
/// are listed on one line per kind. Past the
/// budget, sentences are left out (the assistant's first, then the oldest);
/// a live value never is. Empty when nothing is missing.
pub fn render_block(missing: &[&Pin], budget_chars: usize) -> (String, bool) {
    if missing.is_empty() {
        return (String::new(), false);
    }
    // The user's facts (stated ones first) get a line each, with their
    // sentence; what tools and the assistant mentioned in passing is listed
    // by kind.
    let (tools, mut stated): (Vec<&Pin>, Vec<&Pin>) = missing.iter().partition(|p| p.window == 1);
    stated.sort_by_key(|p| p.window != 0);
    let mut grouped: Vec<(FactKind, Vec<&str>)> = Vec::new();
    for p in &tools {
        match grouped.iter_mut().find(|(k, _)| *k == p.kind) {
            Some((_, values)) => values.push(&p.value),
            None => grouped.push((p.kind, vec![&p.value])),
        }
    }
    let tool_lines: Vec<String> = grouped
        .iter()
        .map(|(k, values)| format!("{PASSING_LINE}{}: {}", k.as_str(), values.join(", ")))
        .collect();
    // Each line with and without its sentence, measured once; sentences are
    // dropped in this order while the block is over budget.
    let full: Vec<String> = stated.iter().map(|p| p.line(false)).collect();
    let bare: Vec<String> = stated.iter().map(|p| p.line(true)).collect();
    let chars = |l: &String| l.chars().count() + 1; // with its newline
    let mut total = BLOCK_HEADING.chars().count()
        + full.iter().map(chars).sum::<usize>()
        + tool_lines.iter().map(chars).sum::<usize>();
    let mut with_sentence = vec![true; stated.len()];
    // The assistant's first (a host's own extractor may give it lines),
    // then what the user mentioned in passing, then what the user stated,
    // oldest first in each.
    let rank = |p: &Pin| match (p.source, p.window) {
        (FactSource::Assistant, _) => 0,
        (_, 0) => 2,
        _ => 1,
    };
    let mut drop_order: Vec<usize> = (0..stated.len()).collect();
    drop_order.sort_by_key(|&i| (rank(stated[i]), stated[i].turn_index, stated[i].id));
    for i in drop_order {
        if total <= budget_chars {
            break;
        }
        with_sentence[i] = false;
        total -= chars(&full[i]) - chars(&bare[i]);
    }
    let mut block = String::with_capacity(total);
    block.push_str(BLOCK_HEADING);
    for (i, keep) in with_sentence.iter().enumerate() {
        block.push('\n');
        block.push_str(if *keep { &full[i] } else { &bare[i] });
    }
    for l in &tool_lines {
        block.push('\n');
        block.push_str(l);
    }
    (block, total > budget_chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dates and amounts are looked for only in a text with a digit: every
    /// character the patterns' `\d` matches (every script's decimal digits)
    /// is one `has_digit` sees, so a text it says no to holds neither.
    #[test]
    fn a_text_without_a_digit_holds_no_date_and_no_amount() {
        let digit = Regex::new(r"\d").unwrap();
        let mut digits = 0;
        for c in (0..=0x10FFFF_u32).filter_map(char::from_u32) {
            let s = c.to_string();
            if digit.is_match(&s) {
                digits += 1;
                assert!(has_digit(&s), "{c:?} (U+{:04X})", c as u32);
            }
        }
        assert!(digits > 600, "{digits}");
        for (t, digit) in [
            ("on March 3rd, 2026", true),
            ("١٢٣ EUR", true),
            ("$ 5", true),
            ("the 5th of May", true),
            ("no figure here, only € and dollars", false),
            // A numeral that is no decimal digit: looked at, never matched.
            ("Ⅻ dollars", true),
            ("due on the fifth of May", false),
        ] {
            assert_eq!(has_digit(t), digit, "{t}");
            if !digit {
                assert!(!DATE.is_match(t) && !AMOUNT.is_match(t), "{t}");
            }
        }
    }

    fn facts(text: &str, source: FactSource) -> Vec<(FactKind, Option<String>, String)> {
        RuleExtractor
            .extract(text, source)
            .into_iter()
            .map(|f| (f.kind, f.slot, f.value))
            .collect()
    }

    fn values(text: &str) -> Vec<String> {
        facts(text, FactSource::User)
            .into_iter()
            .map(|f| f.2)
            .collect()
    }

    #[test]
    fn stated_values_get_their_slot() {
        assert_eq!(
            facts(
                "My budget is 1,250 EUR for the whole order.",
                FactSource::User
            ),
            [(
                FactKind::Stated,
                Some("budget".into()),
                "1,250 EUR for the whole order".into()
            )]
        );
        // "the size": the size last stated, whatever it belongs to
        // (resolved when recorded).
        let f = facts("Please change the size to L.", FactSource::User);
        assert_eq!(
            f[0],
            (FactKind::Stated, Some(hinted_slot("size")), "L".into())
        );
        let f = facts("Please change my size to L.", FactSource::User);
        assert_eq!(f[0], (FactKind::Stated, Some("size".into()), "L".into()));
        let f = facts(
            "my postal code is 90210 and my name is Ana",
            FactSource::User,
        );
        assert_eq!(f[0].1.as_deref(), Some("postcode"));
        assert_eq!(f[0].2, "90210");
        let f = facts("Call me Ana Lima, please.", FactSource::User);
        assert_eq!(
            f[0],
            (FactKind::Stated, Some("name".into()), "Ana Lima".into())
        );
    }

    #[test]
    fn tokens_of_every_kind_are_found() {
        let v = values(
            "Send it to ana.lima@example.org, the key is in OPENAI_API_KEY, \
             config at /etc/app/config.toml and docs at https://example.org/a?b=1. \
             Order ORD-4471 arrives 2026-12-05, costs $12.50 in total. Ship with DHL.",
        );
        for want in [
            "ana.lima@example.org",
            "OPENAI_API_KEY",
            "/etc/app/config.toml",
            "https://example.org/a?b=1",
            "ORD-4471",
            "2026-12-05",
            "$12.50",
            "DHL",
        ] {
            assert!(v.iter().any(|x| x.contains(want)), "missing {want}: {v:?}");
        }
    }

    #[test]
    fn a_question_never_sets_a_slot() {
        let f = facts(
            "Could you check if you deliver to postal code 37527?",
            FactSource::User,
        );
        assert!(f.iter().all(|(_, slot, _)| slot.is_none()), "{f:?}");
        assert!(f.iter().any(|(_, _, v)| v == "37527"), "{f:?}");
        let f = facts("Is my budget is 900 EUR enough?", FactSource::User);
        assert!(f.iter().all(|(_, slot, _)| slot.is_none()), "{f:?}");
        // A request for a change states what it changes to.
        let f = facts(
            "Can you change the delivery date and ship to postal code 30742?",
            FactSource::User,
        );
        assert!(
            f.contains(&(FactKind::Id, Some("postcode".into()), "30742".into())),
            "{f:?}"
        );
    }

    #[test]
    fn a_correction_naming_no_slot_is_resolved_to_the_slot_last_mentioned_of_its_shape() {
        for (text, value) in [
            ("No wait, make it 1,000 EUR.", "1,000 EUR"),
            ("Actually, make it 3.", "3"),
            ("Use brown paper instead.", "brown paper"),
            ("change it to 2027-03-01", "2027-03-01"),
        ] {
            let f = facts(text, FactSource::User);
            assert!(
                f.contains(&(FactKind::Stated, Some(LAST_SLOT.into()), value.into())),
                "{text}: {f:?}"
            );
        }
        let recent = [
            ("wrapping", "gift paper"),
            ("deadline", "2027-01-10"),
            ("quantity", "2"),
            ("budget", "900 EUR"),
        ];
        let r = |v: &str| resolve_slot(LAST_SLOT, v, recent.iter().copied());
        assert_eq!(r("1,000 EUR").as_deref(), Some("budget"));
        assert_eq!(r("2027-03-01").as_deref(), Some("deadline"));
        assert_eq!(r("3").as_deref(), Some("quantity"));
        assert_eq!(r("brown paper").as_deref(), Some("wrapping"));
        assert_eq!(resolve_slot(LAST_SLOT, "brown paper", []), None);
        assert!(
            facts("I'll make it to the office by nine.", FactSource::User)
                .iter()
                .all(|(_, slot, _)| slot.is_none())
        );
        // Words correct only words they share one with: not the dog's name.
        assert_eq!(
            resolve_slot(LAST_SLOT, "brown paper", [("dog", "called biscuit")]),
            None
        );
        // A change in the past tense states a value too, for the deadline
        // last stated whatever it belongs to.
        let f = facts("We moved the deadline to 2027-04-02.", FactSource::User);
        assert_eq!(
            f[0],
            (
                FactKind::Stated,
                Some(hinted_slot("deadline")),
                "2027-04-02".into()
            )
        );
        let hinted = hinted_slot("deadline");
        let recent = [
            ("sofa budget", "1,200 EUR"),
            ("shelves deadline", "2027-01-10"),
        ];
        assert_eq!(
            resolve_slot(&hinted, "2027-04-02", recent).as_deref(),
            Some("shelves deadline")
        );
        assert_eq!(
            resolve_slot(&hinted, "2027-04-02", [("sofa budget", "1,200 EUR")]).as_deref(),
            Some("deadline")
        );
        // Keyed by what it belongs to.
        assert_eq!(
            facts(
                "The deadline for the shelves is 2027-01-10.",
                FactSource::User
            )[0],
            (
                FactKind::Stated,
                Some("shelves deadline".into()),
                "2027-01-10".into()
            )
        );
        // A budget restated in other words.
        let f = facts("I can spend up to 3,400 EUR in total.", FactSource::User);
        assert_eq!(
            f[0],
            (
                FactKind::Stated,
                Some(hinted_slot("budget")),
                "3,400 EUR".into()
            )
        );
        // A preference with no rule word, in English and Portuguese.
        for text in ["I'd rather you text me.", "Prefiro entrega pela manhã."] {
            let f = facts(text, FactSource::User);
            assert!(
                f.iter()
                    .any(|(k, _, v)| *k == FactKind::Preference && v == text),
                "{text}: {f:?}"
            );
        }
        // Amounts in yen and rupees.
        for (text, v) in [
            ("私の予算は5万円です。", "5万円"),
            ("बजट 5000 रुपये है।", "5000 रुपये"),
        ] {
            let f = facts(text, FactSource::User);
            assert!(
                f.iter().any(|(k, _, x)| *k == FactKind::Amount && x == v),
                "{text}: {f:?}"
            );
        }
    }

    #[test]
    fn another_orders_id_is_another_order_not_a_new_value() {
        let f = facts(
            "Order ORD-1002 came yesterday, the box was dented.",
            FactSource::User,
        );
        assert!(
            f.contains(&(FactKind::Id, None, "ORD-1002".into())),
            "{f:?}"
        );
    }

    #[test]
    fn a_value_after_its_slot_name_fills_the_slot() {
        let f = facts(
            "Please ship ORD-4 to postal code 80273 by 2026-12-03.",
            FactSource::User,
        );
        assert!(
            f.contains(&(FactKind::Id, Some("postcode".into()), "80273".into())),
            "{f:?}"
        );
        assert!(f.contains(&(FactKind::Id, None, "ORD-4".into())), "{f:?}");
        assert!(
            f.contains(&(FactKind::Date, None, "2026-12-03".into())),
            "{f:?}"
        );
    }

    #[test]
    fn a_rule_is_kept_verbatim_and_carries_its_tokens() {
        let f = facts(
            "Never ship anything to 10 Downing Street on a Sunday.",
            FactSource::User,
        );
        assert_eq!(
            f,
            [(
                FactKind::Rule,
                None,
                "Never ship anything to 10 Downing Street on a Sunday.".into()
            )]
        );
    }

    #[test]
    fn tool_results_give_identifiers_not_names_or_rules() {
        let f = facts(
            r#"{"status":"failed","txn":"txn_8f3a2","note":"Never retry","owner":"Bob Smith","total":1250}"#,
            FactSource::Tool,
        );
        assert_eq!(f, [(FactKind::Id, None, "txn_8f3a2".into())]);
    }

    #[test]
    fn a_tool_fact_keeps_the_words_around_it() {
        let text = format!("{}txn=tx_9f1 failed{}", "a".repeat(100), "b".repeat(100));
        let f = RuleExtractor.extract(&text, FactSource::Tool);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[0].sentence,
            format!("…{}txn=tx_9f1 failed{}…", "a".repeat(36), "b".repeat(33))
        );
    }

    #[test]
    fn sentences_split_on_ends_not_on_decimals_or_paths() {
        assert_eq!(
            sentences("It costs 12.50 EUR. See ./src/main.rs! Done?\nNext line"),
            [
                "It costs 12.50 EUR.",
                "See ./src/main.rs!",
                "Done?",
                "Next line"
            ]
        );
    }

    #[test]
    fn ordinary_chatter_pins_nothing() {
        assert!(values("ok thanks, that sounds good to me").is_empty());
        assert!(values("Hello! How are you today?").is_empty());
    }

    /// What the demo's lists showed as junk: a currency code, a size and a
    /// tax abbreviation taken for names, an amount's figure taken for an id.
    #[test]
    fn codes_are_not_names_and_an_amounts_figure_is_not_an_id() {
        let f = facts(
            "I'd also like a wool sweater for ORD-93411, size XS, under 245 EUR before VAT.",
            FactSource::User,
        );
        assert!(
            !f.iter().any(|(k, _, v)| *k == FactKind::Name
                && ["EUR", "XS", "VAT"].contains(&v.as_str())),
            "{f:?}"
        );
        assert!(!f.iter().any(|(_, _, v)| v == "245"), "{f:?}");
        assert!(
            f.contains(&(FactKind::Amount, None, "245 EUR".into())),
            "{f:?}"
        );
        assert!(f.iter().any(|(_, _, v)| v == "ORD-93411"), "{f:?}");
    }

    /// Rules in other languages and conditional ones, amounts in local
    /// notations, a Brazilian postal code.
    #[test]
    fn rules_amounts_and_postcodes_beyond_english_notation() {
        for rule in [
            "Only if the lamp is in stock, add it to the order.",
            "Unless I confirm, do not ship the second parcel.",
            "Bitte niemals vor 9 Uhr liefern.",
            "Nunca entregue aos domingos.",
            "Solo si hay stock, añada la lámpara.",
            "Ne livrez jamais le samedi.",
            "土曜日には絶対に配達しないでください。",
            "कृपया रविवार को कभी नहीं भेजें।",
            // Instructions: stop, no, if, in each language.
            "Stop sending me text messages.",
            "Please wrap everything in gift paper, no plastic at all.",
            "If nobody answers, leave it at the back door.",
            "Hören Sie auf, mich anzurufen.",
            "Keine Anrufe nach 20 Uhr.",
            "Wenn niemand öffnet, bitte beim Nachbarn abgeben.",
            "Pare de me enviar mensagens.",
            "Se ninguém atender, deixe com o porteiro.",
            "Deja de llamarme por la noche.",
            "Si nadie contesta, déjelo en la portería.",
            "Arrêtez de m'appeler le soir.",
            "Ne sonnez pas après 20 heures.",
            "電話はやめてください。",
            "不在なら、宅配ボックスに入れてください。",
            "अगर कोई जवाब न दे तो पड़ोसी को दे दें।",
            "कृपया फ़ोन कॉल बंद करें।",
        ] {
            let f = facts(rule, FactSource::User);
            assert!(
                f.iter().any(|(k, _, v)| *k == FactKind::Rule && v == rule),
                "{rule}: {f:?}"
            );
        }
        // Replies and questions are not rules.
        for not_rule in [
            "No wait, make it 43.",
            "No problem, thank you.",
            "Could you check if you deliver to postal code 37527?",
            "If it is in stock, could you add it?",
        ] {
            let f = facts(not_rule, FactSource::User);
            assert!(
                !f.iter().any(|(k, ..)| *k == FactKind::Rule),
                "{not_rule}: {f:?}"
            );
        }
        let amount = |text: &str| {
            facts(text, FactSource::User)
                .into_iter()
                .filter(|(k, ..)| *k == FactKind::Amount)
                .map(|(_, _, v)| v)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            amount("O total ficou em R$ 2.500,00 ontem."),
            ["R$ 2.500,00"]
        );
        assert_eq!(
            amount("Es kostet 1.000,00 EUR mit Versand."),
            ["1.000,00 EUR"]
        );
        assert_eq!(amount("It costs $1,250.50 all in."), ["$1,250.50"]);
        assert_eq!(amount("Keep it under 1,250 EUR please."), ["1,250 EUR"]);
        let f = facts("Meu CEP 01310-100 mudou.", FactSource::User);
        assert!(
            f.contains(&(FactKind::Id, Some("postcode".into()), "01310-100".into())),
            "{f:?}"
        );
    }

    /// G8 on what the model can use: a short value inside a longer token, or
    /// beside another label, is not carried; on token boundaries on a line
    /// that names it, or on the block's own line, it is.
    #[test]
    fn a_short_value_counts_only_on_token_boundaries_on_a_line_that_names_it() {
        let pin = |slot: Option<&str>, kind, v: &str| Pin {
            id: 1,
            turn_index: 3,
            kind,
            slot: slot.map(str::to_string),
            value: v.into(),
            sentence: String::new(),
            source: FactSource::User,
            supersedes: None,
            superseded_value: None,
            window: 0,
        };
        let prose = "The customer ordered 17 in all for their team.\n\
                     Deliveries on 27 and 31 March to Lisbon.\n\
                     Sizes were discussed.";
        let short = [
            pin(Some("quantity"), FactKind::Stated, "7"),
            pin(Some("size"), FactKind::Stated, "L"),
            pin(Some("shirt size"), FactKind::Stated, "S"),
            pin(Some("floor"), FactKind::Stated, "2"),
        ];
        assert_eq!(
            missing(&short, prose).len(),
            4,
            "all four were carried by substrings"
        );
        // A value beside another label is not this pin's.
        assert!(!short[3].carried_by("quantity: 2"));
        assert!(!short[0].carried_by("version 1.7 shipped"));
        assert!(!short[3].carried_by("total 2,500 EUR, floor unknown"));
        // On a line that names it, on token boundaries: carried.
        assert!(short[3].carried_by("They live on floor 2."));
        assert!(short[0].carried_by("Quantity: 7 (was 5)"));
        assert!(short[2].carried_by("Shirt size S, trousers M"));
        // The block's own line always names it.
        for p in &short {
            assert!(p.carried_by(&p.line(false)), "{}", p.line(false));
            assert!(p.carried_by(&format!("## Pinned facts\n{}", p.line(true))));
        }
        // A long value of a pin with no slot names itself, on boundaries.
        let id = pin(None, FactKind::Id, "ORD-93411");
        assert!(id.carried_by("Order ORD-93411 ships Friday."));
        assert!(!id.carried_by("Order ORD-934112 ships Friday."));
        // A slot's value needs its slot named, however long.
        let budget = pin(Some("budget"), FactKind::Stated, "1,250 EUR");
        assert!(budget.carried_by("Budget: 1,250 EUR"));
        assert!(!budget.carried_by("Paid 1,250 EUR for the sofa."));
    }

    #[test]
    fn the_block_lists_missing_pins_and_drops_sentences_before_values() {
        let pin = |id, v: &str| Pin {
            id,
            turn_index: 2,
            kind: FactKind::Stated,
            slot: Some("budget".into()),
            value: v.into(),
            sentence: format!("My budget is {v}."),
            source: FactSource::User,
            supersedes: None,
            superseded_value: Some("900 EUR".into()),
            window: 0,
        };
        let pins = [pin(1, "1,250 EUR")];
        assert!(missing(&pins, "the budget is 1,250 EUR").is_empty());
        let m = missing(&pins, "no budget here");
        let (b, over) = render_block(&m, 1_000);
        assert_eq!(
            b,
            "## Pinned facts\n- [turn 2] budget: 1,250 EUR (replaces 900 EUR) | \"My budget is 1,250 EUR.\""
        );
        assert!(!over);
        let (b, over) = render_block(&m, 70);
        assert_eq!(
            b,
            "## Pinned facts\n- [turn 2] budget: 1,250 EUR (replaces 900 EUR)"
        );
        assert!(!over);
        let (b, over) = render_block(&m, 10);
        assert!(b.contains("1,250 EUR") && over);
    }

    #[test]
    fn folding_keeps_every_pin_live_for_good_and_the_newest_in_passing_that_fit() {
        let pin = |id: i64, window: u8, v: &str| Pin {
            id,
            turn_index: id,
            kind: if window == 0 {
                FactKind::Rule
            } else {
                FactKind::Id
            },
            slot: None,
            value: v.into(),
            sentence: v.into(),
            source: if window == 1 {
                FactSource::Tool
            } else {
                FactSource::User
            },
            supersedes: None,
            superseded_value: None,
            window,
        };
        let mut pins = vec![pin(0, 0, "Never ship on Sundays.")];
        for i in 1..=40 {
            pins.push(pin(i, 1 + (i % 2) as u8, &format!("ID-{i:03}")));
        }
        // Room for everything: nothing folds, the window is as given.
        let all = fold_to_share(pins.clone(), 100, Some(100_000));
        assert_eq!((all.pins.len(), all.window, all.folded), (41, 100, 0));
        // A share that holds the rule and some of each window.
        let f = fold_to_share(pins.clone(), 100, Some(300));
        assert!(f.window > 0 && f.window < 20, "{}", f.window);
        assert_eq!(f.folded, 40 - 2 * f.window);
        assert!(
            bare_block_chars(&f.pins) <= 300,
            "{}",
            bare_block_chars(&f.pins)
        );
        assert!(f.pins.iter().any(|p| p.window == 0));
        // The newest of each window stay.
        assert!(f.pins.iter().any(|p| p.value == "ID-040"));
        assert!(f.pins.iter().any(|p| p.value == "ID-039"));
        assert!(!f.pins.iter().any(|p| p.value == "ID-001"));
        // The rule alone over the share: kept, and nothing in passing.
        let f = fold_to_share(pins, 100, Some(20));
        assert_eq!((f.pins.len(), f.window, f.folded), (1, 0, 40));
        let f = fold_to_share(vec![pin(0, 0, "Never ship on Sundays.")], 100, Some(20));
        assert_eq!((f.pins.len(), f.window, f.folded), (1, 0, 0));
    }

    #[test]
    fn values_in_passing_share_a_line_per_kind_and_the_oldest_sentences_go_first() {
        let pin = |id, source, kind, slot: Option<&str>, v: &str| Pin {
            id,
            turn_index: id,
            kind,
            slot: slot.map(str::to_string),
            value: v.into(),
            sentence: format!("said {v}"),
            source,
            supersedes: None,
            superseded_value: None,
            window: window_group(kind, slot.is_some(), source),
        };
        let pins = [
            pin(1, FactSource::User, FactKind::Stated, Some("size"), "M"),
            pin(2, FactSource::Tool, FactKind::Id, None, "tx_1"),
            pin(3, FactSource::Assistant, FactKind::Amount, None, "9 EUR"),
            pin(4, FactSource::User, FactKind::Id, None, "ORD-4"),
            pin(5, FactSource::User, FactKind::Stated, Some("colour"), "red"),
            pin(6, FactSource::Tool, FactKind::Date, None, "2026-01-02"),
        ];
        let m: Vec<&Pin> = pins.iter().collect();
        let (b, over) = render_block(&m, 1_000);
        assert_eq!(
            b,
            "## Pinned facts\n- [turn 1] size: M | \"said M\"\n- [turn 5] colour: red | \"said red\"\n\
             - [turn 4] id: ORD-4 | \"said ORD-4\"\n\
             - [in passing] id: tx_1\n- [in passing] amount: 9 EUR\n- [in passing] date: 2026-01-02"
        );
        assert!(!over);
        // The sentence of what the user mentioned in passing goes first,
        // then the oldest stated ones'.
        let (b, _) = render_block(&m, b.chars().count() - 1);
        assert!(b.contains("said M") && !b.contains("said ORD-4"), "{b}");
        let (b, _) = render_block(&m, b.chars().count() - 1);
        assert!(
            b.contains("colour: red | \"said red\"") && !b.contains("said M"),
            "{b}"
        );
    }
}
