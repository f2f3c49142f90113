"""An OpenAI Agents SDK agent whose session abridge keeps and compacts.

Run: python examples/agents_session.py [STORE]   (default: agents.db here)

The SDK's scripted model stands in for a real one (no key, no network); put
a real model on the Agent and nothing else changes. After enough turns the
session compacts (offline summariser; pass `summariser=` and
`summary_model=` for a model-written one) and the agent sees the summary,
with the facts it pinned, then the recent items. Run it again: the session
goes on where it was.
"""

import asyncio
import sys

from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from abridge.agents import AbridgeSession


def reply(text):
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )


async def main(path):
    set_tracing_disabled(True)  # no trace export without a key
    session = AbridgeSession("user-42", path, compact_at=1_500, keep_last_turns=2)
    await session.resume()  # finishes a write a crash interrupted, if any
    model = ScriptedModel()
    agent = Agent(name="support", instructions="You are a support agent.", model=model)
    for i in range(30):
        model.enqueue([reply(f"Order ORD-{1200 + i} ships on day {i % 7 + 1}.")])
        await Runner.run(agent, f"When does my order ORD-{1200 + i} ship?", session=session)
    await session.runner.finish_background()
    items = await session.get_items()
    first = items[0]["content"]
    print(f"{len(items)} items in the agent's view; the first:\n{first[:300]}")
    sid = await session.session_row_id()
    done = [c for c in await session.store.compactions(sid) if c["status"] == "completed"]
    report = await session.store.verify()
    print(f"{len(done)} compactions; verify: {'ok' if report['ok'] else report}")
    if not report["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "agents.db"))
