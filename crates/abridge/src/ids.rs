//! Typed row ids, so a turn's id is never passed where a session's is meant.
//!
//! Each wraps the row's `INTEGER PRIMARY KEY`. They print, serialise and bind
//! to SQL as the bare number, compare with an `i64`, and convert from one
//! (`SessionId::from(7)`, as the command line does with what a user typed).

use rusqlite::types::{FromSql, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! row_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl $name {
            /// The number.
            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<i64> for $name {
            fn from(v: i64) -> Self {
                $name(v)
            }
        }

        impl From<$name> for i64 {
            fn from(v: $name) -> i64 {
                v.0
            }
        }

        impl PartialEq<i64> for $name {
            fn eq(&self, other: &i64) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for i64 {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.0))
            }
        }

        impl FromSql for $name {
            fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
                i64::column_result(v).map($name)
            }
        }
    };
}

row_id!(
    /// A session's row id (not its external id, which is the host's own).
    SessionId
);
row_id!(
    /// A turn's row id (not its index in the session).
    TurnId
);
row_id!(
    /// A step's row id (what `abridge replay --step` takes).
    StepId
);
row_id!(
    /// A compaction's row id.
    CompactionId
);
row_id!(
    /// A tool invocation's row id.
    InvocationId
);
row_id!(
    /// A tool call waiting for a decision or a result: its `approvals` row
    /// id (what `abridge approve --call` takes). Never reused, not even
    /// after its session is deleted.
    CallId
);
