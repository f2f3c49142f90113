"""A session for the OpenAI Agents SDK that abridge stores and compacts.

:class:`AbridgeSession` implements the SDK's ``Session`` protocol
(``get_items``, ``add_items``, ``pop_item``, ``clear_session``, with
``session_settings``), so it goes where ``SQLiteSession`` goes::

    from agents import Agent, Runner
    from abridge.agents import AbridgeSession

    session = AbridgeSession("user-42", "conversations.db")
    result = await Runner.run(agent, "Hello", session=session)

How the SDK's items live in abridge:

- Each ``add_items`` call is one abridge turn. Its input holds the items
  exactly and reads as a conversation: a header line (``[abridge.items]``
  and, as JSON, each item's role and length, or the whole item when it is
  not a plain ``{"role", "content"}`` message), then a line ``role:
  content`` per plain message. Its one step is a recording (the SDK ran the
  model, not abridge), so the threshold check, the compaction
  claim under ``UNIQUE (session, up_to_turn)``, leases, crash resumption and
  ``verify`` apply to it as to any turn.
- Once the history passes ``compact_at`` (tokens, or a fraction of
  ``model``'s window), a compaction folds the older turns into a summary
  (the offline summariser, or ``summariser``/``summary_model``), exactly
  once, finished by whoever comes next after a crash. From then on
  ``get_items`` returns the summary (with its pinned facts) as one user
  message, then the items of the turns after it. The full history stays in
  the store (``Store.export``).
- ``pop_item`` records a retraction (a turn ``{"retract": {"turn": T,
  "index": I}}``) and returns the item: it leaves the view, and the history
  keeps both the item and its retraction. Only an item after the newest
  summary can be popped: a summary never changes, so with nothing after it
  ``pop_item`` returns None.
- ``clear_session`` deletes the session whole (abridge's
  ``delete_session``: every row, recorded in ``erasures``); the next
  ``add_items`` starts a new session under the same id.

A crash (even ``SIGKILL``) in the middle of ``add_items`` leaves its turn
running; the next write of any process resumes it (the same items, never
twice) before its own.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from ._abridge import (
    LeaseHeld,
    NotFound,
    Recorder,
    Runner,
    SessionDeleted,
    Store,
    TurnRunning,
)

if TYPE_CHECKING:
    from ._abridge import CompactionRow, SessionView

__all__ = ["AbridgeSession"]

_stores: Dict[str, Store] = {}
_stores_lock = threading.Lock()
_temp_dirs: List[str] = []


def _store_for(location: str, key: Optional[str]) -> Store:
    """One store per location and process, shared by its sessions."""
    with _stores_lock:
        store = _stores.get(location)
        if store is None:
            store = Store.open(location, key=key)
            _stores[location] = store
        return store


def _temporary_location() -> str:
    d = tempfile.mkdtemp(prefix="abridge-session-")
    _temp_dirs.append(d)
    return os.path.join(d, "session.db")


@atexit.register
def _remove_temporary_stores() -> None:
    for d in _temp_dirs:
        shutil.rmtree(d, ignore_errors=True)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


#: The first line of a turn that records items (see `_encode_items`).
_ITEMS_HEADER = "[abridge.items] "


def _encode_items(items: List[Any]) -> str:
    """Items as a turn's input, exactly and readably: a header line, then a
    line `role: content` for each plain message (a dict of exactly `role`
    and a str `content`), so that a summariser reads the conversation, not
    JSON. The header lists each item: `[role, length]` for a plain message
    (its content's length in characters, which makes the text after it
    unambiguous whatever it holds; a third element when its keys come
    content first), `{"item": ...}` with the item itself otherwise."""
    entries: List[Any] = []
    lines: List[str] = []
    for item in items:
        if (
            isinstance(item, dict)
            and set(item) == {"role", "content"}
            and isinstance(item["role"], str)
            and isinstance(item["content"], str)
            and "\n" not in item["role"]
        ):
            entry = [item["role"], len(item["content"])]
            if list(item)[0] == "content":
                entry.append("content-first")  # the dict's key order, kept
            entries.append(entry)
            lines.append(f"{item['role']}: {item['content']}")
        else:
            entries.append({"item": item})
    return _ITEMS_HEADER + _dumps(entries) + "".join("\n" + line for line in lines)


def _decode_items(text: str) -> Optional[List[Any]]:
    """The items `_encode_items` wrote (the same dicts, key order included);
    None for a turn that is not such a record."""
    if not text.startswith(_ITEMS_HEADER):
        return None
    header, _, rest = text.partition("\n")
    try:
        entries = json.loads(header[len(_ITEMS_HEADER) :])
    except ValueError:
        return None
    items: List[Any] = []
    pos = 0
    for e in entries:
        if isinstance(e, dict):
            items.append(e["item"])
            continue
        role, n = e[0], e[1]
        prefix = f"{role}: "
        if not rest.startswith(prefix, pos):
            return None
        start = pos + len(prefix)
        content = rest[start : start + n]
        if len(e) > 2:
            items.append({"content": content, "role": role})
        else:
            items.append({"role": role, "content": content})
        pos = start + n + 1  # the newline between lines
    return items


def _limit_of(settings: Any) -> Optional[int]:
    if settings is None:
        return None
    if isinstance(settings, dict):
        return settings.get("limit")
    return getattr(settings, "limit", None)


class AbridgeSession:
    """The Agents SDK's ``Session``, stored and compacted by abridge.

    Args:
        session_id: the SDK's session id (abridge's external id).
        db_path_or_url: an SQLite file (created if missing), a
            ``postgres://`` URL, or None / ``":memory:"`` for a temporary
            store removed at exit.
        session_settings: the SDK's ``SessionSettings`` (or a dict); its
            ``limit`` is ``get_items``' default.
        model: the model the agent runs, for a ``compact_at`` given as a
            fraction of its window.
        compact_at: when to compact: tokens (int), a fraction of
            ``model``'s window (float) or ``"off"``. Leave room for the
            agent's instructions, tools and answer.
        keep_last_turns: ``add_items`` calls kept verbatim after a
            compaction (the SDK makes about two a run: the input, then what
            the run produced).
        summariser, summary_model: a provider of :mod:`abridge.providers`
            and the model that writes summaries; neither: the offline
            summariser (no network, deterministic).
        background: compact in the background at 80 % of ``compact_at``
            (the engine's default) rather than only when it is reached.
        key: the passphrase of an encrypted store.
    """

    session_settings: Any
    #: Seconds a write waits for another writer of the same session.
    busy_timeout: float = 30.0

    def __init__(
        self,
        session_id: str,
        db_path_or_url: Union[str, Path, None] = None,
        *,
        session_settings: Any = None,
        model: str = "gpt-4o",
        compact_at: Union[int, float, str] = 0.5,
        keep_last_turns: int = 4,
        summariser: Any = None,
        summary_model: Optional[str] = None,
        background: bool = True,
        key: Optional[str] = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = self._coerce_settings(session_settings)
        if db_path_or_url is None or str(db_path_or_url) == ":memory:":
            location = _temporary_location()
        else:
            location = str(db_path_or_url)
        self.db_path_or_url = location
        self.model = model
        self._store = _store_for(location, key)
        self._runner = Runner(
            self._store,
            Recorder(),
            compact_at=compact_at,
            model_name=model,
            keep_last_turns=keep_last_turns,
            summariser=summariser,
            summary_model=summary_model,
            background=background,
        )
        self._sid: Optional[int] = None
        self._locks: Dict[int, asyncio.Lock] = {}
        self._closed = False

    @staticmethod
    def _coerce_settings(settings: Any) -> Any:
        try:
            from agents.memory.session_settings import (
                SessionSettings,
                coerce_session_settings,
            )
        except ImportError:  # the SDK is not installed: keep what was given
            return settings
        if settings is None:
            return SessionSettings()
        return coerce_session_settings(settings)

    @property
    def store(self) -> Store:
        """The abridge store the session lives in."""
        return self._store

    @property
    def runner(self) -> Runner:
        """The runner that records its turns (``compact_now``, ``pin``, events)."""
        return self._runner

    def _lock(self) -> asyncio.Lock:
        # One lock per event loop: run_sync drives the session from its own.
        loop = asyncio.get_running_loop()
        lock = self._locks.get(id(loop))
        if lock is None:
            lock = self._locks[id(loop)] = asyncio.Lock()
        return lock

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"session {self.session_id!r} is closed")

    async def _existing(self) -> Optional[int]:
        """The session's row id, None before its first write."""
        if self._sid is None:
            try:
                row = await self._store.session(self.session_id)
            except NotFound:
                return None
            self._sid = row["id"]
        return self._sid

    async def _created(self) -> int:
        """The session's row id, the session created if it is not yet."""
        if self._sid is None:
            row = await self._runner.create_session(self.session_id, self.model, "")
            self._sid = row["id"]
        return self._sid

    async def session_row_id(self) -> Optional[int]:
        """abridge's row id of the session (None before its first item)."""
        return await self._existing()

    async def _view(self) -> Optional[SessionView]:
        sid = await self._existing()
        if sid is None:
            return None
        try:
            return await self._store.view(sid)
        except (NotFound, SessionDeleted):
            self._sid = None
            return None

    async def _record(self, text: str) -> None:
        """Writes one turn with `text` as its input, resuming first any
        turn a crash left running; a session deleted by another instance
        is created again."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.busy_timeout
        pause = 0.002
        while True:
            sid = await self._created()
            try:
                await self._runner.run_turn(sid, text)
                return
            except TurnRunning:
                # A crash left a turn running (resumed here), or another
                # writer (a thread, a process) is recording one: wait for it.
                try:
                    await self._resume(sid)
                    continue
                except LeaseHeld:
                    pass
            except (NotFound, SessionDeleted):
                self._sid = None
                continue
            if loop.time() > deadline:
                raise TimeoutError(
                    f"session {self.session_id!r}: another writer held it for "
                    f"{self.busy_timeout} s"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    async def _resume(self, sid: int) -> bool:
        view = await self._store.view(sid)
        running = [t for t in view["turns"] if t["status"] == "running"]
        for t in running:
            await self._runner.resume_turn(t["id"])
        return bool(running)

    async def resume(self) -> bool:
        """Finishes the write a crash interrupted (its turn, and the
        compaction it was waiting for), if any: what a host calls at
        start-up. Any later write does it too. True if there was one."""
        self._check_open()
        async with self._lock():
            sid = await self._existing()
            if sid is None:
                return False
            return await self._resume(sid)

    @staticmethod
    def _items_of(view: SessionView) -> List[Tuple[int, int, Any]]:
        """The view's live items as ``(turn idx, index, item)``, oldest
        first, retractions applied."""
        out: List[Tuple[int, int, Any]] = []
        retracted = set()
        for turn in view["turns"]:
            if turn["status"] != "completed":
                continue
            recorded = _decode_items(turn["input"])
            if recorded is not None:
                for i, item in enumerate(recorded):
                    out.append((turn["idx"], i, item))
                continue
            try:
                payload = json.loads(turn["input"])
            except ValueError:
                payload = None
            if isinstance(payload, dict) and isinstance(payload.get("retract"), dict):
                r = payload["retract"]
                retracted.add((r.get("turn"), r.get("index")))
            else:
                # A turn a Runner ran (not recorded here): its input and answer.
                out.append((turn["idx"], 0, {"role": "user", "content": turn["input"]}))
                if turn.get("output"):
                    out.append((turn["idx"], 1, {"role": "assistant", "content": turn["output"]}))
        return [e for e in out if (e[0], e[1]) not in retracted]

    async def get_items(self, limit: Optional[int] = None) -> List[Any]:
        """The session's items as the agent should see them: the newest
        summary (one user message, pinned facts included) if there is one,
        then the items after it; the latest ``limit`` of them."""
        if limit is None:
            limit = _limit_of(self.session_settings)
        view = await self._view()
        if view is None:
            return []
        items: List[Any] = []
        if view["summary_message"] is not None:
            items.append({"role": "user", "content": view["summary_message"]})
        items.extend(item for (_, _, item) in self._items_of(view))
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items

    async def add_items(self, items: List[Any]) -> None:
        """Records the items as one turn (durable when this returns)."""
        self._check_open()
        if not items:
            return
        # Through JSON first: what is stored is what JSON can hold (a value
        # it cannot is a TypeError here, and nothing is written).
        text = _encode_items(json.loads(_dumps(list(items))))
        async with self._lock():
            await self._record(text)

    async def pop_item(self) -> Optional[Any]:
        """Retracts the most recent item after the newest summary and
        returns it (recorded: the history keeps it); None when there is
        none."""
        self._check_open()
        async with self._lock():
            view = await self._view()
            if view is None:
                return None
            live = self._items_of(view)
            if not live:
                return None
            turn, index, item = live[-1]
            await self._record(_dumps({"retract": {"turn": turn, "index": index}}))
            return item

    async def clear_session(self) -> None:
        """Deletes the session whole (recorded in ``erasures``); the next
        ``add_items`` starts it afresh under the same id."""
        async with self._lock():
            await self._runner.finish_background()
            try:
                await self._store.delete_session(self.session_id)
            except NotFound:
                pass
            self._sid = None

    async def compact_now(self, focus: Optional[str] = None) -> Optional[CompactionRow]:
        """Compacts the session now (a manual compaction; None when there
        is nothing to fold)."""
        sid = await self._existing()
        if sid is None:
            return None
        return await self._runner.compact_now(sid, focus)

    async def pin(self, value: str, slot: Optional[str] = None) -> int:
        """Pins a fact every later summary carries."""
        sid = await self._created()
        return await self._runner.pin(sid, value, slot)

    def close(self) -> None:
        """Closes the session object (the store stays open for others)."""
        self._closed = True
