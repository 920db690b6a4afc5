"""The OpenAI Agents SDK (openai-agents 0.24.0) on its default model API (Responses) against a running
`serve`: a function tool round trip, not streamed and streamed. Run by tests/agents_sdk.rs: `python tests/agents_sdk_check.py URL`; exits non-zero on any failure."""
import asyncio
import sys

from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
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


asyncio.run(main())
