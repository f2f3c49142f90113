"""Type stubs of the native module (the engine, wrapped)."""

from typing import Any, Awaitable, Callable, Literal, Optional, TypedDict, Union

Json = Any
Model = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


# The rows, as the dicts the methods return (the Rust row structs' fields).

class ParentLink(TypedDict):
    session_id: int
    kind: Literal['fork', 'delegate']
    turn: int
    call: Optional[str]

class SessionRow(TypedDict):
    id: int
    external_id: str
    model: str
    system_prompt: str
    config: str
    created_at: int
    redaction: int
    parent: Optional[ParentLink]
    base_compaction: Optional[int]

class TurnRow(TypedDict):
    id: int
    session_id: int
    idx: int
    input: str
    status: Literal['running', 'completed', 'failed']
    output: Optional[str]
    error: Optional[str]
    lease_owner: Optional[str]
    lease_epoch: int
    lease_expires_at: Optional[int]
    created_at: int
    finished_at: Optional[int]

class StepRow(TypedDict):
    id: int
    turn_id: int
    idx: int
    status: str
    compaction_id: Optional[int]
    messages_sha256: Optional[str]
    response: Optional[str]
    input_tokens: Optional[int]
    output_tokens: Optional[int]
    context_tokens: Optional[int]
    estimated: bool
    error: Optional[str]
    render_format: int
    summary_wait_ms: Optional[int]
    cache_read_tokens: Optional[int]
    cache_write_tokens: Optional[int]
    elided_steps: int

class CompactionRow(TypedDict):
    id: int
    session_id: int
    up_to_turn_index: int
    up_to_turn_id: int
    previous_id: Optional[int]
    status: Literal['pending', 'completed', 'failed']
    summary: Optional[str]
    summary_sha256: Optional[str]
    trigger: str
    focus: Optional[str]
    attempts: int
    lease_owner: Optional[str]
    lease_expires_at: Optional[int]
    model: Optional[str]
    prompt_sha256: Optional[str]
    trigger_tokens: Optional[int]
    tokens_before: Optional[int]
    tokens_after: Optional[int]
    input_tokens: Optional[int]
    output_tokens: Optional[int]
    summary_calls: int
    error: Optional[str]
    created_at: int
    completed_at: Optional[int]
    pins_live: Optional[int]
    pins_added: Optional[int]
    pins_window: Optional[int]
    background: bool
    threshold_tokens: Optional[int]
    soft_threshold_tokens: Optional[int]

class PinRow(TypedDict):
    id: int
    turn_index: int
    kind: str
    slot: Optional[str]
    value: str
    sentence: str
    source: str
    supersedes: Optional[int]
    superseded_value: Optional[str]
    window: int

class ApprovalRow(TypedDict):
    id: int
    session_id: int
    turn_id: int
    step_id: int
    position: int
    tool_call_id: str
    tool_name: str
    arguments: str
    effect: str
    kind: str
    status: Literal['pending', 'approved', 'rejected', 'delivered', 'abandoned']
    input: Optional[str]
    note: Optional[str]
    ok: Optional[bool]
    always: bool
    decided_by: Optional[str]
    created_at: int
    decided_at: Optional[int]

class TurnOutcome(TypedDict):
    output: str
    steps: int
    turn: TurnRow
    pending: list[ApprovalRow]
    parked: bool

class Check(TypedDict):
    name: str
    ok: bool
    checked: int
    violations: list[str]
    redacted: int

class VerifiedPoint(TypedDict):
    id: int
    at_ms: int
    steps_from: int
    compactions_from: int
    redactions: int
    erasures: int
    steps_checked: int
    compactions_checked: int

class Report(TypedDict):
    ok: bool
    checks: list[Check]
    notes: list[str]
    mode: Literal['full', 'incremental']
    since: Optional[VerifiedPoint]
    point: VerifiedPoint

class SessionView(TypedDict):
    compaction: Optional[CompactionRow]
    summary_message: Optional[str]
    turns: list[TurnRow]

class Rebuilt(TypedDict):
    sha256: str
    recorded: Optional[str]
    holds: bool

class Deleted(TypedDict):
    session_id: int
    external_id: str
    turns: int
    steps: int
    tool_invocations: int
    compactions: int
    pins: int
    children: list[str]
    checkpointed: bool

class AbridgeError(Exception): ...
class LeaseLost(AbridgeError): ...
class LeaseHeld(AbridgeError): ...
class SessionDeleted(AbridgeError): ...
class ContextOverflow(AbridgeError): ...
class TurnParked(AbridgeError): ...
class AlreadyDecided(AbridgeError): ...
class TurnRunning(AbridgeError): ...
class NotFound(AbridgeError): ...
class ModelFailed(AbridgeError): ...
class StoreError(AbridgeError): ...

