//! What System One answers are worth, measured on a labeled set written for the kinds of decisions agents
//! make (benches/data/decisions-labeled.jsonl: 200 items; noul: shell-command safety, urgency, task
//! done, document relevance; choice of 2, 3, 5 and 12 options: team and tool routing, sentiment,
//! intent, language; score of 3–5 levels: urgency, frustration, relevance). For each read method
//! (`x_read`: `plain`, `ordered`, `calibrated`, `ordered+calibrated`, `set`, `set+calibrated`; `DQ_METHODS` picks some, `METHOD@k`
//! with `x_orders` k) it reports accuracy, expected calibration error (10 equal-width bins
//! of the predicted class's probability), Brier score (summed over classes) and, for choices, the
//! order-flip rate (the answer changes when the options are listed in reverse); and the generative
//! baseline: the same question as a chat completion (max_tokens 5, temperature 0), the reply parsed
//! for an option / yes-no / level. Runs on the default model, or on `DQ_MODEL` (a GGUF path).
//! `DQ_TASKS` (comma-separated task names) runs a subset; `DQ_GENERATIVE=0` skips the baseline;
//! `DQ_DUMP=path` appends every item's distribution as a JSON line (for fitting calibration offline);
//! `DQ_TEMPERATURE` serves with that `--decision-temperature` (default 1: raw distributions). `cargo bench --bench decision_quality` prints a
//! table, and per method and question type the temperature that fits best (2-fold cross-validated).

use std::collections::BTreeMap;
use std::time::Instant;

mod common;

use serde_json::{json, Map, Value};

struct Item {
    task: String,
    state: String,
    q: Value,
    answer: Value,
}

fn items() -> Vec<Item> {
    let text = include_str!("data/decisions-labeled.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            Item {
                task: v["task"].as_str().unwrap().to_string(),
                state: v["state"].as_str().unwrap().to_string(),
                q: v["question"].clone(),
                answer: v["answer"].clone(),
            }
        })
        .collect()
}

/// The classes of a question, and the index of the labeled answer.
fn classes(it: &Item) -> (Vec<String>, usize) {
    match it.q["type"].as_str().unwrap() {
        "noul" => (
            vec!["true".into(), "false".into()],
            usize::from(it.answer != json!(true)),
        ),
        "choice" => {
            let names: Vec<String> = it.q["criteria"].as_object().unwrap().keys().cloned().collect();
            let want = names
                .iter()
                .position(|n| Some(n.as_str()) == it.answer.as_str())
                .unwrap();
            (names, want)
        }
        _ => {
            let n = it.q["criteria"].as_array().unwrap().len();
            (
                (0..n).map(|i| i.to_string()).collect(),
                it.answer.as_u64().unwrap() as usize,
            )
        }
    }
}

/// The distribution an answer gives over `classes`.
fn distribution(a: &Value, classes: &[String]) -> Vec<f64> {
    if a["type"] == "noul" {
        let p = a["noul"].as_f64().unwrap();
        return vec![p, 1.0 - p];
    }
    classes
        .iter()
        .map(|c| a["probabilities"][c].as_f64().unwrap_or(0.0))
        .collect()
}

fn reversed(q: &Value) -> Value {
    let mut q = q.clone();
    let rev: Map<String, Value> = q["criteria"]
        .as_object()
        .unwrap()
        .iter()
        .rev()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    q["criteria"] = Value::Object(rev);
    q
}

#[derive(Default)]
struct Tally {
    n: usize,
    correct: usize,
    brier: f64,
    /// (confidence, correct) per item, for the ECE.
    conf: Vec<(f64, bool)>,
    flips: usize,
    flip_n: usize,
}

