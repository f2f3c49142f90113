"""The type stubs say what the methods return: each TypedDict in
`_abridge.pyi` has exactly the keys of the dicts the engine gives back."""

import ast
import asyncio
from pathlib import Path

import abridge
from test_runner import tool_model

STUB = Path(abridge.__file__).with_name("_abridge.pyi")


def typed_dicts():
    tree = ast.parse(STUB.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id == "TypedDict" for b in node.bases
        ):
            out[node.name] = [
                s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
            ]
    return out


def test_every_typed_dict_has_the_keys_the_engine_returns(tmp_path):
    async def rows():
        store = abridge.Store.open(str(tmp_path / "k.db"))
        refund = abridge.Tool("refund", lambda a, c: "ok", effect="at_most_once")
        gated = abridge.Runner(store, tool_model(["refund"]), tools=[refund], approval=["refund"])
        s = await gated.create_session("k", "gpt-4o", "sys")
        parked = await gated.run_turn_at(s["id"], 0, "my order is ORD-1")
        decided = await gated.decide(parked["pending"][0]["id"], "approve")
        runner = abridge.Runner(store, tool_model(["refund"]), tools=[refund], compact_at=200)
        out = await runner.run_turn_at(s["id"], 0, "my order is ORD-1")
        for i in range(1, 8):
            await runner.run_turn_at(s["id"], i, f"more about ORD-{i} in turn {i}")
        await runner.finish_background()
        await runner.pin(s["id"], "x", slot="y")
        turns = await store.turns(s["id"])
        steps = await store.steps(turns[0]["id"])
        report = await store.verify()
        other = await runner.create_session("gone", "gpt-4o", "sys")
        return {
            "SessionRow": s,
            "TurnRow": turns[0],
            "StepRow": steps[0],
            "CompactionRow": (await store.compactions(s["id"]))[0],
            "PinRow": (await store.pins(s["id"]))[0],
            "ApprovalRow": decided,
            "TurnOutcome": out,
            "Report": report,
            "Check": report["checks"][0],
            "SessionView": await store.view(s["id"]),
            "Rebuilt": await store.rebuild_step(steps[0]["id"]),
            "Deleted": await store.delete_session(other["id"]),
        }

    got = asyncio.run(rows())
    declared = typed_dicts()
    assert set(got) <= set(declared), set(got) - set(declared)
    for name, row in got.items():
        assert list(row) == declared[name], name
