"""The OpenAI Agents SDK (openai-agents 0.24.0) on its default model API (Responses) against a running
`serve`: a function tool round trip, not streamed and streamed; then its conversation session
(`OpenAIConversationsSession`, over /v1/conversations), a server-side `conversation_id` run, and the
tool round trip over its WebSocket transport (`responses_websocket_session`, GET /v1/responses). Run by tests/agents_sdk.rs: `python tests/agents_sdk_check.py URL`; exits non-zero on any failure."""
import asyncio
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIConversationsSession,
    Runner,
    function_tool,
    responses_websocket_session,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

client = AsyncOpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
set_default_openai_client(client, use_for_tracing=False)
set_tracing_disabled(True)
calls = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"It is sunny in {city}."


async def main():
    name = (await client.models.list()).data[0].id
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather. Use the get_weather tool.",
        tools=[get_weather],
        model=name,
        model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0),
    )
    r = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    assert calls, "the tool was not called"
    assert isinstance(r.final_output, str), r
    print("agents run:", calls, repr(r.final_output[:60]))
    n = len(calls)
    s = Runner.run_streamed(agent, "What is the weather in Rome?", max_turns=4)
    kinds = set()
    async for ev in s.stream_events():
        kinds.add(ev.type)
    assert len(calls) > n, "the streamed run did not call the tool"
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds, kinds
    print("agents streamed:", calls[n:], repr(str(s.final_output)[:60]))

    # the SDK's conversation session: history kept in /v1/conversations, read back before each turn
    plain = Agent(name="chat", instructions="Answer in one short sentence.", model=name,
                  model_settings=ModelSettings(max_tokens=256, temperature=0))
    session = OpenAIConversationsSession(openai_client=client)
    await Runner.run(plain, "My name is Alice.", session=session)
    await Runner.run(plain, "What is my name?", session=session)
    items = await session.get_items()
    roles = [i.get("role") for i in items]
    assert roles == ["user", "assistant", "user", "assistant"], items
    popped = await session.pop_item()
    assert popped["role"] == "assistant" and len(await session.get_items()) == 3
    await session.clear_session()
    print("agents conversation session:", roles)

    # a server-side conversation: the runner passes `conversation`, the server keeps the turns
    conv = await client.conversations.create()
    await Runner.run(plain, "My name is Bob.", conversation_id=conv.id)
    await Runner.run(plain, "What is my name?", conversation_id=conv.id)
    listed = await client.conversations.items.list(conv.id, order="asc")
    kinds = [getattr(i, "role", i.type) for i in listed.data]
    assert kinds == ["user", "assistant", "user", "assistant"], kinds
    await client.conversations.delete(conv.id)
    print("agents conversation_id:", kinds)

    # the SDK's WebSocket transport: the tool round trip over one socket to GET /v1/responses
    n = len(calls)
    async with responses_websocket_session(
        api_key="unused", base_url=sys.argv[1] + "/v1", openai_prefix_mode="model_id",
        unknown_prefix_mode="model_id",
    ) as ws:
        r = await ws.run(agent, "What is the weather in Oslo?", max_turns=4)
        assert len(calls) > n, "the tool was not called over the WebSocket"
        s = ws.run_streamed(agent, "What is the weather in Lima?", max_turns=4)
        async for _ in s.stream_events():
            pass
        assert len(calls) > n + 1, "the streamed run did not call the tool over the WebSocket"
    print("agents websocket:", calls[n:], repr(str(r.final_output)[:60]))


asyncio.run(main())
