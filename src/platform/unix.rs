//! Unix: a file's identity.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// (device, inode) of the file at `path`; None when there is none.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
