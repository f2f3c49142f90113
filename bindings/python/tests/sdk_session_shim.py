"""A pytest plugin that runs the OpenAI Agents SDK's own session tests
(`tests/memory/test_session.py` of its source distribution, written for
`SQLiteSession`) with `abridge.agents.AbridgeSession` in `SQLiteSession`'s
place: `pytest -p sdk_session_shim tests/memory/test_session.py`.

The tests that reach into SQLiteSession's own implementation (its sqlite3
connections and worker threads, its tables written to directly, its file
locks, its error text) are deselected, each with its reason below; every
other test runs unchanged against abridge.
"""

import agents
import agents.memory
import pytest

from abridge.agents import AbridgeSession


class SessionUnderTest(AbridgeSession):
    """SQLiteSession's constructor, building an AbridgeSession."""

    def __init__(
        self,
        session_id,
        db_path=":memory:",
        sessions_table="agent_sessions",
        messages_table="agent_messages",
        session_settings=None,
    ):
        super().__init__(session_id, db_path, session_settings=session_settings)


agents.SQLiteSession = SessionUnderTest
agents.memory.SQLiteSession = SessionUnderTest

INTERNALS = {
    "test_sqlite_session_close_closes_worker_thread_connections": "SQLiteSession's per-thread sqlite3 connections",
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": "SQLiteSession's per-thread sqlite3 connections",
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation": "SQLiteSession's per-thread sqlite3 connections",
    "test_sqlite_session_keeps_connections_of_live_worker_threads": "SQLiteSession's per-thread sqlite3 connections",
    "test_sqlite_session_closed_rejects_empty_add_items": "matches SQLiteSession's own error text (AbridgeSession raises RuntimeError too)",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": "writes rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": "writes rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": "writes rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": "writes rows into SQLiteSession's agent_messages table",
    "test_sqlite_session_file_lock_is_shared_across_instances": "SQLiteSession's process-wide file locks",
    "test_sqlite_session_failed_add_items_releases_write_lock": "probes SQLiteSession's agent_sessions table",
    "test_sqlite_session_failed_clear_session_rolls_back": "drops SQLiteSession's tables",
    "test_sqlite_session_failed_pop_item_releases_write_lock": "drops SQLiteSession's tables",
    "test_sqlite_session_rollback_failure_evicts_connection": "replaces SQLiteSession's sqlite3 connection",
    "test_sqlite_session_close_retries_quarantined_connection": "replaces SQLiteSession's sqlite3 connection",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": "replaces SQLiteSession's sqlite3 connection",
}


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "SQLiteSession", None) not in (None, SessionUnderTest):
            raise pytest.UsageError(
                f"{module.__name__} imported SQLiteSession before the shim replaced it"
            )
        name = item.name.split("[")[0]
        (drop if name in INTERNALS else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config):
    lines = ["SQLiteSession is abridge.agents.AbridgeSession; deselected (SQLiteSession internals):"]
    lines += [f"  {name}: {why}" for name, why in INTERNALS.items()]
    return lines