impl Tally {
    fn add(&mut self, p: &[f64], want: usize) {
        let (best, &pmax) = p
            .iter()
            .enumerate()
            .fold((0, &f64::MIN), |a, b| if *b.1 > *a.1 { b } else { a });
        self.n += 1;
        self.correct += usize::from(best == want);
        self.brier += p
            .iter()
            .enumerate()
            .map(|(i, x)| (x - f64::from(u8::from(i == want))).powi(2))
            .sum::<f64>();
        self.conf.push((pmax, best == want));
    }

    fn ece(&self) -> f64 {
        let mut bins = vec![(0usize, 0f64, 0usize); 10];
        for &(c, ok) in &self.conf {
            let b = ((c * 10.0) as usize).min(9);
            bins[b].0 += 1;
            bins[b].1 += c;
            bins[b].2 += usize::from(ok);
        }
        bins.iter()
            .filter(|b| b.0 > 0)
            .map(|&(n, c, ok)| (n as f64 / self.n as f64) * (c / n as f64 - ok as f64 / n as f64).abs())
            .sum()
    }

    fn row(&self, name: &str) -> String {
        let flip = if self.flip_n > 0 {
            format!(
                "{:.3} ({}/{})",
                self.flips as f64 / self.flip_n as f64,
                self.flips,
                self.flip_n
            )
        } else {
            "–".into()
        };
        format!(
            "| {name} | {}/{} = {:.3} | {:.3} | {:.3} | {flip} |",
            self.correct,
            self.n,
            self.correct as f64 / self.n.max(1) as f64,
            self.ece(),
            self.brier / self.n.max(1) as f64
        )
    }
}

/// `p` tempered by `t` (as `--decision-temperature` does).
fn temper(p: &[f64], t: f64) -> Vec<f64> {
    let max = p.iter().copied().fold(0.0, f64::max);
    if max <= 0.0 {
        return p.to_vec();
    }
    let q: Vec<f64> = p
        .iter()
        .map(|&x| if x > 0.0 { (x / max).powf(1.0 / t) } else { 0.0 })
        .collect();
    let total: f64 = q.iter().sum();
    q.iter().map(|x| x / total).collect()
}

/// Mean negative log-likelihood of the labeled answers at temperature `t`.
fn log_loss(rows: &[&(String, Vec<f64>, usize)], t: f64) -> f64 {
    rows.iter()
        .map(|(_, p, want)| -temper(p, t)[*want].max(1e-9).ln())
        .sum::<f64>()
        / rows.len().max(1) as f64
}

/// The temperature (0.02 to 50, in steps of 1.05×) of least log loss on `rows`.
fn fit_temperature(rows: &[&(String, Vec<f64>, usize)]) -> f64 {
    let mut best = (f64::MAX, 1.0);
    let mut t = 0.02;
    while t <= 50.0 {
        let l = log_loss(rows, t);
        if l < best.0 {
            best = (l, t);
        }
        t *= 1.05;
    }
    best.1
}

/// The generative baseline's parse of a reply: the class it names, if any.
fn parse_reply(reply: &str, it: &Item, classes: &[String]) -> Option<usize> {
    let r = reply.trim().to_lowercase();
    match it.q["type"].as_str().unwrap() {
        "noul" => {
            let yes = r.starts_with("yes") || r.starts_with("true");
            let no = r.starts_with("no") || r.starts_with("false");
            (yes != no).then_some(usize::from(no))
        }
        "choice" => classes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| r.find(&c.to_lowercase()).map(|at| (at, i)))
            .min()
            .map(|(_, i)| i),
        _ => r
            .chars()
            .find(|c| c.is_ascii_digit())
            .and_then(|c| c.to_digit(10))
            .map(|d| d as usize)
            .filter(|&d| d < classes.len()),
    }
}

