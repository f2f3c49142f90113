"""The peer workload, run against the libraries an agent host would pick instead of abridge.

Each turn is a user message, K tool steps (an assistant message with one tool call, then the
tool's result: 200 B to 4 KB, 50 KB every 25th) and a final assistant message. Per step a
library must durably append what the step produced and build the context for the next model
call. Every library uses WAL with the same `synchronous` setting, set explicitly.

    python peers.py LIB H K STEPS SYNC BUDGET_SECONDS [MAX_DB_GB]

LIB is `sqlite3` (a bare baseline with Python's own driver), `sqlitesession` (the OpenAI
Agents SDK's SQLiteSession) or `langgraph` (LangGraph's SQLite checkpointer). Prints one JSON
line. The baseline and SQLiteSession get their first H turns written in bulk, then STEPS
steps are timed at H. LangGraph stores the whole state at every checkpoint, so its history
cannot be written in bulk without changing what it stores: it runs turn by turn from zero,
and stops at H, when BUDGET_SECONDS run out, or when its database passes MAX_DB_GB
(default 16: it grows by megabytes per turn and would fill the disk), reporting the largest
H it reached. The temporary databases are removed at the end.
"""

import asyncio
import json
import os
import resource
import shutil
import sqlite3
import sys
import tempfile
import time


def result_size(n):
    return 50_000 if n % 25 == 24 else [200, 800, 2_000, 4_000, 1_200, 600][n % 6]


def turn_items(idx, k):
    """The items of turn idx, grouped by step: [[user], [call, result], ..., [final]]."""
    steps = [[{"role": "user", "content": f"Turn {idx}: where is order ORD-{10000 + idx} and can you ship to 10{idx % 1000:03d}?"}]]
    for s in range(k):
        call_id = f"call_{idx}_{s}"
        steps.append([
            {"type": "function_call", "call_id": call_id, "name": "lookup_order",
             "arguments": json.dumps({"order_id": f"ORD-{10000 + idx}"})},
            {"type": "function_call_output", "call_id": call_id,
             "output": "x" * result_size(idx * k + s)},
        ])
    steps.append([{"role": "assistant", "content": f"Order ORD-{10000 + idx} is in transit; shipping costs 7.50 EUR."}])
    return steps


def pct(v, p):
    v = sorted(v)
    return v[round((len(v) - 1) * p)]


