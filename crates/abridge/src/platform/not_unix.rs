//! Not Unix: a file has no inode to compare, so only its presence is checked.

use std::path::Path;

/// `(0, 0)` while a file is at `path`; None when there is none.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|_| (0, 0))
}

/// No mode bits off Unix: the file gets the directory's access control.
pub(crate) fn private_file(_options: &mut std::fs::OpenOptions) {}
