//! Opening files: a fresh file, a newer schema, a non-database, a foreign database.

use abridge::{Error, Store};

fn tmp() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("x.db");
    (d, p)
}

#[test]
fn fresh_file_gets_the_schema_and_its_version() {
    let (_d, p) = tmp();
    let store = Store::open(&p).unwrap();
    let (v, tables): (i64, i64) = store
        .with_conn(|c| {
            let v = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            let t = c.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN \
                 ('sessions','turns','steps','tool_invocations','compactions')",
                [],
                |r| r.get(0),
            )?;
            Ok((v, t))
        })
        .unwrap();
    assert_eq!((v, tables), (abridge::store::SCHEMA_VERSION, 5));
    // Opening again is a no-op.
    drop(store);
    Store::open(&p).unwrap();
}

#[test]
fn newer_schema_version_is_refused_naming_both_versions() {
    let (_d, p) = tmp();
    drop(Store::open(&p).unwrap());
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(c);
    let err = Store::open(&p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SchemaTooNew {
                found: 99,
                supported: 1
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("99") && msg.contains('1'), "{msg}");
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::SchemaTooNew { .. })
    ));
}

#[test]
fn non_database_file_is_refused_and_left_untouched() {
    let (_d, p) = tmp();
    let content =
        b"this is not a database, just some text that is long enough to look like a header....."
            .repeat(20);
    std::fs::write(&p, &content).unwrap();
    let err = Store::open(&p).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err}");
    assert_eq!(std::fs::read(&p).unwrap(), content);
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::NotADatabase { .. })
    ));
}

#[test]
fn foreign_sqlite_database_is_refused() {
    let (_d, p) = tmp();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch("CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('keep me');")
        .unwrap();
    drop(c);
    assert!(matches!(
        Store::open(&p),
        Err(Error::ForeignDatabase { .. })
    ));
    let c = rusqlite::Connection::open(&p).unwrap();
    let n: i64 = c
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn read_only_open_of_a_missing_file_does_not_create_it() {
    let (_d, p) = tmp();
    assert!(matches!(
        abridge::store::open_read_only(&p),
        Err(Error::NotFound { .. })
    ));
    assert!(!p.exists());
}

/// Regression: several processes opening one new file at once saw "database is
/// locked" (the switch to WAL fails without the busy handler) or a half-read
/// header taken for a foreign database (version and tables read in two snapshots).
#[test]
fn concurrent_first_opens_of_a_new_file_all_succeed() {
    for round in 0..30 {
        let (_d, p) = tmp();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
        let handles: Vec<_> = (0..6)
            .map(|_| {
                let (p, b) = (p.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    let store = Store::open(&p)?;
                    store.with_conn(abridge::store::demo::create_demo_tables)
                })
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap();
            assert!(r.is_ok(), "round {round}: {:?}", r.err());
        }
    }
}
