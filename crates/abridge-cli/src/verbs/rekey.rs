//! `abridge rekey`: a copy of a store under a new key (or none).

use crate::common::{key, key_from, must_exist, Failure, KEY_VAR, NEW_KEY_VAR};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `abridge rekey`.
#[derive(clap::Args)]
pub struct Args {
    /// The store to copy (opened with the key in ABRIDGE_KEY, if any).
    #[arg(long)]
    pub db: PathBuf,
    /// The new file to write, encrypted with the key in ABRIDGE_NEW_KEY
    /// (unset or empty: not encrypted). Never overwritten.
    #[arg(long)]
    pub to: PathBuf,
}

/// Runs the verb.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    must_exist(&args.db.as_path().into())?;
    let (from, to) = (key()?, key_from(NEW_KEY_VAR)?);
    abridge::store::rekey_copy(&args.db, from.as_ref(), &args.to, to.as_ref())?;
    println!(
        "{} ({}) copied to {} ({})",
        args.db.display(),
        if from.is_some() {
            format!("encrypted, key from {KEY_VAR}")
        } else {
            "not encrypted".into()
        },
        args.to.display(),
        if to.is_some() {
            format!("encrypted, key from {NEW_KEY_VAR}")
        } else {
            "not encrypted".into()
        },
    );
    eprintln!(
        "to use it in place of {db}: stop every process using {db}, move {to} over it, \
         and delete {db}-wal and {db}-shm (they belong to the old file)",
        db = args.db.display(),
        to = args.to.display()
    );
    Ok(ExitCode::SUCCESS)
}
