//! Tool reading, the fallback prompt, the forcing grammar and the output parser (whole and streamed).

use serde_json::json;

use super::stream::{CallStream, Piece};
use super::*;
use kvgate_model::prompt::{adapt_messages, Message, PromptTools, Role};

fn spec(choice: ToolChoice) -> ToolSpec {
    let tools: Vec<Tool> = serde_json::from_value(json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
         "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
    ]))
    .unwrap();
    ToolSpec {
        tools,
        choice,
        parallel_explicit: false,
    }
}

#[test]
fn parses_hermes_blocks_bare_json_and_leaves_the_rest_as_content() {
    let s = spec(ToolChoice::Auto);
    let (content, calls) = s.parse(
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>",
    );
    assert_eq!(content.as_deref(), Some("Let me check."));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(calls[1].arguments, r#"{"a":1,"b":2}"#);
    // An unterminated last block at EOS still counts.
    let (content, calls) = s.parse("<tool_call>\n{\"name\": \"add\", \"arguments\": {}}");
    assert_eq!((content, calls.len()), (None, 1));
    // Bare JSON, alone or a list; `parameters` is accepted for `arguments`.
    let (_, calls) = s.parse(r#" {"name": "add", "parameters": {"a": 3}} "#);
    assert_eq!(calls[0].arguments, r#"{"a":3}"#);
    let (_, calls) =
        s.parse(r#"[{"name": "add", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "X"}}]"#);
    assert_eq!(calls.len(), 2);
    // JSON Lines and Markdown fences (Qwen2.5-Coder's habits).
    let (_, calls) = s.parse("{\"name\": \"add\", \"arguments\": {}}\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}");
    assert_eq!(calls.len(), 2);
    let (content, calls) =
        s.parse("```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```");
    assert_eq!((content, calls[0].arguments.as_str()), (None, r#"{"city":"Paris"}"#));
    // Unknown tools and broken JSON stay content, untouched.
    for t in [
        "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>",
        "<tool_call>{broken</tool_call> tail",
        "{\"just\": \"json\"}",
        "plain text",
    ] {
        let (content, calls) = s.parse(t);
        assert!(calls.is_empty(), "{t}");
        assert_eq!(content.as_deref(), Some(t));
    }
}

fn stream_all(s: &ToolSpec, deltas: &[&str]) -> (String, Vec<ParsedCall>) {
    let mut cs = CallStream::default();
    let mut pieces = vec![];
    for d in deltas {
        pieces.extend(cs.push(s, d));
    }
    pieces.extend(cs.finish(s));
    let mut content = String::new();
    let mut calls = vec![];
    for p in pieces {
        match p {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
        }
    }
    (content, calls)
}

#[test]
fn the_stream_agrees_with_the_whole_parse_at_every_split() {
    let s = spec(ToolChoice::Auto);
    let texts = [
        "Sure <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
        "no calls here, just a < sign and <tool_ca",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
        "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 5}}</tool_call>",
    ];
    for t in texts {
        let (want_content, want_calls) = s.parse(t);
        let chars: Vec<char> = t.chars().collect();
        for step in [1, 2, 3, 5, 7, 100] {
            let deltas: Vec<String> = chars.chunks(step).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
            let (content, calls) = stream_all(&s, &refs);
            assert_eq!(calls, want_calls, "{t:?} by {step}");
            assert_eq!(
                content.trim(),
                want_content.as_deref().unwrap_or("").trim(),
                "{t:?} by {step}"
            );
        }
    }
}

#[test]
fn required_and_named_choices_compile_to_a_grammar() {
    assert!(spec(ToolChoice::Auto).grammar().is_none());
    let GrammarSpec::Lark(g) = spec(ToolChoice::Named("add".into())).grammar().unwrap() else {
        panic!()
    };
    assert!(g.contains("\"const\":\"add\"") && !g.contains("get_weather"), "{g}");
    // required without an explicit parallel_tool_calls: true: one call, then the grammar ends
    let one = spec(ToolChoice::Required);
    let GrammarSpec::Lark(g) = one.grammar().unwrap() else {
        panic!()
    };
    assert!(
        g.starts_with("start: call\n") && g.contains("get_weather") && g.contains("add"),
        "{g}"
    );
    let mut many = spec(ToolChoice::Required);
    many.parallel_explicit = true;
    let GrammarSpec::Lark(g) = many.grammar().unwrap() else {
        panic!()
    };
    assert!(g.starts_with("start: call(") && g.contains(" call)*"), "{g}");
    let tiny = std::sync::Arc::new(kvgate_model::tiny::tiny_tokenizer());
    let grammars = kvgate_grammar::Grammars::new(tiny.clone(), &[0], tiny.vocab_size()).unwrap();
    for c in [ToolChoice::Required, ToolChoice::Named("get_weather".into())] {
        grammars.compile(&spec(c).grammar().unwrap()).unwrap();
    }
}

/// A call cut off by the output limit is dropped (complete calls stay calls), streamed or not; it never
/// becomes content.
#[test]
fn a_call_cut_off_by_the_limit_never_becomes_content() {
    let s = spec(ToolChoice::Auto);
    let text = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_wea";
    let (content, calls) = s.parse(text);
    assert_eq!((content, calls.len()), (None, 1));
    let (content, calls) = s.parse("Let me check. <tool_call>\n{\"name\": \"get_weather\", \"argum");
    assert_eq!((content.as_deref(), calls.len()), (Some("Let me check. "), 0));
    for step in [1, 3, 7] {
        let mut cs = CallStream::default();
        let mut pieces = vec![];
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(step) {
            pieces.extend(cs.push(&s, &chunk.iter().collect::<String>()));
        }
        pieces.extend(cs.finish(&s));
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::Call(_))),
            "{pieces:?} by {step}"
        );
        assert_eq!(pieces.len(), 1);
    }
}

#[test]
fn history_is_rewritten_for_templates_without_tools() {
    let s = spec(ToolChoice::Auto);
    let calls = normalize_tool_calls(
        &json!([{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}]),
        "m",
    )
    .unwrap();
    assert_eq!(calls[0].function.arguments, json!({"a": 1}));
    let mut assistant = Message::text(Role::Assistant, "");
    assistant.tool_calls = Some(calls);
    let mut tool = Message::text(Role::Tool, "1");
    tool.tool_call_id = Some("call_1".into());
    let msgs = [Message::text(Role::User, "add 1"), assistant, tool];
    let out = adapt_messages(&msgs, Some(&s.fallback_system()));
    let arr = serde_json::to_value(&out).unwrap();
    assert_eq!(arr[0]["role"], "system");
    assert!(arr[0]["content"].as_str().unwrap().contains("<tools>"));
    assert_eq!(
        arr[2]["content"],
        "<tool_call>\n{\"name\":\"add\",\"arguments\":{\"a\":1}}\n</tool_call>"
    );
    assert_eq!(arr[3]["role"], "user");
    assert_eq!(arr[3]["content"], "<tool_response>\n1\n</tool_response>");
}

/// A forced call's argument schema forbids undeclared keys unless the schema allows them.
#[test]
fn tool_argument_schemas_are_closed_unless_they_say_otherwise() {
    let open = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}},
                      "c": {"type": "array", "items": {"type": "object"}}, "d": {"const": {"type": "object"}}}});
    let c = closed(open);
    assert_eq!(c["additionalProperties"], false);
    assert_eq!(c["properties"]["a"]["additionalProperties"], false);
    assert_eq!(c["properties"]["c"]["items"]["additionalProperties"], false);
    assert!(
        c["properties"]["d"]["const"].get("additionalProperties").is_none(),
        "values are not schemas"
    );
    let allowed = json!({"type": "object", "additionalProperties": true, "properties": {}});
    assert_eq!(closed(allowed.clone()), allowed);
    let GrammarSpec::Lark(g) = spec(ToolChoice::Named("add".into())).grammar().unwrap() else {
        panic!()
    };
    assert!(
        g.contains("\"b\":{\"type\":\"integer\"}},\"additionalProperties\":false}"),
        "{g}"
    );
}
