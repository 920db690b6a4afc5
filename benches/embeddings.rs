//! `/v1/embeddings`, kvgate and llama.cpp side by side on the same GGUF, the same machine, in one run:
//! throughput (input tokens per second of wall time) for batches of short, medium and long inputs, with
//! last-token and mean pooling, both servers on 2 threads and driven the same way over HTTP (one
//! request per batch, token-id inputs so both read exactly the same tokens, every input starting with a
//! number no other input used so neither side's cache helps). Also the cosine between the two servers'
//! vectors for the same input (an independent implementation as a second reference).
//!
//! Rounds alternate (`EMB_ROUNDS`, default 3: kvgate's set, then llama.cpp's, and again); each figure is
//! the median, the per-round ratios beside it. The anchor comes from `../shared/anchors/llama-cpp.sh
//! --env` (`LLAMA_SERVER`, `ANCHOR_MODELS`); without it kvgate's column is printed alone. Run with
//! `eval "$(../shared/anchors/llama-cpp.sh --env)"; LLAMA_SERVER=$LLAMA_SERVER ANCHOR_MODELS=$ANCHOR_MODELS
//! cargo bench --bench embeddings`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

/// llama-server, killed on drop.
struct Llama(Child, u16);

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn llama(server: &Path, model: &Path, pooling: &str) -> Llama {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(server)
        .args([
            "-m",
            model.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--host",
            "127.0.0.1",
        ])
        .args([
            "-t", "2", "-tb", "2", "-np", "8", "-c", "16384", "-b", "2048", "-ub", "2048",
        ])
        .args(["--embeddings", "--pooling", pooling, "--no-warmup"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("llama-server starts");
    let l = Llama(child, port);
    for _ in 0..1200 {
        if ureq::get(&format!("http://127.0.0.1:{port}/health"))
            .call()
            .is_ok_and(|r| r.status() == 200)
        {
            return l;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("llama-server did not become healthy");
}

/// `n` inputs of about `words` words, each opening with a number never used before.
fn inputs(port: u16, n: usize, words: usize, salt: &mut usize) -> Vec<Vec<u64>> {
    (0..n)
        .map(|_| {
            *salt += 1;
            let mut s = format!("{} ", *salt * 7919);
            for i in 0..words {
                s.push_str(
                    [
                        "report",
                        "the",
                        "north",
                        "warehouse",
                        "shipped",
                        "order",
                        "late",
                        "today",
                    ][(i * 7 + *salt) % 8],
                );
                s.push(' ');
            }
            let t = common::post(port, "/tokenize", &json!({"prompt": s, "add_special_tokens": false}));
            t["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect()
        })
        .collect()
}

/// One request embedding `batch`; returns (seconds, the vectors).
fn embed(port: u16, batch: &[Vec<u64>]) -> (f64, Vec<Vec<f32>>) {
    let t0 = Instant::now();
    let mut r = ureq::post(&format!("http://127.0.0.1:{port}/v1/embeddings"))
        .send_json(json!({"input": batch, "encoding_format": "float"}))
        .unwrap_or_else(|e| panic!("embeddings on port {port}: {e}"));
    let v: Value = r.body_mut().read_json().unwrap();
    let dt = t0.elapsed().as_secs_f64();
    let vecs = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    (dt, vecs)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let anchor = std::env::var_os("LLAMA_SERVER")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    let model = std::env::var_os("ANCHOR_MODELS")
        .map(|m| PathBuf::from(m).join("smollm2-135m-instruct-q4_1.gguf"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| kvgate_server::default_model::ensure_default_model(false).expect("the default model"));
    let rounds: usize = std::env::var("EMB_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("")
        .split_whitespace()
        .filter(|w| *w == "avx2" || w.starts_with("avx512"))
        .collect();
    flags.dedup();
    println!("CPU flags: {}; model {}", flags.join(" "), model.display());
    if anchor.is_none() {
        println!("llama.cpp anchor: not found (LLAMA_SERVER); kvgate only");
    }
    // (name, inputs per request, words per input)
    let loads = [
        ("64 × ~24 tokens", 64, 20),
        ("16 × ~250 tokens", 16, 220),
        ("4 × ~1000 tokens", 4, 900),
    ];
    for pooling in ["last", "mean"] {
        let k = common::start_model(
            &model,
            "smollm2-135m-instruct",
            &["--threads", "2", "--max-model-len", "4096", "--pooling", pooling],
        );
        let l = anchor.as_ref().map(|a| llama(a, &model, pooling));
        let mut salt = 0;
        println!("\npooling {pooling}\n");
        println!("| batch | kvgate tok/s | llama.cpp tok/s | ratio | per round | cosine kvgate·llama.cpp (min) |");
        println!("|---|---|---|---|---|---|");
        for (name, n, words) in loads {
            let (mut ours, mut theirs, mut cos) = (vec![], vec![], f64::INFINITY);
            for _ in 0..rounds {
                let batch = inputs(k.1, n, words, &mut salt);
                let tokens: usize = batch.iter().map(Vec::len).sum();
                let (dt, a) = embed(k.1, &batch);
                ours.push(tokens as f64 / dt);
                if let Some(l) = &l {
                    let (dt, b) = embed(l.1, &batch);
                    theirs.push(tokens as f64 / dt);
                    for (x, y) in a.iter().zip(&b) {
                        cos = cos.min(cosine(x, y));
                    }
                }
            }
            let ratios: Vec<String> = ours.iter().zip(&theirs).map(|(o, t)| format!("{:.2}", o / t)).collect();
            let (o, t) = (
                median(ours.clone()),
                (!theirs.is_empty()).then(|| median(theirs.clone())),
            );
            println!(
                "| {name} | {o:.0} | {} | {} | {} | {} |",
                t.map_or("–".into(), |t| format!("{t:.0}")),
                t.map_or("–".into(), |t| format!("{:.2}×", o / t)),
                ratios.join(", "),
                if cos.is_finite() {
                    format!("{cos:.5}")
                } else {
                    "–".into()
                }
            );
        }
    }
}
