//! Everything that differs by operating system, and nothing else: the rest of
//! the library is portable. Linux gives a provable view of this machine's
//! processes (`/proc`: boot id, PID namespace, process start times), used to
//! take over a dead local holder's lease early; Unix gives a file's inode, used
//! to notice a store file deleted or replaced while open, and mode bits, to
//! create a store readable by its owner only. Elsewhere the fallbacks hold: a
//! lease is freed by its expiry, a store notices only a file that is gone,
//! and a new file gets its directory's access control.
//!
//! `crates/abridge-cli/tests/it/portable.rs` fails if a Unix-only API appears outside the gated
//! files of this module (and the Unix-only chaos harness and command line).

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub(crate) use linux::*;

#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
pub(crate) use other::*;

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub(crate) use unix::*;

#[cfg(not(unix))]
mod not_unix;
#[cfg(not(unix))]
pub(crate) use not_unix::*;
