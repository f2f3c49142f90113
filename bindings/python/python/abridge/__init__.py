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