class Store:
    @staticmethod
    def open(path_or_url: str, *, key: Optional[str] = None) -> "Store": ...
    def view(self, session_id: int) -> Awaitable[SessionView]: ...
    def pins(self, session_id: int) -> Awaitable[list[PinRow]]: ...
    def delete_session(self, key: Union[int, str]) -> Awaitable[Deleted]: ...
    def fork(self, key: Union[int, str], at_turn: int, new_id: str) -> Awaitable[SessionRow]: ...
    def children(self, key: Union[int, str]) -> Awaitable[list[SessionRow]]: ...
    def session(self, key: Union[int, str]) -> Awaitable[SessionRow]: ...
    def turns(self, session_id: int) -> Awaitable[list[TurnRow]]: ...
    def steps(self, turn_id: int) -> Awaitable[list[StepRow]]: ...
    def compactions(self, session_id: int) -> Awaitable[list[CompactionRow]]: ...
    def export(
        self, key: Union[int, str], format: Literal["markdown", "jsonl"] = "markdown"
    ) -> Awaitable[str]: ...
    def rebuild_step(self, step_id: int) -> Awaitable[Rebuilt]: ...
    def verify(self) -> Awaitable[Report]: ...

class Transaction:
    """The step's own transaction, lent to a transactional tool while it runs."""

    def execute(self, sql: str, params: Optional[list[Any]] = None) -> int: ...
    def query(self, sql: str, params: Optional[list[Any]] = None) -> list[tuple[Any, ...]]: ...

class Tool:
    def __init__(
        self,
        name: str,
        fn_: Optional[Callable[..., Any]] = None,
        *,
        description: str = "",
        input_schema: Optional[dict[str, Any]] = None,
        effect: Literal["idempotent", "at_most_once", "transactional", "deferred"] = "idempotent",
    ) -> None: ...
    @property
    def name(self) -> str: ...

class Events:
    def __aiter__(self) -> "Events": ...
    def __anext__(self) -> Awaitable[dict[str, Any]]: ...

class Provider:
    """A provider's client (see abridge.providers)."""

class OpenAIChat(Provider):
    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> None: ...

class OpenAIResponses(Provider):
    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> None: ...

class Anthropic(Provider):
    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
        timeout: Optional[float] = None,
        max_tokens: Optional[int] = None,
    ) -> None: ...

class Recorder(Provider):
    def __init__(self) -> None: ...

class Runner:
    def __init__(
        self,
        store: Store,
        model: Union[Model, Provider],
        *,
        tools: list[Tool] = ...,
        approval: Union[bool, list[str], None] = None,
        compact_at: Union[int, float, str, None] = None,
        context_window: Optional[int] = None,
        model_name: Optional[str] = None,
        summariser: Optional[Provider] = None,
        summary_model: Optional[str] = None,
        keep_last_turns: Optional[int] = None,
        background: Optional[bool] = None,
        stream: bool = False,
        compaction: Optional[dict[str, Any]] = None,
    ) -> None: ...
    def create_session(
        self, external_id: str, model: str, system_prompt: str
    ) -> Awaitable[SessionRow]: ...
    def run_turn(self, session_id: int, input: str) -> Awaitable[TurnOutcome]: ...
    def fork(self, session_id: int, at_turn: int, new_id: str) -> Awaitable[SessionRow]: ...
    def rewind(
        self, session_id: int, turn: int, new_id: str, input: str
    ) -> Awaitable[tuple[SessionRow, TurnOutcome]]: ...
    def run_turn_at(self, session_id: int, idx: int, input: str) -> Awaitable[TurnOutcome]: ...
    def resume_turn(self, turn_id: int) -> Awaitable[TurnOutcome]: ...
    def recoverable_turns(self) -> Awaitable[list[TurnRow]]: ...
    def compact_now(self, session_id: int, focus: Optional[str] = None) -> Awaitable[CompactionRow]: ...
    def finish_background(self) -> Awaitable[int]: ...
    def decide(
        self,
        call: int,
        what: Literal["approve", "reject", "deliver"],
        *,
        reason: Optional[str] = None,
        input: Optional[dict[str, Any]] = None,
        always: bool = False,
        result: Optional[str] = None,
        ok: bool = True,
        by: Optional[str] = None,
    ) -> Awaitable[ApprovalRow]: ...
    def abandon_turn(self, turn_id: int, reason: str) -> Awaitable[TurnRow]: ...
    def pending_calls(self, session_id: Optional[int] = None) -> Awaitable[list[ApprovalRow]]: ...
    def pin(self, session_id: int, value: str, slot: Optional[str] = None) -> Awaitable[int]: ...
    def preview_compaction(
        self, session_id: int, focus: Optional[str] = None
    ) -> Awaitable[dict[str, Any]]: ...
    def events(self) -> Events: ...
