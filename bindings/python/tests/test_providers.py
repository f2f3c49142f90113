"""abridge.providers: the engine's own clients as a runner's model, against
a local stand-in for OpenAI's API (no network): the request as the provider
expects it, the answer stored, streaming pieces as events."""

import asyncio

import pytest

import abridge
from fake_openai import FakeOpenAI


@pytest.fixture
def fake():
    f = FakeOpenAI(answer=lambda body: f"The answer to: {body['messages'][-1]['content']}")
    yield f
    f.close()


def test_a_provider_is_the_runners_model(tmp_path, fake):
    async def main():
        store = abridge.Store.open(str(tmp_path / "p.db"))
        model = abridge.providers.OpenAIChat(base_url=fake.url, api_key="sk-local")
        assert "OpenAIChat" in repr(model)
        runner = abridge.Runner(store, model)
        s = await runner.create_session("p", "gpt-4o-mini", "Be brief.")
        out = await runner.run_turn_at(s["id"], 0, "hello")
        assert out["output"] == "The answer to: hello"
        req = fake.requests[-1]
        assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-local"
        assert req["body"]["model"] == "gpt-4o-mini"
        assert req["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
        steps = await store.steps(out["turn"]["id"])
        assert steps[0]["input_tokens"] == 11 and steps[0]["output_tokens"] == 7

    asyncio.run(main())


def test_a_streaming_runner_sends_the_pieces_as_events(tmp_path, fake):
    async def main():
        store = abridge.Store.open(str(tmp_path / "s.db"))
        model = abridge.providers.OpenAIChat(base_url=fake.url, api_key="k")
        runner = abridge.Runner(store, model, stream=True)
        events = runner.events()
        s = await runner.create_session("s", "gpt-4o-mini", "sys")
        out = await runner.run_turn_at(s["id"], 0, "stream this")
        assert fake.requests[-1]["body"]["stream"] is True
        pieces = []
        while True:
            e = await asyncio.wait_for(events.__anext__(), 5)
            if e["event"] == "model_delta" and e["delta"]["kind"] == "text":
                pieces.append(e["delta"]["text"])
            if e["event"] == "turn_finished":
                break
        assert len(pieces) >= 3
        assert "".join(pieces) == out["output"] == "The answer to: stream this"

    asyncio.run(main())


def test_a_provider_without_its_key_says_which_variable(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(abridge.AbridgeError, match="ANTHROPIC_API_KEY"):
        abridge.providers.Anthropic()
    with pytest.raises(ValueError):
        abridge.providers.OpenAIChat(timeout=-1)


def test_a_model_that_is_neither_callable_nor_a_provider_is_refused(tmp_path):
    store = abridge.Store.open(str(tmp_path / "n.db"))
    with pytest.raises(TypeError):
        abridge.Runner(store, "gpt-4o")
    with pytest.raises(ValueError):
        abridge.Runner(store, abridge.providers.OpenAIChat(api_key="k"), summary_model="x")
