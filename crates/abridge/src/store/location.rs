//! Where a store lives, parsed once at the edge: a path is an SQLite file, a
//! `postgres://` or `postgresql://` URL a PostgreSQL server (the `postgres`
//! feature). Every opener takes one ([`crate::Store::open_with`], the
//! read-only snapshots, [`crate::admin::migrate_store`]); the command line
//! parses `--db` into one.

use std::path::{Path, PathBuf};

/// Where a store lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// An SQLite file.
    File(PathBuf),
    /// A PostgreSQL server: the URL as given (its `?schema=` included).
    Postgres(String),
}

impl Location {
    /// `s` read as a location: a `postgres://` or `postgresql://` URL names a
    /// server, anything else a file.
    pub fn parse(s: impl AsRef<Path>) -> Location {
        let p = s.as_ref();
        match p.to_str() {
            Some(u) if is_url(u) => Location::Postgres(u.to_string()),
            _ => Location::File(p.to_path_buf()),
        }
    }

    /// True for a server's store.
    pub fn is_server(&self) -> bool {
        matches!(self, Location::Postgres(_))
    }

    /// The location as a path: the file's, or the URL as one (what
    /// [`crate::Store::path`] returns, and what messages show).
    pub fn as_path(&self) -> &Path {
        match self {
            Location::File(p) => p,
            Location::Postgres(u) => Path::new(u),
        }
    }

    /// Shown as the user gave it (as [`Path::display`] shows a path).
    pub fn display(&self) -> &Location {
        self
    }

    /// The file's path (None: a server's store).
    pub fn file(&self) -> Option<&Path> {
        match self {
            Location::File(p) => Some(p),
            Location::Postgres(_) => None,
        }
    }

    /// The server's URL (None: a file).
    pub fn url(&self) -> Option<&str> {
        match self {
            Location::Postgres(u) => Some(u),
            Location::File(_) => None,
        }
    }
}

/// True when `db` is a PostgreSQL URL rather than a file path.
pub fn is_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

impl<P: AsRef<Path>> From<P> for Location {
    fn from(p: P) -> Location {
        Location::parse(p)
    }
}

impl From<&Location> for Location {
    fn from(l: &Location) -> Location {
        l.clone()
    }
}

impl std::str::FromStr for Location {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Location, Self::Err> {
        Ok(Location::parse(s))
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::File(p) => write!(f, "{}", p.display()),
            Location::Postgres(u) => f.write_str(u),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_a_server_and_anything_else_a_file() {
        assert_eq!(
            Location::parse("postgres://u@h/db?schema=s"),
            Location::Postgres("postgres://u@h/db?schema=s".into())
        );
        assert!(Location::from("postgresql://h/db").is_server());
        assert_eq!(
            Location::from(Path::new("a/b.db")),
            Location::File("a/b.db".into())
        );
        // A file whose name merely contains a scheme is a file.
        assert!(!Location::from("./postgres://x").is_server());
        assert_eq!(Location::from("x.db").to_string(), "x.db");
    }
}
