#!/usr/bin/env python3
"""What the commits in an SQLite store's WAL wrote: frames a commit, and
which table or index each frame's page belongs to.

    python3 crates/abridge/benches/wal_frames.py COPY.db COPY.db-wal

COPY.db and COPY.db-wal are a copy of a store and of its WAL taken while the
store is open (after its last connection closes, SQLite checkpoints the WAL
and removes it), for example during a `many_sessions` run:

    cargo run --release --example many_sessions -- --sessions 1 --seconds 4 --db /tmp/w/m.db &
    sleep 2.5; cp /tmp/w/m.db /tmp/w/c.db; cp /tmp/w/m.db-wal /tmp/w/c.db-wal
    python3 crates/abridge/benches/wal_frames.py /tmp/w/c.db /tmp/w/c.db-wal

Only the frames written since the WAL last started over (those carrying the
salts of its header) are read; a commit is the run of frames ending at one
that records the database's size. A page is named by SQLite's `dbstat`
table (the `sqlite3` shell), read from the copy with its WAL, so pages
written after the copy was taken count as `?`. The WAL file is read before
`sqlite3` opens the copy (which may checkpoint it on closing).
"""

import collections
import struct
import subprocess
import sys


def commits_of(wal_bytes):
    """The page numbers of each commit's frames, in order."""
    if len(wal_bytes) < 32:
        return []
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(
        ">IIIIIIII", wal_bytes[:32]
    )
    commits, current, offset = [], [], 32
    while offset + 24 + page_size <= len(wal_bytes):
        page, db_size, s1, s2 = struct.unpack(">IIII", wal_bytes[offset : offset + 16])
        if (s1, s2) != (salt1, salt2):
            break
        current.append(page)
        if db_size:
            commits.append(current)
            current = []
        offset += 24 + page_size
    return commits


def page_names(db):
    out = subprocess.run(
        ["sqlite3", db, "SELECT pageno, name FROM dbstat"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {}
    for line in out.splitlines():
        page, name = line.split("|", 1)
        names[int(page)] = name
    return names


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    db, wal = sys.argv[1], sys.argv[2]
    with open(wal, "rb") as f:
        commits = commits_of(f.read())
    if not commits:
        sys.exit("no committed frames in " + wal)
    names = page_names(db)
    frames = sum(len(c) for c in commits)
    print(f"commits {len(commits)}, frames {frames}, frames a commit {frames / len(commits):.2f}")
    per_name = collections.Counter()
    shapes = collections.Counter()
    for commit in commits:
        named = [names.get(p, "?") for p in commit]
        per_name.update(named)
        shapes[tuple(sorted(collections.Counter(named).items()))] += 1
    print("\nframes a commit, by table or index:")
    for name, n in per_name.most_common():
        print(f"  {n / len(commits):6.2f}  {name}")
    print("\nthe commonest commits (how many, then the pages of each table or index):")
    for shape, n in shapes.most_common(12):
        print(f"  {n:6}  " + ", ".join(f"{name} {k}" for name, k in shape))


if __name__ == "__main__":
    main()
