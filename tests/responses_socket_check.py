"""openai-python's Responses WebSocket mode (`client.responses.connect()`, openai 3.60 with
`websockets`) against kvgate: a first turn streamed and parsed into the SDK's event types, a
`store: false` continuation with `previous_response_id` on the same connection, a tool-call turn whose
output goes back by `previous_response_id`, and the `error` event for an unknown previous response,
after which the connection still answers. Usage: responses_socket_check.py BASE_URL"""

import sys

from openai import OpenAI

base = sys.argv[1].rstrip("/")
client = OpenAI(api_key="unused", base_url=f"{base}/v1")


def turn(conn, **body):
    conn.response.create(**body)
    kinds = []
    for event in conn:
        kinds.append(event.type)
        if event.type in ("response.completed", "response.incomplete", "response.failed"):
            return kinds, event.response
        if event.type == "error":
            return kinds, event
    raise SystemExit("the connection closed mid-turn")


with client.responses.connect() as conn:
    model = client.models.list().data[0].id
    kinds, first = turn(conn, model=model, input="Say hello.", max_output_tokens=8, temperature=0,
                        store=False)
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert first.store is False, first
    text = "".join(c.text for item in first.output if item.type == "message" for c in item.content)
    print("first turn:", len(kinds), "events,", repr(text))

    kinds, second = turn(conn, model=first.model, input="Once more.", previous_response_id=first.id,
                         max_output_tokens=8, temperature=0, store=False)
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert second.previous_response_id == first.id, second
    print("continued on the connection:", second.id)

    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]
    kinds, called = turn(conn, model=first.model, input="Weather in Oslo?", tools=tools,
                         tool_choice={"type": "function", "name": "get_weather"},
                         max_output_tokens=40, temperature=0, store=False)
    calls = [i for i in called.output if i.type == "function_call"]
    assert calls and calls[0].name == "get_weather", called.output
    kinds, answered = turn(conn, model=first.model, previous_response_id=called.id, tools=tools,
                           input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                   "output": "12 C, rain"}],
                           max_output_tokens=8, temperature=0, store=False)
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    print("tool output continued:", answered.id)

    kinds, err = turn(conn, model=first.model, input="x", previous_response_id="resp_unknown")
    assert kinds == ["error"], kinds
    assert err.error.code == "previous_response_not_found", err
    print("error event:", err.error.code)

    kinds, last = turn(conn, model=first.model, input="Still there?", max_output_tokens=4, temperature=0)
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    print("ok")