fn generative_prompt(it: &Item, q: &Value) -> String {
    let mut s = format!("{}\n\n{}\n", it.state, q["instructions"].as_str().unwrap_or(""));
    match q["type"].as_str().unwrap() {
        "noul" => {
            if let Some(c) = q["criteria"].as_object() {
                for (k, v) in c {
                    s.push_str(&format!(
                        "{}: {}\n",
                        if k == "true" { "yes" } else { "no" },
                        v.as_str().unwrap_or("")
                    ));
                }
            }
            s.push_str("Answer yes or no.");
        }
        "choice" => {
            for (k, v) in q["criteria"].as_object().unwrap() {
                match v.as_str() {
                    Some(d) => s.push_str(&format!("- {k}: {d}\n")),
                    None => s.push_str(&format!("- {k}\n")),
                }
            }
            s.push_str("Answer with the option name only.");
        }
        _ => {
            for (i, l) in q["criteria"].as_array().unwrap().iter().enumerate() {
                s.push_str(&format!("{i}: {}\n", l.as_str().unwrap_or("")));
            }
            s.push_str("Answer with the number only.");
        }
    }
    s
}

fn main() {
    let (model, name) = match std::env::var("DQ_MODEL") {
        Ok(p) => (std::path::PathBuf::from(&p), "model-under-test".to_string()),
        Err(_) => (
            kvgate_server::default_model::ensure_default_model(false).expect("default model"),
            "smollm2-135m-instruct".to_string(),
        ),
    };
    // temperature 1 (unless DQ_TEMPERATURE): the bench reports raw distributions and fits the
    // temperature itself
    let temperature = std::env::var("DQ_TEMPERATURE").unwrap_or_else(|_| "1".into());
    let s = common::start_model(
        &model,
        &name,
        &["--kv-cache-memory", "1GiB", "--decision-temperature", &temperature],
    );
    let port = s.1;
    // DQ_TASKS=team-routing,sentiment: a subset of the tasks, for a quick look
    let tasks = std::env::var("DQ_TASKS").ok();
    let all: Vec<Item> = items()
        .into_iter()
        .filter(|it| tasks.as_deref().is_none_or(|t| t.split(',').any(|x| x == it.task)))
        .collect();
    println!("decision quality on {} ({} items)\n", model.display(), all.len());
    let mut table: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let methods = std::env::var("DQ_METHODS")
        .unwrap_or_else(|_| "plain,ordered,calibrated,ordered+calibrated,set,set+calibrated".into());
    // per method: (type, distribution, labeled answer) of every item, for the temperature fit
    let mut raw: BTreeMap<String, Vec<(String, Vec<f64>, usize)>> = BTreeMap::new();
    // DQ_DUMP=path: every item's distribution appended as a JSON line (method, task, type, p, want)
    let dump = std::env::var("DQ_DUMP").ok();
    for method in methods.split(',') {
        let t0 = Instant::now();
        // "ordered+calibrated@2": that read method with x_orders 2
        let (read, orders) = match method.split_once('@') {
            Some((r, k)) => (r, Some(k.parse::<u64>().expect("@orders is a number"))),
            None => (method, None),
        };
        for it in &all {
            let (cls, want) = classes(it);
            let ask = |q: &Value| {
                let mut body = json!({"state": it.state, "x_read": read, "questions": {"q": q}});
                if let Some(k) = orders {
                    body["x_orders"] = json!(k);
                }
                let r = common::post(port, "/v1/systemone", &body);
                r["answers"]["q"].clone()
            };
            let a = ask(&it.q);
            let p = distribution(&a, &cls);
            let kind = it.q["type"].as_str().unwrap().to_string();
            raw.entry(method.to_string())
                .or_default()
                .push((kind.clone(), p.clone(), want));
            // the options listed in reverse, read once per choice (the same answer is the point)
            let flipped = (kind == "choice").then(|| ask(&reversed(&it.q))["choice"] != a["choice"]);
            if let Some(path) = &dump {
                use std::io::Write;
                let line = json!({"method": method, "task": it.task, "type": kind, "p": p, "want": want});
                writeln!(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .expect("DQ_DUMP"),
                    "{line}"
                )
                .expect("DQ_DUMP");
            }
            for key in [kind.clone(), it.task.clone(), "all".into()] {
                let t = table.entry((method.to_string(), key)).or_default();
                t.add(&p, want);
                if let Some(f) = flipped {
                    t.flip_n += 1;
                    t.flips += usize::from(f);
                }
            }
        }
        eprintln!("{method}: {:.1} s", t0.elapsed().as_secs_f64());
    }
    // generative baseline: a chat completion, parsed; an unparseable reply counts as wrong, p = 1 on the parse
    // (DQ_GENERATIVE=0 leaves it out)
    let generative = std::env::var("DQ_GENERATIVE").map_or(true, |v| v != "0");
    let t0 = Instant::now();
    for it in all.iter().filter(|_| generative) {
        let (cls, want) = classes(it);
        let gen = |q: &Value| {
            let r = common::post(
                port,
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": generative_prompt(it, q)}], "max_tokens": 5, "temperature": 0}),
            );
            let reply = r["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
            parse_reply(&reply, it, &cls)
        };
        let got = gen(&it.q);
        let mut p = vec![0.0; cls.len()];
        match got {
            Some(i) => p[i] = 1.0,
            None => p.iter_mut().for_each(|x| *x = 1.0 / cls.len() as f64),
        }
        let kind = it.q["type"].as_str().unwrap().to_string();
        for key in [kind.clone(), it.task.clone(), "all".into()] {
            let t = table.entry(("generative".to_string(), key)).or_default();
            t.add(&p, want);
            if kind == "choice" {
                t.flip_n += 1;
                t.flips += usize::from(gen(&reversed(&it.q)) != got);
            }
        }
    }
    eprintln!("generative: {:.1} s", t0.elapsed().as_secs_f64());
    // per-type temperature (p_i ∝ p_i^(1/T)): fitted by least log loss on half the items, its ECE
    // measured on the other half and the other way round (2-fold), then fitted on all
    println!(
        "| method / type | T fitted on all | ECE at T = 1 | ECE at the 2-fold fitted T | log loss T = 1 → fitted |"
    );
    println!("|---|---|---|---|---|");
    for (method, rows) in &raw {
        // every type at its own 2-fold fitted temperature: the held-out ECE of the whole set
        let mut cv_all = Tally::default();
        let mut one_all = Tally::default();
        for kind in ["noul", "choice", "score"] {
            let mine: Vec<&(String, Vec<f64>, usize)> = rows.iter().filter(|r| r.0 == kind).collect();
            if mine.is_empty() {
                continue;
            }
            let folds: [Vec<_>; 2] = [0, 1].map(|f| {
                mine.iter()
                    .enumerate()
                    .filter(|(i, _)| i % 2 == f)
                    .map(|(_, r)| *r)
                    .collect()
            });
            let mut cv = Tally::default();
            for f in 0..2 {
                let t = fit_temperature(&folds[1 - f]);
                for (_, p, want) in &folds[f] {
                    cv.add(&temper(p, t), *want);
                    cv_all.add(&temper(p, t), *want);
                }
            }
            let all_t = fit_temperature(&mine);
            let mut one = Tally::default();
            mine.iter().for_each(|(_, p, w)| one.add(p, *w));
            mine.iter().for_each(|(_, p, w)| one_all.add(p, *w));
            println!(
                "| {method} / {kind} | {all_t:.2} | {:.3} | {:.3} | {:.3} → {:.3} |",
                one.ece(),
                cv.ece(),
                log_loss(&mine, 1.0),
                log_loss(&mine, all_t)
            );
        }
        println!(
            "| {method} / all types | – | {:.3} | {:.3} | – |",
            one_all.ece(),
            cv_all.ece()
        );
    }
    println!();
    println!("| method / group | accuracy | ECE (10 bins) | Brier | order flips (choice) |");
    println!("|---|---|---|---|---|");
    for ((method, key), t) in &table {
        println!("{}", t.row(&format!("{method} / {key}")));
    }
}
