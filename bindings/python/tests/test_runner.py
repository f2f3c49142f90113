"""The package against the engine: turns run durably with a Python model,
read back, compacted, verified; errors arrive as the engine's kinds."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import abridge


def scripted_model():
    """An async model: the first step of a turn calls no tool, it answers
    with the user's words and a count of the messages it was sent."""

    async def model(request):
        assert set(request) >= {"model", "messages", "tools"}
        last = request["messages"][-1]
        text = " ".join(b.get("text", "") for b in last["content"])
        await asyncio.sleep(0)
        return {
            "blocks": [{"type": "text", "text": f"echo: {text} ({len(request['messages'])})"}],
            "usage": {"input_tokens": 50 * len(request["messages"]), "output_tokens": 5},
        }

    return model


def run(coro):
    return asyncio.run(coro)


def test_a_turn_runs_and_reads_back(tmp_path):
    async def main():
        store = abridge.Store.open(str(tmp_path / "a.db"))
        runner = abridge.Runner(store, scripted_model())
        s = await runner.create_session("user-42", "gpt-4o", "You are terse.")
        out = await runner.run_turn_at(s["id"], 0, "hello")
        assert out["output"] == "echo: hello (2)"
        assert out["parked"] is False and out["pending"] == []
        # The same turn again is the same turn, returned as it ended.
        again = await runner.run_turn_at(s["id"], 0, "hello")
        assert again["output"] == out["output"]
        turns = await store.turns(s["id"])
        assert [t["status"] for t in turns] == ["completed"]
        steps = await store.steps(turns[0]["id"])
        rebuilt = await store.rebuild_step(steps[0]["id"])
        assert rebuilt["holds"] and rebuilt["sha256"] == steps[0]["messages_sha256"]
        assert (await store.session("user-42"))["id"] == s["id"]
        assert "hello" in await store.export("user-42")
        report = await store.verify()
        assert report["ok"], report

    run(main())


def test_sessions_compact_and_verify(tmp_path):
    async def main():
        store = abridge.Store.open(str(tmp_path / "c.db"))
        runner = abridge.Runner(store, scripted_model(), compact_at=400)
        s = await runner.create_session("long", "gpt-4o", "sys")
        for i in range(12):
            await runner.run_turn_at(s["id"], i, f"turn {i}: order ORD-{1000 + i} please")
        await runner.finish_background()
        done = [c for c in await store.compactions(s["id"]) if c["status"] == "completed"]
        assert done, "the threshold was never passed"
        assert (await store.verify())["ok"]

    run(main())


def test_errors_are_the_engines_kinds(tmp_path):
    async def main():
        store = abridge.Store.open(str(tmp_path / "e.db"))
        runner = abridge.Runner(store, scripted_model())
        with pytest.raises(abridge.NotFound):
            await store.session("nobody")
        s = await runner.create_session("s", "gpt-4o", "sys")

        async def broken(request):
            return {"not": "a response"}

        bad = abridge.Runner(store, broken)
        with pytest.raises(abridge.AbridgeError):
            await bad.run_turn_at(s["id"], 0, "hi")
        assert issubclass(abridge.LeaseLost, abridge.AbridgeError)

    run(main())
    not_a_store = tmp_path / "notes.txt"
    not_a_store.write_text("not a database, not at all, " * 100)
    with pytest.raises(abridge.StoreError):
        abridge.Store.open(str(not_a_store))


