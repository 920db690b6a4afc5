#!/usr/bin/env python3
"""Regenerates tests/fixtures/qwen-chat-template.json: the Qwen2.5-Coder GGUF's own chat template
(`tokenizer.chat_template`) rendered by Python's jinja2 exactly as transformers' `apply_chat_template`
renders it (sandboxed environment, trim_blocks + lstrip_blocks, its `tojson` and `raise_exception`), for
conversations with and without tools, tool calls and tool results. tests/gguf_serve.rs renders the
same conversations with kvgate's template engine and compares byte for byte.

    pip install gguf jinja2
    python3 scripts/chat-template-fixture.py ~/.cache/kvgate/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
"""
import hashlib
import json
import os
import sys

import gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the documentation.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                         "limit": {"type": "integer", "default": 5}},
                       "required": ["query"]}}},
]
CASES = [
    {"name": "user only (default system prompt)", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Write a haiku about rain."}]},
    {"name": "system and multi-turn", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "And 3+3? Answer in 日本語."}]},
    {"name": "no generation prompt", "add_generation_prompt": False,
     "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    {"name": "tools, user only", "add_generation_prompt": True, "tools": TOOLS,
     "messages": [{"role": "user", "content": "What's the weather in Zürich?"}]},
    {"name": "tools with system", "add_generation_prompt": True, "tools": TOOLS,
     "messages": [{"role": "system", "content": "You route questions to tools."},
                  {"role": "user", "content": "Find the docs on streaming."}]},
    {"name": "tool calls and results", "add_generation_prompt": True, "tools": TOOLS,
     "messages": [{"role": "user", "content": "Weather in Paris and Rome?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                      {"id": "call_2", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 18}"},
                  {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": 24}"}]},
]


def main():
    r = gguf.GGUFReader(sys.argv[1])
    source = r.fields["tokenizer.chat_template"].contents()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise Exception(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    t = env.from_string(source)
    out = {"template_sha256": hashlib.sha256(source.encode()).hexdigest(),
           "renderer": "jinja2 ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks), as transformers",
           "cases": []}
    for c in CASES:
        kw = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
              "bos_token": "", "eos_token": "<|im_end|>"}
        if "tools" in c:
            kw["tools"] = c["tools"]
        out["cases"].append(dict(c, rendered=t.render(**kw)))
    dst = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "qwen-chat-template.json")
    with open(dst, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
