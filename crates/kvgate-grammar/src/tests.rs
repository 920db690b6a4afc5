//! The grammar compiler on the tiny tokenizer: token bytes reproduce text, seeded random walks under
//! each kind of grammar always end in output that satisfies it, fast-forwarded tokens are the
//! grammar's own, and invalid grammars are errors that name the problem.

use std::sync::Arc;

use kvgate_engine::TokenConstraint;
use kvgate_model::tiny::tiny_tokenizer;
use serde_json::{json, Value};

use super::*;

/// What a walk's text must satisfy.
type Check = Box<dyn Fn(&str) -> bool>;

fn grammars() -> (Grammars, Arc<Tokenizer>) {
    let tok = Arc::new(tiny_tokenizer());
    let vocab = tok.vocab_size() + 3;
    (Grammars::new(tok.clone(), &[0], vocab).unwrap(), tok)
}

/// xorshift, to keep the walk seeded without a dependency.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Walks `c` by picking allowed tokens at random (EOS whenever allowed, half the time); returns the
/// text or `None` if it did not end within `max` tokens.
fn walk(c: &mut Box<dyn TokenConstraint>, tok: &Tokenizer, seed: u64, max: usize) -> Option<String> {
    let mut s = seed.max(1);
    let mut out: Vec<u32> = vec![];
    for _ in 0..max {
        if c.is_stopped() {
            return Some(tok.decode(&out, true).unwrap());
        }
        let m = c.mask().unwrap();
        let allowed: Vec<u32> = (0..tok.vocab_size() as u32 + 3).filter(|&t| m.allows(t)).collect();
        assert!(!allowed.is_empty(), "a live grammar allows something");
        if m.allows(0) && next(&mut s).is_multiple_of(2) {
            return Some(tok.decode(&out, true).unwrap());
        }
        let pick = allowed[(next(&mut s) % allowed.len() as u64) as usize];
        if pick == 0 {
            return Some(tok.decode(&out, true).unwrap());
        }
        out.push(pick);
        let ff = c.commit(pick, seed.is_multiple_of(2)).unwrap();
        out.extend(ff);
    }
    None
}

#[test]
fn token_bytes_reproduce_text() {
    let tok = tiny_tokenizer();
    let bytes = tok.token_bytes();
    for text in ["Hello, wörld! 123 {\"a\": [1, 2]}", "  spaced\n\ttabs", "ünïcödé → ok"] {
        let ids = tok.encode(text, false).unwrap();
        let joined: Vec<u8> = ids.iter().flat_map(|&i| bytes[i as usize].0.clone()).collect();
        assert_eq!(joined, text.as_bytes());
    }
    assert!(bytes[0].1, "<|endoftext|> is special");
}

#[test]
fn random_walks_satisfy_their_grammar() {
    let (g, tok) = grammars();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", "fish"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
        },
        "required": ["name", "age", "pet", "tags"],
        "additionalProperties": false
    });
    let specs: Vec<(GrammarSpec, Check)> = vec![
        (
            GrammarSpec::JsonSchema { schema, strict: true },
            Box::new(|t: &str| {
                let v: Value = serde_json::from_str(t).unwrap_or(Value::Null);
                v["name"].as_str().is_some_and(|s| s.chars().count() <= 6)
                    && v["age"].as_u64().is_some_and(|a| a <= 120)
                    && ["cat", "dog", "fish"].contains(&v["pet"].as_str().unwrap_or(""))
                    && v["tags"]
                        .as_array()
                        .is_some_and(|a| a.len() <= 3 && a.iter().all(Value::is_boolean))
                    && v.as_object().is_some_and(|o| o.len() == 4)
            }),
        ),
        (
            GrammarSpec::Regex("(yes|no)-[0-9]{2,4}".into()),
            Box::new(|t: &str| {
                let (a, b) = t.split_once('-').unwrap_or(("", ""));
                (a == "yes" || a == "no") && (2..=4).contains(&b.len()) && b.chars().all(|c| c.is_ascii_digit())
            }),
        ),
        (
            GrammarSpec::Choice(vec!["alpha".into(), "beta gamma".into(), "δ".into()]),
            Box::new(|t: &str| ["alpha", "beta gamma", "δ"].contains(&t)),
        ),
        (
            GrammarSpec::Lark("start: \"call(\" NUM (\",\" NUM)? \")\"\nNUM: /[1-9]/".into()),
            Box::new(|t: &str| t.starts_with("call(") && t.ends_with(')') && t.len() <= 9),
        ),
    ];
    for (spec, ok) in &specs {
        let guide = g.compile(spec).unwrap();
        for seed in 1..40u64 {
            let mut c = guide.0.start();
            let text = walk(&mut c, &tok, seed * 7919, 400).unwrap_or_else(|| panic!("{spec:?} did not end"));
            assert!(ok(&text), "{spec:?} seed {seed}: {text:?}");
        }
    }
}

#[test]
fn json_object_is_an_object_and_forks_are_independent() {
    let (g, tok) = grammars();
    let guide = g.compile(&GrammarSpec::JsonObject).unwrap();
    let mut a = guide.0.start();
    let first = tok.encode("{", false).unwrap();
    for &t in &first {
        a.commit(t, false).unwrap();
    }
    let mut b = a.fork();
    for &t in &tok.encode("\"k\": 1}", false).unwrap() {
        b.commit(t, false).unwrap();
    }
    assert!(b.is_stopped() || b.mask().unwrap().allows(0));
    // `a` did not move with `b`: a closing brace is still what it expects next, not EOS.
    assert!(!a.mask().unwrap().allows(0));
    let mut c = guide.0.start();
    assert!(!c.mask().unwrap().allows(tok.encode("x", false).unwrap()[0]));
}

#[test]
fn invalid_grammars_are_errors_naming_the_problem() {
    let (g, _) = grammars();
    let bad = [
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::JsonSchema {
            schema: json!({"type": "no-such-type"}),
            strict: true,
        },
        GrammarSpec::JsonSchema {
            schema: json!([1, 2]),
            strict: true,
        },
        GrammarSpec::Lark("start: missing_rule".into()),
        GrammarSpec::Choice(vec![]),
        GrammarSpec::JsonSchema {
            schema: json!({"type": "integer", "minimum": 5, "maximum": 1}),
            strict: true,
        },
    ];
    for spec in bad {
        let e = g.compile(&spec).map(|_| ()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("invalid {}", spec.kind())), "{msg}");
        assert!(msg.len() > 20, "{msg}");
    }
}
