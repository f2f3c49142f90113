//! The library half of the `abridge` command: the pieces its verbs are made
//! of that a test or another tool may call directly.
//!
//! - [`report`]: the self-contained HTML page of `abridge report`.

#![warn(missing_docs)]

pub mod report;
