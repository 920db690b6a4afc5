"""pydantic-ai (pydantic-ai-slim[openai] 2.68.0, installed into .ci/venv by scripts/setup-test-deps.sh)
against a running serve, on its Responses model (what the "openai:<model>" shortcut uses): a plain run and
a structured output (pydantic-ai's output tool). Run by tests/pydantic_ai.rs:
`python tests/pydantic_ai_check.py URL [MODEL]`; exits non-zero on any failure. (A free tool round trip is
not checked: both small models call the tool again after its result instead of answering.)"""
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
