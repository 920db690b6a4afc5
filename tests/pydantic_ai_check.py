"""pydantic-ai (pydantic-ai-slim[openai] 2.68.0, installed into .ci/venv by scripts/setup-test-deps.sh)
against a running serve, on its Responses model (what the "openai:<model>" shortcut uses): a plain run and
a structured output (pydantic-ai's output tool). Run by tests/pydantic_ai.rs:
`python tests/pydantic_ai_check.py URL [MODEL [tool]]`; exits non-zero on any failure. With `tool` (run
on Qwen2.5-0.5B: SmolLM2-135M calls the tool again after its result instead of answering) it checks the
free tool round trip instead, over both pydantic-ai models (Responses and Chat Completions): the tool
called once with the right argument, its result read into the final answer."""
import sys

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

client = AsyncOpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
name = sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m-instruct"
model = OpenAIResponsesModel(name, provider=OpenAIProvider(openai_client=client))

if sys.argv[3:] == ["tool"]:
    from pydantic_ai import UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel

    for kind in (OpenAIResponsesModel, OpenAIChatModel):
        agent = Agent(kind(name, provider=OpenAIProvider(openai_client=client)),
                      model_settings=ModelSettings(max_tokens=96, temperature=0),
                      system_prompt="Use the get_weather tool once, then answer the user in one sentence using its result.")
        calls = []

        @agent.tool_plain
        def get_weather(city: str) -> str:
            """The current weather in a city."""
            calls.append(city)
            return f"It is sunny and 21 degrees in {city}."

        r = agent.run_sync("What is the weather in Paris?", usage_limits=UsageLimits(request_limit=4))
        assert calls == ["Paris"], calls
        assert "sunny" in r.output, r.output
        print(f"tool round trip ({kind.__name__}):", calls, repr(r.output[:80]))
    sys.exit(0)
settings = ModelSettings(max_tokens=48, temperature=0)

r = Agent(model, model_settings=settings).run_sync("Say hello in one word.")
assert isinstance(r.output, str) and r.output, r
print("plain:", repr(r.output[:40]))

class Team(BaseModel):
    team: str


r = Agent(model, output_type=Team, model_settings=ModelSettings(max_tokens=96, temperature=0)).run_sync(
    "Which team handles a failed payout: billing or tech?")
assert isinstance(r.output, Team), r
print("structured:", r.output)
