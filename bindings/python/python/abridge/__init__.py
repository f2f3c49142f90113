"""abridge: durable, exactly-once context compaction for LLM agent hosts.

The engine (a Rust library) wrapped for asyncio hosts: a :class:`Store` (an
SQLite file or a ``postgres://`` URL) and a :class:`Runner` that runs turns
durably with a model that is an async callable. Every method that touches the
store returns an awaitable; the engine works with the GIL released.
"""

from ._abridge import (
    AbridgeError,
    AlreadyDecided,
    ContextOverflow,
    Events,
    LeaseHeld,
    LeaseLost,
    ModelFailed,
    NotFound,
    Runner,
    SessionDeleted,
    Store,
    StoreError,
    Tool,
    TurnParked,
    TurnRunning,
)
from . import providers

import atexit as _atexit
import time as _time


@_atexit.register
def _let_engine_threads_finish() -> None:
    """The engine's threads hand each result back to Python under the GIL
    (setting the awaitable's result, or seeing it cancelled). One caught
    midway when the interpreter starts to finalize would abort the process
    ("PyGILState_Release: thread state must be current"). At exit, before
    finalizing, the GIL is released a few times so that any such hand-off
    completes: 20 ms at most."""
    for _ in range(10):
        _time.sleep(0.002)

__all__ = [
    "AbridgeError",
    "AlreadyDecided",
    "ContextOverflow",
    "Events",
    "LeaseHeld",
    "LeaseLost",
    "ModelFailed",
    "NotFound",
    "Runner",
    "SessionDeleted",
    "Store",
    "StoreError",
    "Tool",
    "TurnParked",
    "TurnRunning",
    "providers",
]
