"""A durable agent host in Python: the same loop as the Rust embedder.

Run: python examples/host.py [STORE]   (default: host.db in the current directory)
Killed at any instant and run again, it resumes the turn it was in and
finishes the summary it was making; no turn runs twice.
"""

import asyncio
import sys

import abridge


async def model(request):
    """Stands in for a provider: any async callable taking the request."""
    last = request["messages"][-1]["content"][0].get("text", "")
    return {
        "blocks": [{"type": "text", "text": f"Noted: {last[:40]}"}],
        "usage": {"input_tokens": 60 * len(request["messages"]), "output_tokens": 8},
    }


async def main(path):
    store = abridge.Store.open(path)
    runner = abridge.Runner(store, model, compact_at=2_000)
    for turn in await runner.recoverable_turns():  # what a crash left running
        await runner.resume_turn(turn["id"])
    session = await runner.create_session("user-42", "gpt-4o", "You are a helpful agent.")
    for i in range(40):  # the host numbers its turns: a rerun replays, never repeats
        out = await runner.run_turn_at(session["id"], i, f"Turn {i}: where is ORD-{1200 + i}?")
    await runner.finish_background()
    compactions = await store.compactions(session["id"])
    report = await store.verify()
    print(f"last answer: {out['output']}")
    print(f"{len(compactions)} compactions; guarantees hold: {report['ok']}")
    assert report["ok"]


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "host.db"))
