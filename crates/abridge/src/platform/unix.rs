//! Unix: a file's identity.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// (device, inode) of the file at `path`; None when there is none.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Options that create a file readable and writable by its owner only
/// (0600), whatever the process's umask allows beyond that.
pub(crate) fn private_file(options: &mut std::fs::OpenOptions) {
    use std::os::unix::fs::OpenOptionsExt;
    options.mode(0o600);
}
