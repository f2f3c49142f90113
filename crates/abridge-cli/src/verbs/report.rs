//! `abridge report`: a session, or the whole store, as a self-contained HTML page.

use crate::common::Failure;
use abridge::store::Location;
use abridge::Threshold;
use abridge_cli::report::{self, ReportOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `abridge report`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
    /// Session id or external id: its page. Without it, the store's page,
    /// with one page per session written beside it and linked.
    #[arg(long)]
    pub session: Option<String>,
    /// Where to write the page (a session's page goes to stdout without it;
    /// the store's page needs it).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// The hard threshold, in tokens, drawn as a line (default: the one the
    /// store recorded when the session's newest compaction was claimed).
    #[arg(long)]
    pub compact_at: Option<u64>,
    /// The soft (background) threshold as a share of `--compact-at`, drawn
    /// as a line (default: the recorded one).
    #[arg(long)]
    pub soft_share: Option<f64>,
    /// The model's context window, in tokens (default: the built-in table's
    /// for the session's model, if it knows it).
    #[arg(long)]
    pub window: Option<u64>,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let soft = match (args.compact_at, args.soft_share) {
        (_, Some(s)) if !(s > 0.0 && s < 1.0) => {
            return Err(Failure::usage(format!(
                "--soft-share must be in (0, 1), got {s}"
            )))
        }
        (Some(t), Some(s)) => Threshold::Fraction(s).tokens(Some(t)),
        (None, Some(_)) => return Err(Failure::usage("--soft-share needs --compact-at")),
        _ => None,
    };
    let opts = ReportOptions {
        threshold: args.compact_at,
        soft_threshold: soft,
        window: args.window,
    };
    let db = &args.db;
    match (&args.session, &args.out) {
        (Some(key), out) => {
            let html = crate::common::read_only(db, |c| report::session_page(c, key, &opts))
                .map_err(|e| Failure::session(key, e))?;
            match out {
                Some(path) => std::fs::write(path, html)?,
                None => print!("{html}"),
            }
        }
        (None, Some(out)) => {
            let written = crate::common::read_only(db, |c| {
                let page_of = |id: abridge::SessionId| session_file(out, id);
                let index = report::store_page(c, &|s| {
                    page_of(s.session.id)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })?;
                let mut pages = Vec::new();
                for s in abridge::inspect::sessions(c)? {
                    let key = format!("id:{}", s.session.id);
                    pages.push((page_of(s.session.id), report::session_page(c, &key, &opts)?));
                }
                Ok((index, pages))
            })?;
            let (index, pages) = written;
            std::fs::write(out, index)?;
            for (path, html) in &pages {
                std::fs::write(path, html)?;
            }
            eprintln!(
                "wrote {} and {} session pages beside it",
                out.display(),
                pages.len()
            );
        }
        (None, None) => {
            return Err(Failure::usage(
                "the store's page links one page per session, written beside it: give -o FILE \
                 (or --session ID for one session's page on stdout)",
            ))
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `report.html` → `report-session-7.html`, beside it.
fn session_file(out: &Path, id: abridge::SessionId) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".into());
    out.with_file_name(format!("{stem}-session-{}.html", id.0))
}
