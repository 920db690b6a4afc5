"""Structured outputs and tool calls with the clients agents use (openai 3.60.0, langchain-openai 1.8.1,
installed into .ci/venv by scripts/setup-test-deps.sh) against a running `serve` on the default model.
Run by tests/structured_clients.rs: `python tests/structured_clients_check.py URL`. Prints one line per
check; exits non-zero on any failure.

The default model (SmolLM2-135M) is small: where a check depends on what it chooses to say (LangChain's
json_mode, which only asks for some JSON object), it checks the transport and the JSON, not the model's
judgement."""
import json
import sys
from typing import Literal

import openai
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field

url = sys.argv[1] + "/v1"
client = OpenAI(base_url=url, api_key="unused")
name = client.models.list().data[0].id


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=50)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: Literal["Paris", "Oslo", "Lima"]
    unit: Literal["celsius", "fahrenheit"]


msgs = [{"role": "user", "content": "Name a large city and its country."}]

# 1. OpenAI SDK parse() with a Pydantic model (response_format json_schema, strict).
r = client.chat.completions.parse(model=name, messages=msgs, response_format=City, max_tokens=100, temperature=0)
city = r.choices[0].message.parsed
assert isinstance(city, City), r
print("openai parse(response_format=City):", city)

# 2. parse() with a strict tool, forced.
r = client.chat.completions.parse(
    model=name,
    messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    tools=[openai.pydantic_function_tool(GetWeather)],
    tool_choice="required",
    parallel_tool_calls=False,
    max_tokens=100,
    temperature=0,
)
m = r.choices[0].message
assert r.choices[0].finish_reason == "tool_calls", r
call = m.tool_calls[0]
assert call.function.name == "GetWeather" and isinstance(call.function.parsed_arguments, GetWeather), m
print("openai parse(tools=[GetWeather]):", call.function.parsed_arguments)

# 3. Streaming tool calls, reassembled by the SDK's stream helper.
with client.chat.completions.stream(
    model=name,
    messages=[{"role": "user", "content": "Weather in Oslo?"}],
    tools=[openai.pydantic_function_tool(GetWeather)],
    tool_choice={"type": "function", "function": {"name": "GetWeather"}},
    parallel_tool_calls=False,
    max_tokens=100,
    temperature=0,
) as s:
    final = s.get_final_completion()
call = final.choices[0].message.tool_calls[0]
assert isinstance(call.function.parsed_arguments, GetWeather) and call.id, final
print("openai stream + named tool:", call.function.parsed_arguments)

# 4. LangChain with_structured_output, all three methods.
llm = ChatOpenAI(base_url=url, api_key="unused", model=name, temperature=0, max_tokens=100)
for method in ["json_schema", "function_calling"]:
    out = llm.with_structured_output(City, method=method).invoke("Name a large city and its country.")
    assert isinstance(out, City), (method, out)
    print(f"langchain with_structured_output({method}):", out)
out = llm.with_structured_output(City, method="json_mode", include_raw=True).invoke(
    "Name a large city. Answer in JSON with the keys name, country and population_millions."
)
raw = out["raw"]
assert isinstance(raw, AIMessage) and isinstance(json.loads(raw.content), dict), out
print("langchain with_structured_output(json_mode):", raw.content, "parsed:", out["parsed"])


# 5. LangChain bind_tools: forced, streamed, and the conversation continued with the tool's result.
@tool
def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
    """Current weather in a city."""
    return f"sunny in {city}"


bound = llm.bind_tools([get_weather], tool_choice="get_weather")
ai = bound.invoke("What is the weather in Lima?")
assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather", ai
assert ai.tool_calls[0]["args"]["city"] in ("Paris", "Oslo", "Lima"), ai
print("langchain bind_tools invoke:", ai.tool_calls)
chunks = list(llm.bind_tools([get_weather], tool_choice="any").stream("Weather in Paris?"))
merged = chunks[0]
for c in chunks[1:]:
    merged = merged + c
assert merged.tool_calls and merged.tool_calls[0]["name"] == "get_weather", merged
print("langchain bind_tools stream:", merged.tool_calls)
follow = llm.bind_tools([get_weather]).invoke(
    [
        HumanMessage("What is the weather in Lima?"),
        ai,
        ToolMessage(get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"]),
    ]
)
assert isinstance(follow, AIMessage), follow
print("langchain tool result round trip:", repr(follow.content[:60]), follow.tool_calls)

# LangChain's OpenAIEmbeddings: its default tokenizes with tiktoken (downloaded at first use, and
# OpenAI's vocabulary, not the model's), so against any non-OpenAI server it is used with
# check_embedding_ctx_length=False, which sends the texts
from langchain_openai import OpenAIEmbeddings

emb = OpenAIEmbeddings(base_url=url, api_key="unused", model=name, check_embedding_ctx_length=False)
docs = emb.embed_documents(["The order shipped late.", "Refund the customer."])
query = emb.embed_query("The order shipped late.")
assert len(docs) == 2 and len(docs[0]) == len(query) > 0
assert max(abs(a - b) for a, b in zip(docs[0], query)) < 1e-6, "the same text embeds the same"
print("langchain embeddings:", len(docs), "documents,", len(query), "dimensions")
