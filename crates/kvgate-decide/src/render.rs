//! The text of one read: the chat template (thinking off) around the state first, so that every read of
//! a request shares the state's prefix, then the question with its single-token labels and a closing
//! line asking for the label only.
//!
//! - A plain state: one user turn `"{state}\n\n{question}"` (after an optional system turn with the
//!   top-level `instructions`).
//! - A conversation state: the conversation's turns exactly as `/v1/chat/completions` renders them, and
//!   the question as one more user turn, so the follow-up chat completion over the same messages finds
//!   the whole conversation in the prefix cache.

use kvgate_model::prompt::{Message, Role};
use serde_json::{Map, Value};

use crate::spec::{Content, DecisionSpec, Question, State};

/// The labels of a choice of `n` options: `A`…`Z` up to 26, else numbers from 1 zero-padded to one
/// width (`01`…`64`, `001`…`255`), so that no label is a prefix of another.
pub fn choice_labels(n: usize) -> Vec<String> {
    if n <= 26 {
        (0..n).map(|i| ((b'A' + i as u8) as char).to_string()).collect()
    } else {
        let width = n.to_string().len();
        (1..=n).map(|i| format!("{i:0width$}")).collect()
    }
}

/// The question text of one read, with its labels (`yes`/`no`, `A`… or `01`…, `0`…).
pub fn question_text(q: &Question) -> String {
    text(q, false)
}

/// The marker standing for option line `k` in a `set` read's text ([`set_text`]).
pub fn marker(k: usize) -> String {
    format!("\u{E000}{k}\u{E001}")
}

/// A `set` read's question text: each option line (a choice's up to 26, a score's levels) replaced by
/// its [`marker`] (the line's newline kept after it), and the lines themselves, newline included, in
/// label order; `None` for a question without option lines to branch (a predicate, a choice beyond 26
/// options).
pub fn set_text(q: &Question) -> Option<(String, Vec<String>)> {
    let lines: Vec<String> = match q {
        Question::Choice { options, .. } if options.len() <= 26 => {
            let labels = choice_labels(options.len());
            options.iter().zip(&labels).map(|(o, l)| option_line(l, o)).collect()
        }
        Question::Score { levels, .. } => levels.iter().enumerate().map(|(i, l)| level_line(i, l)).collect(),
        _ => return None,
    };
    Some((text(q, true), lines.into_iter().map(|l| l + "\n").collect()))
}

/// A cloze read's question text (a choice answered by option name): the instructions, each option as
/// `- name: description` (or `- name`) in the order given, and a closing line asking for the name.
pub fn cloze_text(instructions: &Content, options: &[(String, Option<Content>)]) -> String {
    let mut out = String::new();
    let head = instructions.text();
    if !head.is_empty() {
        out.push_str(&head);
        out.push('\n');
    }
    for (name, desc) in options {
        match desc {
            Some(d) => out.push_str(&format!("- {name}: {}\n", d.text())),
            None => out.push_str(&format!("- {name}\n")),
        }
    }
    out.push_str("Answer with the name of one option only.");
    out
}

fn option_line(label: &str, (name, desc): &(String, Option<Content>)) -> String {
    match desc {
        Some(d) => format!("{label}: {name} ({})", d.text()),
        None => format!("{label}: {name}"),
    }
}

fn level_line(i: usize, l: &Value) -> String {
    format!("{i}: {}", Content(l.clone()).text())
}

fn text(q: &Question, marked: bool) -> String {
    let mut out = String::new();
    let line = |out: &mut String, s: &str| {
        if !s.is_empty() {
            out.push_str(s);
            out.push('\n');
        }
    };
    match q {
        Question::Noul { instructions, yes, no } => {
            if let Some(i) = instructions {
                line(&mut out, &i.text());
            }
            if let Some(y) = yes {
                line(&mut out, &format!("yes: {}", y.text()));
            }
            if let Some(n) = no {
                line(&mut out, &format!("no: {}", n.text()));
            }
            out.push_str("Answer with yes or no only.");
        }
        Question::Choice { instructions, options } => {
            line(&mut out, &instructions.text());
            let labels = choice_labels(options.len());
            for (k, (o, label)) in options.iter().zip(&labels).enumerate() {
                line(&mut out, &if marked { marker(k) } else { option_line(label, o) });
            }
            out.push_str(if options.len() <= 26 {
                "Answer with the letter of one option only."
            } else {
                "Answer with the number of one option only."
            });
        }
        Question::Score { instructions, levels } => {
            line(&mut out, &instructions.text());
            for (i, l) in levels.iter().enumerate() {
                line(&mut out, &if marked { marker(i) } else { level_line(i, l) });
            }
            out.push_str("Answer with the number of one level only.");
        }
    }
    out
}

/// The chat messages of one read (rendered by the model's template with the generation prompt).
pub fn messages(req: &DecisionSpec, q: &Question) -> Vec<Message> {
    messages_with(req, question_text(q))
}

/// [`messages`] with the question's text given.
pub fn messages_with(req: &DecisionSpec, question: String) -> Vec<Message> {
    let mut msgs: Vec<Message> = vec![];
    if let Some(i) = &req.instructions {
        msgs.push(Message::text(Role::System, i.text()));
    }
    match &req.state {
        State::Text(s) => msgs.push(Message::text(Role::User, format!("{s}\n\n{question}"))),
        State::Conversation(c) => {
            msgs.extend(c.iter().cloned());
            msgs.push(Message::text(Role::User, question));
        }
    }
    msgs
}

/// Template variables of a read: thinking off (Qwen3-style templates honour `enable_thinking`).
pub fn template_kwargs() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("enable_thinking".into(), Value::Bool(false));
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn question_texts() {
        let q = Question::Choice {
            instructions: Content(json!("Which team?")),
            options: vec![
                ("billing".into(), Some(Content(json!("Payments")))),
                ("sales".into(), None),
            ],
        };
        assert_eq!(
            question_text(&q),
            "Which team?\nA: billing (Payments)\nB: sales\nAnswer with the letter of one option only."
        );
        let s = Question::Score {
            instructions: Content(json!({"question": "How angry?", "scale": 3})),
            levels: vec![json!("Calm"), json!({"label": "Angry"})],
        };
        assert_eq!(
            question_text(&s),
            "{\"question\":\"How angry?\",\"scale\":3}\n0: Calm\n1: {\"label\":\"Angry\"}\nAnswer with the number of one level only."
        );
        let n = Question::Noul {
            instructions: None,
            yes: Some(Content(json!("It is urgent"))),
            no: None,
        };
        assert_eq!(question_text(&n), "yes: It is urgent\nAnswer with yes or no only.");
        let Question::Choice { instructions, options } = &q else {
            unreachable!()
        };
        assert_eq!(
            cloze_text(instructions, options),
            "Which team?\n- billing: Payments\n- sales\nAnswer with the name of one option only."
        );
    }
}
