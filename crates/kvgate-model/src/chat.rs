//! Chat templates: the model's Jinja template (from `tokenizer_config.json` or GGUF metadata) rendered
//! with minijinja the way Hugging Face renders it: `trim_blocks` and `lstrip_blocks` on, Python string
//! and dict methods, `raise_exception`, a Python-compatible `tojson`, `strftime_now`, the
//! `bos_token` / `eos_token` variables, `add_generation_prompt`, `tools`, and any extra
//! `chat_template_kwargs` (such as `enable_thinking`).

use minijinja::{Environment, Error, ErrorKind, Value};

use crate::error::{ModelError, Result};

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    tools: bool,
    source: String,
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// Python's `json.dumps(x, ensure_ascii=False, indent=indent)`: `", "` and `": "` separators, keys in
/// insertion order.
fn py_json(v: &serde_json::Value, indent: Option<usize>, level: usize, out: &mut String) {
    use serde_json::Value as J;
    let nl = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e16 => out.push_str(&format!("{f:.1}")),
            _ => out.push_str(&n.to_string()),
        },
        J::String(s) => {
            out.push('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        J::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, level + 1);
                py_json(x, indent, level + 1, out);
            }
            nl(out, level);
            out.push(']');
        }
        J::Object(o) => {
            if o.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                nl(out, level + 1);
                py_json(&J::String(k.clone()), None, 0, out);
                out.push_str(": ");
                py_json(x, indent, level + 1, out);
            }
            nl(out, level);
            out.push('}');
        }
    }
}

/// Python-compatible JSON text of a template value.
pub fn to_py_json(v: &serde_json::Value, indent: Option<usize>) -> String {
    let mut s = String::new();
    py_json(v, indent, 0, &mut s);
    s
}

fn tojson(v: Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let j = serde_json::to_value(&v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(to_py_json(&j, indent)))
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `strftime` for the codes chat templates use (`%Y %m %d %e %B %b %A %a %H %M %S %j %y %%`), UTC.
pub fn strftime(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let doy = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{doy:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp as i64 + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn strftime_now(fmt: String) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(&fmt, now)
}

impl ChatTemplate {
    /// Compiles `source`; `bos` / `eos` are the strings the template sees as `bos_token` / `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ModelError::Template(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat".to_string(), source.to_string())
            .map_err(|e| ModelError::Template(format!("cannot compile the chat template: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
            tools: source.contains("tools") && source.contains("tool_call"),
            source: source.to_string(),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The string the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos
    }

    /// The string the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos
    }

    /// Whether the template renders `tools`, assistant `tool_calls` and `tool` messages itself (it
    /// mentions them); otherwise the server describes tools in a system message of its own.
    pub fn supports_tools(&self) -> bool {
        self.tools
    }

    /// Renders `messages` (a JSON array of `{role, content, ...}`), with `tools` when given and the
    /// extra variables of `kwargs` (`chat_template_kwargs`; they cannot override `messages`).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| ModelError::Template(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("bos_token".into(), self.bos.clone().into());
        ctx.insert("eos_token".into(), self.eos.clone().into());
        for (k, v) in kwargs {
            ctx.insert(k.clone(), v.clone());
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        if let Some(t) = tools {
            ctx.insert("tools".into(), t.clone());
        }
        tmpl.render(Value::from(minijinja::value::Serde(&ctx))).map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            ModelError::Template(msg)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_with_hf_conventions() {
        let src =
            "{% for m in messages %}{{ bos_token }}{{ m['role'] | upper }}: {{ m.content.strip() }}\n{% endfor %}\
                   {% if add_generation_prompt %}A:{% endif %}{{ tools | tojson }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let msgs = json!([{"role": "user", "content": "  hi  "}]);
        let out = t
            .render(
                &msgs,
                true,
                Some(&json!([{"name": "f", "x": [1, 2.5]}])),
                &Default::default(),
            )
            .unwrap();
        assert_eq!(out, "<s>USER: hi\nA:[{\"name\": \"f\", \"x\": [1, 2.5]}]");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}", "", "").unwrap();
        let e = t.render(&json!([]), false, None, &Default::default()).unwrap_err();
        assert!(e.to_string().contains("roles must alternate"), "{e}");
    }

    #[test]
    fn kwargs_reach_the_template() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}off{% endif %}",
            "",
            "",
        )
        .unwrap();
        let mut kw = serde_json::Map::new();
        kw.insert("enable_thinking".into(), json!(false));
        assert_eq!(t.render(&json!([]), false, None, &kw).unwrap(), "off");
    }

    #[test]
    fn strftime_known_dates() {
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S %A", 0), "1970-01-01 00:00:00 Thursday");
        assert_eq!(strftime("%d %B %Y %j", 1_764_460_800), "30 November 2025 334");
        assert_eq!(strftime("%d %b %Y", 951_782_400), "29 Feb 2000");
    }

    #[test]
    fn py_json_indent() {
        assert_eq!(
            to_py_json(&json!({"a": [1, {"b": null}]}), Some(2)),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}"
        );
        assert_eq!(to_py_json(&json!("é\n\"x\""), None), "\"é\\n\\\"x\\\"\"");
    }
}
