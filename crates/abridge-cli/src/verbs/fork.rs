//! `abridge fork`: branch a session at one of its turns.

use crate::common::{must_exist, Failure};
use abridge::inspect;
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge fork`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file (or a postgres:// URL).
    #[arg(long)]
    pub db: Location,
    /// The session to fork: its id or external id.
    #[arg(long)]
    pub session: String,
    /// The fork point: the last of the session's turns the fork reads (a
    /// completed turn). To rewind turn N, fork at N - 1.
    #[arg(long, allow_negative_numbers = true)]
    pub at_turn: i64,
    /// The fork's external id.
    #[arg(long = "as", value_name = "NEW")]
    pub new_id: String,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let Args {
        db,
        session,
        at_turn,
        new_id,
        json,
    } = args;
    must_exist(&db)?;
    let store = crate::common::open_store(&db)?;
    let key = session.clone();
    let parent = store
        .call(move |c| inspect::resolve_session(c, &key))
        .await?;
    let fork = store
        .fork(parent.id, at_turn, &new_id)
        .await
        .map_err(|e| Failure::session(&session, e))?;
    if json {
        let out = serde_json::json!({
            "session": fork.external_id,
            "id": fork.id,
            "parent": parent.external_id,
            "parent_id": parent.id,
            "at_turn": at_turn,
            "next_turn": fork.first_own_turn(),
            "base_compaction": fork.base_compaction,
        });
        println!("{out}");
    } else {
        println!(
            "session {} (id {}) forked from {} at turn {}: it reads turns 0-{} where they are{}; \
             its next turn is {}",
            fork.external_id,
            fork.id,
            parent.external_id,
            at_turn,
            at_turn,
            fork.base_compaction
                .map(|c| format!(" and compaction {c}"))
                .unwrap_or_default(),
            fork.first_own_turn()
        );
    }
    Ok(ExitCode::SUCCESS)
}
