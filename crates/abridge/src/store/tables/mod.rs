//! The tables, one file per family: each holds its statements and the
//! functions over them (`rows` the row structs and status enums they read
//! into). Only these files, the schema and administration write SQL (and,
//! under the `testing` feature, the bench seeder, as these files would).

/// A statement's text built once from constant parts (a row's column list,
/// shared clauses), for `prepare_cached`: `format!` at every run would
/// allocate and build the text again before the statement cache looks it up.
macro_rules! sql_once {
    ($($arg:tt)*) => {{
        static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        SQL.get_or_init(|| format!($($arg)*)).as_str()
    }};
}

pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod compactions;
pub(crate) mod erasures;
pub(crate) mod history;
pub(crate) mod invocations;
pub(crate) mod leases;
pub(crate) mod pins;
pub(crate) mod redactions;
pub(crate) mod rows;
pub(crate) mod sessions;
pub(crate) mod steps;
pub(crate) mod turns;