HOST = textwrap.dedent(
    """
    import asyncio, sys
    import abridge

    async def model(request):
        await asyncio.sleep(0.05)
        n = len(request["messages"])
        return {"blocks": [{"type": "text", "text": f"answer {n}"}],
                "usage": {"input_tokens": 40 * n, "output_tokens": 3}}

    async def main(db):
        store = abridge.Store.open(db)
        runner = abridge.Runner(store, model, compact_at=300)
        for t in await runner.recoverable_turns():
            await runner.resume_turn(t["id"])
        s = await runner.create_session("host", "gpt-4o", "sys")
        for i in range(30):
            await runner.run_turn_at(s["id"], i, f"turn {i}: order ORD-{7000 + i}")
        await runner.finish_background()
        print("done", flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_python_host_killed_mid_turn_resumes_and_verifies(tmp_path):
    db = str(tmp_path / "k.db")
    script = tmp_path / "host.py"
    script.write_text(HOST)
    p = subprocess.Popen([sys.executable, str(script), db])
    # Killed once it has run a few turns.
    import time

    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.05)
        if os.path.exists(db) and p.poll() is None:
            async def count():
                try:
                    s = abridge.Store.open(db)
                    return len(await s.turns(1))
                except abridge.AbridgeError:
                    return 0

            if asyncio.run(count()) >= 5:
                break
    p.send_signal(signal.SIGKILL)
    p.wait()
    out = subprocess.run([sys.executable, str(script), db], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout

    async def check():
        store = abridge.Store.open(db)
        turns = await store.turns(1)
        assert [t["idx"] for t in turns] == list(range(30))
        assert all(t["status"] == "completed" for t in turns)
        report = await store.verify()
        assert report["ok"], json.dumps(report, indent=1)

    asyncio.run(check())


def tool_model(calls):
    """First step of a turn: call each tool of `calls`; then answer with the
    tool results it was shown."""

    async def model(request):
        last = request["messages"][-1]["content"]
        results = [b for b in last if b.get("type") == "tool_result"]
        if results:
            text = " | ".join(("error: " if r["is_error"] else "") + r["content"] for r in results)
            return {"blocks": [{"type": "text", "text": text}]}
        return {
            "blocks": [
                {"type": "tool_use", "id": f"c{i}", "name": n, "input": {"amount": 10 * (i + 1)}}
                for i, n in enumerate(calls)
            ]
        }

    return model


def test_tools_in_python_run_once_and_approvals_park_the_turn(tmp_path):
    seen = []

    def lookup(args, call):  # sync
        seen.append(("lookup", call["idempotency_key"]))
        return {"amount": args["amount"], "status": "ok"}

    async def refund(args, call):  # async
        seen.append(("refund", args["amount"]))
        return f"refunded {args['amount']}"

    async def main():
        store = abridge.Store.open(str(tmp_path / "t.db"))
        runner = abridge.Runner(
            store,
            tool_model(["lookup", "refund", "job"]),
            tools=[
                abridge.Tool("lookup", lookup),
                abridge.Tool("refund", refund, effect="at_most_once"),
                abridge.Tool("job", effect="deferred"),
            ],
            approval=["refund"],
        )
        events = runner.events()
        s = await runner.create_session("s", "gpt-4o", "sys")
        out = await runner.run_turn_at(s["id"], 0, "refund please")
        assert out["parked"]
        assert [p["tool_name"] for p in out["pending"]] == ["refund", "job"]
        assert [c["id"] for c in await runner.pending_calls()] == [p["id"] for p in out["pending"]]
        with pytest.raises(abridge.TurnParked):
            await runner.run_turn_at(s["id"], 1, "another")
        refund_call, job_call = out["pending"]
        await runner.decide(refund_call["id"], "approve", input={"amount": 5}, by="alice")
        with pytest.raises(abridge.AlreadyDecided):
            await runner.decide(refund_call["id"], "reject", reason="too late")
        await runner.decide(job_call["id"], "deliver", result="report ready")
        done = await runner.run_turn_at(s["id"], 0, "refund please")
        assert done["output"] == '{"amount":10,"status":"ok"} | refunded 5 | report ready'
        assert [name for name, _ in seen] == ["lookup", "refund"]
        kinds = []
        while True:
            e = await asyncio.wait_for(events.__anext__(), 5)
            kinds.append(e["event"])
            if e["event"] == "turn_finished":
                break
        assert "approval_requested" in kinds and "turn_parked" in kinds
        assert await runner.pin(s["id"], "12 Rue de Rivoli", slot="ship-to address") >= 0
        assert (await store.verify())["ok"]

    run(main())


def test_a_tool_that_raises_gives_the_model_an_error_result(tmp_path):
    def broken(args, call):
        raise RuntimeError("the service is down")

    async def main():
        store = abridge.Store.open(str(tmp_path / "r.db"))
        runner = abridge.Runner(
            store, tool_model(["lookup"]), tools=[abridge.Tool("lookup", broken)]
        )
        s = await runner.create_session("s", "gpt-4o", "sys")
        out = await runner.run_turn_at(s["id"], 0, "go")
        assert out["output"] == "error: the service is down"

    run(main())
    with pytest.raises(ValueError):
        abridge.Tool("x", effect="at_most_once")


def test_a_cancelled_task_leaves_the_turn_resumable(tmp_path):
    """Cancelling the task that runs a turn (what Ctrl-C does to
    asyncio.run) leaves the turn running and resumable: the next call of
    the same turn finishes it, with one model answer stored."""
    gate = {"hang": True}
    calls = []

    async def model(request):
        calls.append(len(request["messages"]))
        while gate["hang"]:
            await asyncio.sleep(0.01)
        return {"blocks": [{"type": "text", "text": "finally"}]}

    async def main():
        store = abridge.Store.open(str(tmp_path / "x.db"))
        runner = abridge.Runner(store, model)
        s = await runner.create_session("cancel", "gpt-4o", "sys")
        task = asyncio.ensure_future(runner.run_turn_at(s["id"], 0, "hello"))
        while not calls:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        turns = await store.turns(s["id"])
        assert [t["status"] for t in turns] == ["running"]
        gate["hang"] = False
        out = await runner.run_turn_at(s["id"], 0, "hello")
        assert out["output"] == "finally"
        turns = await store.turns(s["id"])
        assert [t["status"] for t in turns] == ["completed"]
        assert (await store.verify())["ok"]

    run(main())


def test_a_transactional_tool_writes_in_the_steps_own_transaction(tmp_path):
    """A transactional tool's writes commit with the record of its call, or
    not at all: a raised exception rolls them back (the model gets an error
    result); a resumed turn never runs a completed call again; the handle
    is refused once the call is over."""
    kept = []

    def reserve(tx, args, call):
        tx.execute("CREATE TABLE IF NOT EXISTS seats (seat TEXT PRIMARY KEY, call TEXT)")
        tx.execute("INSERT INTO seats VALUES (?, ?)", [f"seat-{args['amount']}", call["id"]])
        kept.append(tx)
        n = tx.query("SELECT count(*), max(seat) FROM seats")[0]
        if args["amount"] == 20:
            raise ValueError("no such seat")
        return {"seats": n[0], "last": n[1]}

    async def main():
        store = abridge.Store.open(str(tmp_path / "tx.db"))
        runner = abridge.Runner(
            store,
            tool_model(["reserve", "reserve"]),
            tools=[abridge.Tool("reserve", reserve, effect="transactional")],
        )
        s = await runner.create_session("tx", "gpt-4o", "sys")
        out = await runner.run_turn_at(s["id"], 0, "two seats")
        # The first call's row committed with its record; the second's raised
        # and rolled back, and the model saw the error.
        assert out["output"] == '{"last":"seat-10","seats":1} | error: no such seat'
        again = await runner.run_turn_at(s["id"], 0, "two seats")
        assert again["output"] == out["output"]
        assert len(kept) == 2, "a completed call ran again"
        with pytest.raises(abridge.AbridgeError, match="transaction is over"):
            kept[0].query("SELECT 1")
        assert (await store.verify())["ok"]

    run(main())
    import sqlite3

    rows = sqlite3.connect(str(tmp_path / "tx.db")).execute("SELECT seat FROM seats").fetchall()
    assert rows == [("seat-10",)]
    with pytest.raises(ValueError, match="sync"):

        async def nope(tx, args, call):
            return 1

        abridge.Tool("nope", nope, effect="transactional")


def test_compaction_settings_as_one_mapping(tmp_path):
    async def main():
        store = abridge.Store.open(str(tmp_path / "m.db"))
        runner = abridge.Runner(
            store,
            scripted_model(),
            compaction={"compact_at": 400, "keep_last_turns": 2, "background": False},
        )
        s = await runner.create_session("m", "gpt-4o", "sys")
        for i in range(12):
            await runner.run_turn_at(s["id"], i, f"turn {i}: order ORD-{1000 + i} please")
        rows = await store.compactions(s["id"])
        assert rows and all(not c["background"] for c in rows)
        view = await store.view(s["id"])
        # Two turns kept verbatim before the turn that compacted.
        assert len(view["turns"]) >= 3

    run(main())
    store = abridge.Store.open(str(tmp_path / "m2.db"))
    with pytest.raises(ValueError, match="twice"):
        abridge.Runner(store, scripted_model(), compact_at=100, compaction={"compact_at": 200})
    with pytest.raises(ValueError, match="no setting"):
        abridge.Runner(store, scripted_model(), compaction={"compact_after": 200})


def test_a_fork_reads_the_parents_turns_and_a_rewind_keeps_the_original(tmp_path):
    async def main():
        store = abridge.Store.open(str(tmp_path / "f.db"))
        runner = abridge.Runner(store, scripted_model())
        s = await runner.create_session("user-42", "gpt-4o", "You are terse.")
        for i, said in enumerate(["one", "two", "three"]):
            await runner.run_turn_at(s["id"], i, said)
        fork = await store.fork("user-42", 0, "user-42-branch")
        assert fork["parent"] == {"session_id": s["id"], "kind": "fork", "turn": 0, "call": None}
        out = await runner.run_turn(fork["id"], "another")
        assert out["turn"]["idx"] == 1
        turns = await store.turns(fork["id"])
        assert [t["input"] for t in turns] == ["one", "another"]
        again, redo = await runner.rewind(s["id"], 2, "user-42-redo", "THREE")
        assert again["parent"]["turn"] == 1 and redo["turn"]["input"] == "THREE"
        assert [t["input"] for t in await store.turns(s["id"])] == ["one", "two", "three"]
        kids = await store.children("user-42")
        assert [k["external_id"] for k in kids] == ["user-42-branch", "user-42-redo"]
        with pytest.raises(abridge.AbridgeError):
            await store.delete_session("user-42")
        report = await store.verify()
        assert report["ok"], report

    run(main())
