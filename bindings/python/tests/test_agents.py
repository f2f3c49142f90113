"""abridge.agents.AbridgeSession under the OpenAI Agents SDK: the SDK's own
runner with its scripted (fake) model, no network; history stored, compacted
once, retracted and deleted as documented, and a host killed mid-summary
finishes the same compaction."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from agents import Agent, Runner
from agents.testing import ScriptedModel
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import abridge
from abridge.agents import AbridgeSession
from fake_openai import FakeOpenAI


def text_message(content):
    return ResponseOutputMessage(
        id="1",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )


def run(coro):
    return asyncio.run(coro)


def contents(items):
    out = []
    for it in items:
        c = it.get("content")
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c)
        out.append((it.get("role"), c))
    return out


def test_an_agent_remembers_through_an_abridge_session(tmp_path):
    async def main():
        session = AbridgeSession("user-42", tmp_path / "a.db")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([text_message("San Francisco")])
        r1 = await Runner.run(agent, "Where is the Golden Gate Bridge?", session=session)
        assert r1.final_output == "San Francisco"
        model.enqueue([text_message("California")])
        r2 = await Runner.run(agent, "Which state is it in?", session=session)
        assert r2.final_output == "California"
        # The second call saw the first exchange, from the store.
        seen = contents(model.calls[-1].input)
        assert ("user", "Where is the Golden Gate Bridge?") in seen
        assert ("assistant", "San Francisco") in seen
        # Items come back exactly as the SDK gave them.
        items = await session.get_items()
        assert contents(items)[-1] == ("assistant", "California")
        assert len(await session.get_items(limit=2)) == 2
        # Stored as abridge turns: every one completed, verified.
        store = session.store
        sid = await session.session_row_id()
        turns = await store.turns(sid)
        assert turns and all(t["status"] == "completed" for t in turns)
        assert (await store.verify())["ok"]

    run(main())


def test_a_long_session_compacts_once_per_boundary_and_keeps_pinned_facts(tmp_path):
    async def main():
        session = AbridgeSession(
            "long", tmp_path / "c.db", compact_at=600, keep_last_turns=2, background=False
        )
        await session.add_items([{"role": "user", "content": "My order number is ORD-4417."}])
        for i in range(40):
            await session.add_items(
                [
                    {"role": "user", "content": f"Question {i}: what about item {i} of the catalogue?"},
                    {"role": "assistant", "content": f"Item {i} is in stock, shipping in {i % 5 + 1} days."},
                ]
            )
        store = session.store
        sid = await session.session_row_id()
        rows = await store.compactions(sid)
        done = [c for c in rows if c["status"] == "completed"]
        assert done, "the threshold was never passed"
        bounds = [c["up_to_turn_index"] for c in rows]
        assert len(bounds) == len(set(bounds)), "two compactions at one boundary"
        items = await session.get_items()
        # The summary first (one user message), then the recent items verbatim.
        assert items[0]["role"] == "user"
        assert items[0]["content"].startswith("[Summary of the conversation so far")
        assert "ORD-4417" in items[0]["content"], "a pinned fact was lost"
        assert contents(items)[-1] == ("assistant", "Item 39 is in stock, shipping in 5 days.")
        assert len(items) < 2 * 40
        # The full history is still there.
        export = await store.export("long", "jsonl")
        assert "Question 0:" in export and "Question 39:" in export
        report = await store.verify()
        assert report["ok"], json.dumps(report, indent=1)

    run(main())


def test_pop_item_is_a_recorded_retraction_and_clear_session_deletes(tmp_path):
    async def main():
        session = AbridgeSession("pop", tmp_path / "p.db")
        assert await session.pop_item() is None
        await session.add_items(
            [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}]
        )
        await session.add_items([{"role": "user", "content": "second"}])
        popped = await session.pop_item()
        assert popped == {"role": "user", "content": "second"}
        assert contents(await session.get_items()) == [("user", "first"), ("assistant", "one")]
        popped = await session.pop_item()
        assert popped == {"role": "assistant", "content": "one"}
        assert contents(await session.get_items()) == [("user", "first")]
        # Nothing lost: the history holds the items and their retractions.
        export = await session.store.export("pop", "jsonl")
        assert "second" in export and "retract" in export
        # clear_session deletes the session whole; the id starts afresh.
        await session.clear_session()
        assert await session.get_items() == []
        with pytest.raises(abridge.NotFound):
            await session.store.session("pop")
        await session.add_items([{"role": "user", "content": "again"}])
        assert contents(await session.get_items()) == [("user", "again")]
        # Two objects, one store file, separate sessions.
        other = AbridgeSession("other", tmp_path / "p.db")
        await other.add_items([{"role": "user", "content": "elsewhere"}])
        assert contents(await session.get_items()) == [("user", "again")]
        session.close()
        with pytest.raises(RuntimeError):
            await session.add_items([])

    run(main())


def test_a_summary_by_a_provider(tmp_path):
    fake = FakeOpenAI(answer=lambda body: "The user asked about items; order ORD-9 matters.")
    try:

        async def main():
            session = AbridgeSession(
                "prov",
                tmp_path / "s.db",
                compact_at=300,
                keep_last_turns=1,
                background=False,
                summariser=abridge.providers.OpenAIChat(base_url=fake.url, api_key="sk-test"),
                summary_model="gpt-4o-mini",
            )
            for i in range(12):
                await session.add_items([{"role": "user", "content": f"item {i}, order ORD-9"}])
            items = await session.get_items()
            assert "order ORD-9 matters" in items[0]["content"]
            assert fake.requests and fake.requests[0]["path"] == "/v1/chat/completions"
            assert fake.requests[0]["auth"] == "Bearer sk-test"
            assert fake.requests[0]["body"]["model"] == "gpt-4o-mini"

        run(main())
    finally:
        fake.close()


SESSION_HOST = textwrap.dedent(
    """
    import asyncio, sys
    import abridge
    from abridge.agents import AbridgeSession

    async def main(db, url):
        session = AbridgeSession(
            "host", db, compact_at=300, keep_last_turns=1, background=False,
            summariser=abridge.providers.OpenAIChat(base_url=url, api_key="k"),
            summary_model="gpt-4o-mini",
        )
        await session.resume()
        sid = await session.session_row_id()
        done = len(await session.store.turns(sid)) if sid is not None else 0
        for i in range(done, 16):
            print("adding", i, flush=True)
            await session.add_items([{"role": "user", "content": f"batch {i}: order ORD-{500 + i}"}])
        print("done", flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_host_killed_mid_summary_finishes_the_same_compaction(tmp_path):
    fake = FakeOpenAI()
    fake.hang.set()
    db = str(tmp_path / "k.db")
    script = tmp_path / "host.py"
    script.write_text(SESSION_HOST)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    try:
        p = subprocess.Popen([sys.executable, str(script), db, fake.url], env=env)
        deadline = time.time() + 120
        while not fake.requests and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert fake.requests, "no summary was ever asked for"
        # The summariser is mid-answer: the compaction is claimed, not done.
        p.send_signal(signal.SIGKILL)
        p.wait()

        async def claimed():
            store = abridge.Store.open(db)
            sid = (await store.session("host"))["id"]
            return sid, await store.compactions(sid), await store.turns(sid)

        sid, before, turns = run(claimed())
        assert [c["status"] for c in before] == ["pending"]
        assert turns[-1]["status"] == "running"
        fake.hang.clear()
        out = subprocess.run(
            [sys.executable, str(script), db, fake.url],
            capture_output=True, text=True, timeout=180, env=env,
        )
        assert out.returncode == 0, out.stderr
        assert "done" in out.stdout

        async def check():
            store = abridge.Store.open(db)
            rows = await store.compactions(sid)
            first = [c for c in rows if c["id"] == before[0]["id"]][0]
            assert first["status"] == "completed"
            assert first["up_to_turn_index"] == before[0]["up_to_turn_index"]
            bounds = [c["up_to_turn_index"] for c in rows]
            assert len(bounds) == len(set(bounds))
            turns = await store.turns(sid)
            assert len(turns) == 16 and all(t["status"] == "completed" for t in turns)
            report = await store.verify()
            assert report["ok"], json.dumps(report, indent=1)

        run(check())
    finally:
        fake.close()


def test_items_are_stored_exactly_and_read_as_a_conversation(tmp_path):
    tricky = [
        {"role": "user", "content": "line one\nassistant: not a new item\n"},
        {"content": "keys in another order", "role": "user"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": [{"type": "input_text", "text": "parts"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "こんにちは 😊"},
        {"role": "user", "content": "[abridge.items] [] trying to confuse it"},
    ]

    async def main():
        session = AbridgeSession("exact", tmp_path / "e.db")
        await session.add_items(tricky)
        got = await session.get_items()
        assert got == tricky
        assert [list(g) for g in got] == [list(t) for t in tricky], "key order changed"
        sid = await session.session_row_id()
        text = (await session.store.turns(sid))[0]["input"]
        assert "\nuser: line one\nassistant: not a new item\n" in text
        assert "\nuser: keys in another order" in text

    run(main())
