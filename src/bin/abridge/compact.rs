//! `abridge compact`: manual compaction from outside any running host.

use crate::args::whole_u32;
use crate::common::{must_exist, Failure};
use abridge::inspect;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `abridge compact`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: PathBuf,
    /// Session id or external id.
    #[arg(long)]
    pub session: String,
    /// What the summary should give priority to.
    #[arg(long)]
    pub focus: Option<String>,
    /// Most recent turns kept verbatim.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = whole_u32)]
    pub keep_last_turns: u32,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        session,
        focus,
        keep_last_turns,
    } = args;
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
