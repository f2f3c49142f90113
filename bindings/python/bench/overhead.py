"""What the Python package costs a host, in ratios measured in one run.

1. The same host in Rust and in Python: TURNS turns of one session, one
   step each, a model that answers at once, background compaction at 8,000
   tokens. Rust: `crates/abridge/examples/host_loop.rs` (built release);
   Python: `abridge.Runner` with an async callable as its model. Per-turn
   p50 and mean, and Python over Rust.
2. The Agents SDK's own runner with its scripted model, a session each way:
   `SQLiteSession` and `abridge.agents.AbridgeSession` on files, RUNS runs
   (each run: get_items, the scripted model, add_items twice). Per-run p50
   and mean, and AbridgeSession over SQLiteSession; and the session's own
   calls alone (get_items + add_items of one run's items, at H items of
   history), where the SDK's work does not dilute the difference.

    python bindings/python/bench/overhead.py [TURNS] [RUNS]

Needs the package and openai-agents installed, and cargo (it builds the
Rust host). Prints a table; the times are this machine's, the ratios are
the result.
"""

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import abridge
from abridge.agents import AbridgeSession

ROOT = Path(__file__).resolve().parents[3]


def summary(name, micros):
    micros = sorted(micros)
    return {
        "name": name,
        "n": len(micros),
        "p50_us": micros[len(micros) // 2],
        "mean_us": round(statistics.mean(micros), 1),
    }


def rust_host(db, turns):
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "abridge-engine", "--example", "host_loop"],
        cwd=ROOT,
        check=True,
    )
    exe = ROOT / "target" / "release" / "examples" / "host_loop"
    out = subprocess.run([str(exe), db, str(turns)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


async def python_host(db, turns):
    async def model(request):
        n = len(request["messages"])
        return {
            "blocks": [{"type": "text", "text": f"answer {n}"}],
            "usage": {"input_tokens": 40 * n, "output_tokens": 3},
        }

    store = abridge.Store.open(db)
    runner = abridge.Runner(store, model, compact_at=8000)
    s = await runner.create_session("host", "gpt-4o", "sys")
    micros = []
    for i in range(turns):
        t = time.perf_counter()
        await runner.run_turn_at(s["id"], i, f"turn {i}: order ORD-{7000 + i}")
        micros.append((time.perf_counter() - t) * 1e6)
    await runner.finish_background()
    return micros


async def sdk_runs(session, runs):
    from agents import Agent, Runner
    from agents.testing import ScriptedModel
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    model = ScriptedModel()
    agent = Agent(name="bench", model=model)
    micros = []
    for i in range(runs):
        model.enqueue(
            [
                ResponseOutputMessage(
                    id="1",
                    type="message",
                    role="assistant",
                    content=[
                        ResponseOutputText(
                            text=f"answer {i}", type="output_text", annotations=[], logprobs=[]
                        )
                    ],
                    status="completed",
                )
            ]
        )
        t = time.perf_counter()
        await Runner.run(agent, f"question {i}: order ORD-{7000 + i}", session=session)
        micros.append((time.perf_counter() - t) * 1e6)
    return micros


async def session_calls(session, runs):
    micros = []
    for i in range(runs):
        t = time.perf_counter()
        await session.get_items()
        await session.add_items([{"role": "user", "content": f"question {i}: order ORD-{7000 + i}"}])
        await session.add_items([{"role": "assistant", "content": f"answer {i}"}])
        micros.append((time.perf_counter() - t) * 1e6)
    return micros


def main():
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    from agents import SQLiteSession, set_tracing_disabled

    set_tracing_disabled(True)  # the same for both sessions: no trace export

    rows = []
    with tempfile.TemporaryDirectory() as d:
        rust = summary("host: Rust (host_loop)", rust_host(os.path.join(d, "r.db"), turns))
        py = summary("host: Python (abridge.Runner)", asyncio.run(python_host(os.path.join(d, "p.db"), turns)))
        rows += [rust, py]
        # Each workload over a fresh file per session kind, SQLiteSession first.
        pair = {}
        for workload, run_it in (("SDK run", sdk_runs), ("session calls", session_calls)):
            for kind, make in (("SQLiteSession", SQLiteSession), ("AbridgeSession", AbridgeSession)):
                path = os.path.join(d, f"{workload}-{kind}.db".replace(" ", "-"))
                row = summary(f"{workload}: {kind}", asyncio.run(run_it(make("bench", path), runs)))
                pair[(workload, kind)] = row
                rows.append(row)
    print(f"{'':34} {'n':>5} {'p50 µs':>9} {'mean µs':>9}")
    for r in rows:
        print(f"{r['name']:34} {r['n']:>5} {r['p50_us']:>9.0f} {r['mean_us']:>9.0f}")
    print()
    print(f"Python host / Rust host (p50):          {py['p50_us'] / rust['p50_us']:.2f}")
    for workload in ("SDK run", "session calls"):
        ratio = pair[(workload, "AbridgeSession")]["p50_us"] / pair[(workload, "SQLiteSession")]["p50_us"]
        print(f"AbridgeSession / SQLiteSession, {workload} (p50): {ratio:.2f}")


if __name__ == "__main__":
    main()
