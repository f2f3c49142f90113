//! `abridge upgrade`: migrates a store written by an older abridge to this
//! build's schema (the read-only verbs refuse an older store rather than
//! misread it).

use crate::common::{must_exist, Failure};
use abridge::store::Location;
use std::process::ExitCode;

/// Arguments of `abridge upgrade`.
#[derive(clap::Args)]
pub struct Args {
    /// Database file.
    #[arg(long)]
    pub db: Location,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    must_exist(&args.db)?;
    let before = abridge::store::read_only_version_keyed(&args.db, crate::common::key()?.as_ref())?;
    let store = crate::common::open_store(&args.db)?;
    let pins = store
        .with_conn(|c| c.query_row("SELECT count(*) FROM pins", [], |r| r.get::<_, i64>(0)))?;
    let now = abridge::store::SCHEMA_VERSION;
    if before == now {
        println!("{}: already at schema version {now}", args.db.display());
    } else if before < 3 {
        // Version 3 pinned the facts of the turns already stored.
        println!(
            "{}: schema version {before} -> {now} ({pins} facts pinned from earlier turns)",
            args.db.display()
        );
    } else {
        println!("{}: schema version {before} -> {now}", args.db.display());
    }
    Ok(ExitCode::SUCCESS)
}
