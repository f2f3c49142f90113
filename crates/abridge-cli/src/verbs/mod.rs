//! One file per verb: its arguments and its run.

pub(crate) mod approve;
pub(crate) mod args;
#[cfg(unix)]
pub(crate) mod chaos;
pub(crate) mod chat;
pub(crate) mod common;
pub(crate) mod compact;
pub(crate) mod demo;
pub(crate) mod erase;
pub(crate) mod export;
pub(crate) mod fork;
pub(crate) mod inspect;
pub(crate) mod migrate;
pub(crate) mod otlp;
pub(crate) mod rekey;
pub(crate) mod replay;
pub(crate) mod report;
pub(crate) mod serve;
pub(crate) mod upgrade;
pub(crate) mod verify;
