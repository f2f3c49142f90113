//! Administration: the operations that change what the history holds after
//! the fact (deleting and pruning sessions, redacting a secret, branching a
//! session into a fork) and that move a store (to a PostgreSQL server). They sit above the read side: each
//! rebuilds or looks sessions up the way `replay` and `inspect` do (a
//! redaction records the hash each changed step rebuilds to; a move checks
//! every step rebuilds on the server), and below the command line.
//!
//! The store's methods they add (`Store::delete_session`, `prune`,
//! `vacuum`, `checkpoint`, `redact`, `redaction_preview`, `fork`,
//! `children`) are defined here.

mod branch;
#[cfg(feature = "postgres")]
mod copy;
mod erase;
mod redact;

#[cfg(feature = "postgres")]
pub use copy::{migrate_store, Migrated};
pub use erase::{Deleted, IdleSession};
pub use redact::{Pattern, Redacted};
