//! Responses-style input items as conversation turns, shared by every protocol that takes them
//! (`/v1/responses`, `/v1/decisions`): a function or custom tool call folds into the assistant turn it
//! belongs to, its output becomes a `tool` turn naming the call, and a custom tool call reads as a
//! function of one string `input`. The same items give the same messages, so the same rendered prefix,
//! whichever door they came in by. The typed items ([`super::item`]) are handed, in order, to the
//! one [`Folder`] by [`super::fold`], which also pairs every output with the call it answers.

use std::collections::HashMap;

use kvgate_model::prompt::{FunctionCall, Message, Role, ToolCall, ToolCallKind};
use serde_json::{json, Value};

use crate::pipeline::cache::{Marked, Ttl};

/// A plain turn.
pub(crate) fn turn(role: Role, content: String) -> Message {
    Message {
        role,
        content,
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

/// A tool's output, answering the call `call_id`.
pub(crate) fn tool_output(call_id: &str, content: String) -> Message {
    let mut m = turn(Role::Tool, content);
    m.tool_call_id = Some(call_id.to_string());
    m
}

/// Appends a call to the assistant turn it belongs to (the last message when it is the assistant's and
/// no tool answered since), or opens one.
pub(crate) fn push_call(msgs: &mut Vec<Message>, call: ToolCall) {
    match msgs.last_mut() {
        Some(m) if m.role == Role::Assistant => m.tool_calls.get_or_insert_with(Vec::new).push(call),
        _ => {
            let mut m = turn(Role::Assistant, String::new());
            m.tool_calls = Some(vec![call]);
            msgs.push(m);
        }
    }
}

fn call(call_id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: Value::String(call_id.to_string()),
        kind: ToolCallKind::Function,
        function: FunctionCall {
            name: name.to_string(),
            arguments,
        },
    }
}

/// A function call as templates read it (its arguments parsed when they are JSON).
pub(crate) fn function_call(call_id: &str, name: &str, arguments: &str) -> ToolCall {
    let args = serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()));
    call(call_id, name, args)
}

/// A custom tool call as templates read it: a function of one string `input`.
pub(crate) fn custom_call(call_id: &str, name: &str, input: &str) -> ToolCall {
    call(call_id, name, json!({ "input": input }))
}

/// What a call's body is.
pub(crate) enum CallBody<'a> {
    /// A function's arguments (JSON text).
    Function(&'a str),
    /// A custom tool's free-form input.
    Custom(&'a str),
}

/// How an output stands to the calls before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pairing {
    /// It answers an earlier call of its kind.
    Paired,
    /// No earlier call has its id.
    NoCall,
    /// Its id names a call of the other kind (a function call's output for a custom call, or back).
    OtherKind,
}

/// Items folded into a conversation, in order: messages as turns, calls into the assistant turn they
/// belong to, outputs as `tool` turns; the messages a prompt-cache breakpoint closes (each with its
/// own lifetime, if it names one); each call's id and kind, so that outputs are paired with their
/// calls.
pub(crate) struct Folder {
    msgs: Vec<Message>,
    marks: Vec<(usize, Option<Ttl>)>,
    /// Call id → whether the call was a custom tool's.
    calls: HashMap<String, bool>,
}

impl Folder {
    /// A conversation that starts with `msgs`.
    pub(crate) fn starting_with(msgs: Vec<Message>) -> Folder {
        Folder {
            msgs,
            marks: vec![],
            calls: HashMap::new(),
        }
    }

    /// A message; `mark` when it closes a reusable prefix.
    pub(crate) fn message(&mut self, role: Role, text: String, mark: Option<Option<Ttl>>) {
        self.msgs.push(turn(role, text));
        self.mark(mark);
    }

    /// A call the model made earlier; false when an earlier call had the same id (the call is folded
    /// in either way).
    pub(crate) fn call(&mut self, call_id: &str, name: &str, body: CallBody) -> bool {
        let (call, custom) = match body {
            CallBody::Function(args) => (function_call(call_id, name, args), false),
            CallBody::Custom(input) => (custom_call(call_id, name, input), true),
        };
        push_call(&mut self.msgs, call);
        self.calls.insert(call_id.to_string(), custom).is_none()
    }

    /// How an output of the call `call_id` (a custom tool's when `custom`) pairs with the calls so far.
    pub(crate) fn pairs(&self, call_id: &str, custom: bool) -> Pairing {
        match self.calls.get(call_id) {
            Some(&c) if c == custom => Pairing::Paired,
            Some(_) => Pairing::OtherKind,
            None => Pairing::NoCall,
        }
    }

    /// The output of the call `call_id`: a `tool` turn (whether it pairs is the wire's to check,
    /// [`Folder::pairs`]).
    pub(crate) fn output(&mut self, call_id: &str, text: String, mark: Option<Option<Ttl>>) {
        self.msgs.push(tool_output(call_id, text));
        self.mark(mark);
    }

    fn mark(&mut self, mark: Option<Option<Ttl>>) {
        if let Some(m) = mark {
            self.marks.push((self.msgs.len() - 1, m));
        }
    }

    /// The conversation so far.
    pub(crate) fn messages(&self) -> &[Message] {
        &self.msgs
    }

    /// The conversation and the messages that close a reusable prefix.
    pub(crate) fn finish(self) -> Marked {
        (self.msgs, self.marks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_fold_into_the_assistant_turn_and_outputs_pair_with_them() {
        let mut f = Folder::starting_with(vec![turn(Role::System, "s".into())]);
        f.message(Role::User, "weather?".into(), Some(Some(Ttl::Hours12)));
        assert!(f.call("c1", "get", CallBody::Function("{\"city\":\"Oslo\"}")));
        assert!(f.call("c2", "patch", CallBody::Custom("diff")));
        assert!(
            !f.call("c1", "get", CallBody::Function("{}")),
            "a reused id is reported"
        );
        assert_eq!(f.pairs("c1", false), Pairing::Paired);
        assert_eq!(f.pairs("c2", false), Pairing::OtherKind);
        assert_eq!(f.pairs("c2", true), Pairing::Paired);
        assert_eq!(f.pairs("c9", false), Pairing::NoCall);
        f.output("c1", "12C".into(), None);
        f.output("c2", "ok".into(), Some(None));
        let (msgs, marks) = f.finish();
        let roles: Vec<Role> = msgs.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool, Role::Tool]
        );
        // the three calls went into one assistant turn, arguments parsed when they are JSON
        let calls = msgs[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0].function.arguments, json!({"city": "Oslo"}));
        assert_eq!(calls[1].function.arguments, json!({"input": "diff"}));
        assert_eq!(msgs[4].tool_call_id.as_deref(), Some("c2"));
        assert_eq!(marks, [(1, Some(Ttl::Hours12)), (4, None)]);
    }

    #[test]
    fn a_call_after_a_tool_turn_opens_a_new_assistant_turn() {
        let mut f = Folder::starting_with(vec![]);
        f.call("a", "f", CallBody::Function("not json"));
        f.output("a", "1".into(), None);
        f.call("b", "f", CallBody::Function("{}"));
        let (msgs, _) = f.finish();
        assert_eq!(msgs.len(), 3);
        assert_eq!(msgs[2].role, Role::Assistant);
        let first = &msgs[0].tool_calls.as_ref().unwrap()[0];
        assert_eq!(first.function.arguments, Value::String("not json".into()));
    }
}