def db_bytes(path):
    """The database's size once its WAL is checkpointed into it (a WAL file keeps
    its largest size until truncated, which would count pages twice)."""
    c = sqlite3.connect(path)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def bare_insert_ms(dirname, sync):
    """One transaction inserting a step's bytes, with Python's own driver."""
    conn = sqlite3.connect(os.path.join(dirname, "floor.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("CREATE TABLE f (id INTEGER PRIMARY KEY, a TEXT, b TEXT)")
    a, b, t = "x" * 300, "y" * 1500, []
    for _ in range(300):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO f (a, b) VALUES (?, ?)", (a, b))
        conn.execute("COMMIT")
        t.append((time.perf_counter() - t0) * 1e3)
    conn.close()
    return pct(t, 0.5)


class Baseline:
    """What a host writes by hand: one row per item, the context is every row."""

    def __init__(self, path, sync):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={sync}")
        self.conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, session TEXT, body TEXT)")
        self.conn.execute("CREATE INDEX items_session ON items (session, id)")

    def bulk(self, items):
        self.conn.execute("BEGIN")
        self.conn.executemany("INSERT INTO items (session, body) VALUES ('s', ?)", [(json.dumps(i),) for i in items])
        self.conn.execute("COMMIT")

    def append(self, items):
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany("INSERT INTO items (session, body) VALUES ('s', ?)", [(json.dumps(i),) for i in items])
        self.conn.execute("COMMIT")

    def context(self):
        return [json.loads(r[0]) for r in self.conn.execute("SELECT body FROM items WHERE session = 's' ORDER BY id")]


class Session:
    """The OpenAI Agents SDK's SQLiteSession."""

    def __init__(self, path, sync):
        from agents import SQLiteSession

        class Synced(SQLiteSession):
            @staticmethod
            def _configure_connection(conn):
                SQLiteSession._configure_connection(conn)
                conn.execute(f"PRAGMA synchronous={sync}")

        self.s = Synced("s", path)
        self.loop = asyncio.new_event_loop()

    def bulk(self, items):
        self.loop.run_until_complete(self.s.add_items(items))

    def append(self, items):
        self.loop.run_until_complete(self.s.add_items(items))

    def context(self):
        return self.loop.run_until_complete(self.s.get_items())


class Graph:
    """LangGraph with its SQLite checkpointer: one super-step per step."""

    def __init__(self, path, sync):
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import StateGraph, START, END
        from typing import Annotated, TypedDict
        import operator

        class State(TypedDict):
            items: Annotated[list, operator.add]

        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={sync}")
        saver = SqliteSaver(self.conn)
        g = StateGraph(State)
        g.add_node("step", lambda state: {})
        g.add_edge(START, "step")
        g.add_edge("step", END)
        self.graph = g.compile(checkpointer=saver)
        self.config = {"configurable": {"thread_id": "s"}}

    def append(self, items):
        self.graph.invoke({"items": items}, self.config)

    def context(self):
        return self.graph.get_state(self.config).values.get("items", [])


def main():
    lib, h, k, steps, sync, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].upper(), float(sys.argv[6])
    max_bytes = float(sys.argv[7] if len(sys.argv) > 7 else 16) * 1e9
    d = tempfile.mkdtemp()
    try:
        run(lib, h, k, steps, sync, budget, max_bytes, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def size_on_disk(path):
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def run(lib, h, k, steps, sync, budget, max_bytes, d):
    path = os.path.join(d, "peer.db")
    store = {"sqlite3": Baseline, "sqlitesession": Session, "langgraph": Graph}[lib](path, sync)
    started = time.perf_counter()
    reached = h
    if lib == "langgraph":
        # Turn by turn from zero: what it stores is what it stored along the way.
        reached = 0
        for idx in range(h):
            if time.perf_counter() - started > budget or size_on_disk(path) > max_bytes:
                break
            for items in turn_items(idx, k):
                store.append(items)
                store.context()
            reached = idx + 1
    else:
        batch = []
        for idx in range(h):
            for items in turn_items(idx, k):
                batch.extend(items)
            if len(batch) > 5_000:
                store.bulk(batch)
                batch = []
        if batch:
            store.bulk(batch)
    bytes_at_h = db_bytes(path)
    append_t, build_t, step_t = [], [], []
    idx = reached
    while len(step_t) < steps:
        for items in turn_items(idx, k):
            t0 = time.perf_counter()
            store.append(items)
            t1 = time.perf_counter()
            ctx = store.context()
            t2 = time.perf_counter()
            assert len(ctx) > 0
            append_t.append((t1 - t0) * 1e3)
            build_t.append((t2 - t1) * 1e3)
            step_t.append((t2 - t0) * 1e3)
        idx += 1
    bare = bare_insert_ms(d, sync)
    print(json.dumps({
        "lib": {"sqlite3": "python sqlite3 (bare)", "sqlitesession": "openai-agents SQLiteSession", "langgraph": "langgraph SqliteSaver"}[lib],
        "h": reached,
        "h_asked": h,
        "k": k,
        "append_p50_ms": pct(append_t, 0.5),
        "append_p99_ms": pct(append_t, 0.99),
        "build_p50_ms": pct(build_t, 0.5),
        "build_p99_ms": pct(build_t, 0.99),
        "step_p50_ms": pct(step_t, 0.5),
        "step_p99_ms": pct(step_t, 0.99),
        "db_bytes": bytes_at_h,
        "bytes_per_turn": bytes_at_h / max(reached, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "bare_insert_ms": bare,
        "relative_to_bare": pct(step_t, 0.5) / bare,
        "seconds": time.perf_counter() - started,
    }))


if __name__ == "__main__":
    main()
