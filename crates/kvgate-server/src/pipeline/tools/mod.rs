//! Tool calling: the OpenAI `tools` / `tool_choice` / `parallel_tool_calls` fields as serde types,
//! what the prompt says about the tools (the model's chat template when it renders tools, else a
//! Hermes-style system message, the one Qwen2.5 and NousResearch models are trained on), the grammar
//! that enforces `required` and a named function, and the parser that turns output into
//! `message.tool_calls`: `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks (as Qwen2.5 emits
//! them) or bare JSON naming a tool — an object, a list, one object per line, or any of these in a
//! Markdown code fence (as Qwen2.5-Coder writes them).

pub mod stream;

use kvgate_grammar::{json_options, lark_literal, GrammarSpec};
use kvgate_model::prompt::{
    FunctionCall, PromptTools, ToolCall, ToolCallKind, TOOL_CALL_CLOSE as CLOSE, TOOL_CALL_OPEN as OPEN,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::http::error::ApiError;

/// `tools[i]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Only `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A callable function.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema of its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode (the arguments always follow the schema when the grammar applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool calls; the tools are left out of the prompt.
    None,
    /// The model decides; calls are parsed from its output.
    Auto,
    /// At least one call, enforced by the grammar.
    Required,
    /// A call of this function, enforced by the grammar.
    Named(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamedChoice {
    #[serde(rename = "type")]
    kind: String,
    function: NamedFunction,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamedFunction {
    name: String,
}

/// A request's tools.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// The tools.
    pub tools: Vec<Tool>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls: true` was given: only then may a forced choice make more than one call
    /// (vLLM and OpenAI stop after the first complete call otherwise).
    pub parallel_explicit: bool,
}

/// A tool's argument schema with undeclared keys forbidden wherever the schema does not say: every
/// object schema without `additionalProperties` gets `false` (as OpenAI's strict tools and vLLM's
/// default grammar backend read a missing one), so a forced call never carries keys the tool does not
/// declare; a schema that sets it (`true` or a schema) keeps it.
pub fn closed(mut schema: Value) -> Value {
    fn walk(v: &mut Value, depth: usize) {
        if depth > 64 {
            return;
        }
        match v {
            Value::Object(o) => {
                let is_object = o
                    .get("type")
                    .is_some_and(|t| t == "object" || t.as_array().is_some_and(|a| a.contains(&json!("object"))))
                    || o.contains_key("properties");
                if is_object && !o.contains_key("additionalProperties") && !o.contains_key("patternProperties") {
                    o.insert("additionalProperties".into(), Value::Bool(false));
                }
                for (k, child) in o.iter_mut() {
                    if k != "const" && k != "enum" && k != "default" && k != "examples" {
                        walk(child, depth + 1);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|c| walk(c, depth + 1)),
            _ => {}
        }
    }
    walk(&mut schema, 0);
    schema
}

/// A call parsed from the output.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments as a JSON string (OpenAI's form).
    pub arguments: String,
}

fn serde_msg(e: serde_json::Error) -> String {
    e.to_string()
}
/// Checks chat's `tools`, `tool_choice` and `parallel_tool_calls`. `None` when no tool is offered (no
/// `tools`, an empty list, or `tool_choice: "none"`).
pub fn read(
    tools: Option<&Vec<Tool>>,
    tool_choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolSpec>, ApiError> {
    let choice = choice_of(tool_choice)?;
    spec(tools.cloned().unwrap_or_default(), choice, parallel)
}

impl ToolChoice {
    /// A choice given as a string: `none`, `auto` or `required`.
    pub fn of_mode(s: &str) -> Result<ToolChoice, ApiError> {
        match s {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::param(
                "tool_choice",
                format!("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}, got {other:?}"),
            )),
        }
    }
}

/// Chat's `tool_choice`: a mode or `{"type": "function", "function": {"name": …}}`.
fn choice_of(tool_choice: Option<&Value>) -> Result<ToolChoice, ApiError> {
    Ok(match tool_choice.filter(|v| !v.is_null()) {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => ToolChoice::of_mode(s)?,
        Some(v) => {
            let n: NamedChoice = serde_json::from_value(v.clone()).map_err(|e| {
                ApiError::param(
                    "tool_choice",
                    format!("'tool_choice' is not a named function: {}", serde_msg(e)),
                )
            })?;
            if n.kind != "function" {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("tool_choice.type must be \"function\", got {:?}", n.kind),
                ));
            }
            ToolChoice::Named(n.function.name)
        }
    })
}

/// Checks offered `tools` against a `choice` (every protocol's tools end here, in the shared types).
pub fn spec(tools: Vec<Tool>, choice: ToolChoice, parallel: Option<bool>) -> Result<Option<ToolSpec>, ApiError> {
    if tools.len() > 128 {
        return Err(ApiError::param(
            "tools",
            format!("'tools' may hold at most 128 tools, got {}", tools.len()),
        ));
    }
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::param(
                "tools",
                format!("tools[{i}].type must be \"function\", got {:?}", t.kind),
            ));
        }
        let n = &t.function.name;
        let ok = !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(ApiError::param(
                "tools",
                format!("tools[{i}].function.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -, got {n:?}"),
            ));
        }
        if tools[..i].iter().any(|u| &u.function.name == n) {
            return Err(ApiError::param(
                "tools",
                format!("tools[{i}]: the function name {n:?} appears twice"),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::param(
                    "tools",
                    format!("tools[{i}].function.parameters must be a JSON Schema object"),
                ));
            }
        }
    }
    let parallel_explicit = parallel == Some(true);
    match (&choice, tools.is_empty()) {
        (ToolChoice::Required | ToolChoice::Named(_), true) => {
            return Err(ApiError::param(
                "tool_choice",
                "'tool_choice' asks for a tool call but 'tools' offers none",
            ))
        }
        (ToolChoice::Named(n), false) if !tools.iter().any(|t| &t.function.name == n) => {
            return Err(ApiError::param(
                "tool_choice",
                format!("'tool_choice' names {n:?}, which is not among 'tools'"),
            ))
        }
        (_, true) | (ToolChoice::None, _) => return Ok(None),
        _ => {}
    }
    Ok(Some(ToolSpec {
        tools,
        choice,
        parallel_explicit,
    }))
}

impl PromptTools for ToolSpec {
    /// The tools as the chat template receives them (OpenAI's shape).
    fn template_tools(&self) -> Value {
        serde_json::to_value(&self.tools).unwrap_or(Value::Null)
    }

    /// The system text that describes the tools to a model whose template does not.
    fn fallback_system(&self) -> String {
        let lines: Vec<String> = self
            .tools
            .iter()
            .map(|t| serde_json::to_string(t).unwrap_or_default())
            .collect();
        format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
             For each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
            lines.join("\n")
        )
    }
}

impl ToolSpec {
    /// The grammar `required` and a named choice are held to: one call (`required` with
    /// `parallel_tool_calls`: one or more; a named function: exactly one, as vLLM and OpenAI give),
    /// each `<tool_call>\n{…}\n</tool_call>` with the function's name and arguments that follow its
    /// schema.
    pub fn grammar(&self) -> Option<GrammarSpec> {
        let which: Vec<&Tool> = match &self.choice {
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(n) => self.tools.iter().filter(|t| &t.function.name == n).collect(),
            ToolChoice::Auto | ToolChoice::None => return None,
        };
        let calls: Vec<Value> = which
            .iter()
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": t.function.name},
                        "arguments": closed(t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object"}))),
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let strict = which.iter().all(|t| t.function.strict.unwrap_or(false));
        let schema = json!({"anyOf": calls, "x-guidance": json_options(strict)});
        let open = lark_literal("<tool_call>\n");
        let close = lark_literal("\n</tool_call>");
        let more = if self.parallel_explicit && self.choice == ToolChoice::Required {
            format!("({} call)*", lark_literal("\n"))
        } else {
            String::new()
        };
        Some(GrammarSpec::Lark(format!(
            "start: call{more}\ncall: {open} %json {schema} {close}\n"
        )))
    }

    fn known(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.function.name == name)
    }

    /// The calls in `text` and the content left around them (`None` when only calls were there).
    /// Text that looks like a call but does not parse, or names no offered tool, stays content.
    pub fn parse(&self, text: &str) -> (Option<String>, Vec<ParsedCall>) {
        let mut calls = vec![];
        let mut content = String::new();
        let mut rest = text;
        while let Some(start) = rest.find(OPEN) {
            let after = &rest[start + OPEN.len()..];
            let (body, next, closed) = match after.find(CLOSE) {
                Some(end) => (&after[..end], &after[end + CLOSE.len()..], true),
                None => (after, "", false),
            };
            match self.call_of(body.trim()) {
                Some(c) => {
                    content.push_str(&rest[..start]);
                    calls.push(c);
                }
                // a call cut off by the limit is dropped, never left in the content
                None if !closed => content.push_str(&rest[..start]),
                None => content.push_str(&rest[..rest.len() - next.len()]),
            }
            rest = next;
        }
        content.push_str(rest);
        if calls.is_empty() {
            if let Some(c) = self.bare_json(text.trim()) {
                return (None, c);
            }
        }
        let content = if calls.is_empty() {
            Some(content)
        } else {
            let c = content.trim();
            (!c.is_empty()).then(|| c.to_string())
        };
        (content, calls)
    }

    /// A whole output that is calls as bare JSON: one call object, a list of them, or one per line
    /// (JSON Lines), optionally inside a Markdown code fence (as Qwen2.5-Coder writes them).
    fn bare_json(&self, t: &str) -> Option<Vec<ParsedCall>> {
        let t = unfence(t);
        if !(t.starts_with('{') || t.starts_with('[')) {
            return None;
        }
        let items = match serde_json::from_str::<Value>(t) {
            Ok(Value::Array(a)) => a,
            Ok(o) => vec![o],
            Err(_) => t
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l.trim()).ok())
                .collect::<Option<Vec<Value>>>()?,
        };
        let calls: Option<Vec<ParsedCall>> = items.iter().map(|i| self.call_value(i)).collect();
        calls.filter(|c| !c.is_empty())
    }

    pub(crate) fn call_of(&self, body: &str) -> Option<ParsedCall> {
        self.call_value(&serde_json::from_str(body).ok()?)
    }

    fn call_value(&self, v: &Value) -> Option<ParsedCall> {
        let name = v.get("name")?.as_str()?;
        if !self.known(name) {
            return None;
        }
        let args = v
            .get("arguments")
            .or_else(|| v.get("parameters"))
            .cloned()
            .unwrap_or(json!({}));
        let arguments = match args {
            Value::String(s) => s,
            other => serde_json::to_string(&other).ok()?,
        };
        Some(ParsedCall {
            name: name.to_string(),
            arguments,
        })
    }
}

/// The text inside a Markdown code fence (```` ```json … ``` ````), or `t` itself.
fn unfence(t: &str) -> &str {
    let Some(inner) = t.strip_prefix("```").and_then(|r| r.strip_suffix("```")) else {
        return t;
    };
    let inner = inner.strip_prefix("json").unwrap_or(inner);
    inner.trim()
}

/// Whether an output that starts like `t` may be bare-JSON calls (held back whole when streamed).
fn may_be_bare(t: &str) -> bool {
    t.starts_with('{') || t.starts_with('[') || t.starts_with("```")
}

/// A fresh tool-call id.
pub fn call_id() -> String {
    crate::ids::item_id("call")
}

/// Normalises an assistant message's `tool_calls` (OpenAI's shape; `arguments` is a JSON string) for
/// templates, which expect `arguments` as an object (as vLLM passes them).
pub fn normalize_tool_calls(v: &Value, at: &str) -> Result<Vec<ToolCall>, String> {
    let Some(arr) = v.as_array() else {
        return Err(format!("{at} must be a list"));
    };
    let mut out = vec![];
    for (j, c) in arr.iter().enumerate() {
        let f = c.get("function").and_then(Value::as_object);
        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(f), Some(name)) = (f, name) else {
            return Err(format!(
                "{at}[{j}] must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"
            ));
        };
        let args = match f.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
            Some(o @ Value::Object(_)) => o.clone(),
            None | Some(Value::Null) => json!({}),
            Some(_) => return Err(format!("{at}[{j}].function.arguments must be a JSON string")),
        };
        out.push(ToolCall {
            id: c.get("id").cloned().unwrap_or(Value::Null),
            kind: ToolCallKind::Function,
            function: FunctionCall {
                name: name.to_string(),
                arguments: args,
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
