//! The decode floor under a flood of prompts, against the real `serve` on the default model: one
//! completion decodes 160 tokens (a short prompt, greedy) alone, then again with 24 prompts of ~400
//! tokens arriving 0.3 s after it started; its decode rate under the flood as a share of the unloaded
//! one, with the default `--decode-floor 0.7` and with the floor off, side by side in one run.
//! `cargo bench --bench flood` prints a table (~4 minutes on 2 cores).

use std::time::Instant;

mod common;

use common::post;
use serde_json::json;

fn stream_secs(port: u16) -> f64 {
    let t0 = Instant::now();
    let r = post(
        port,
        "/v1/completions",
        &json!({"prompt": "Write a long story about a lighthouse.", "max_tokens": 160,
                "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r["usage"]["completion_tokens"], 160, "{r}");
    t0.elapsed().as_secs_f64()
}

fn prompt(i: usize, chars: usize) -> String {
    let mut s = format!("Report {i}. ");
    while s.len() < chars {
        s.push_str(&format!(
            "Line {} of report {i}: the shipment moved on schedule. ",
            s.len() % 89
        ));
    }
    s
}

fn run(floor: &str, prompts: usize, chars: usize) -> (f64, f64, f64) {
    let s = common::start(&["--decode-floor", floor, "--kv-cache-memory", "2GiB"]);
    let port = s.1;
    post(port, "/v1/completions", &json!({"prompt": "warm up", "max_tokens": 4}));
    let alone = stream_secs(port);
    let t0 = Instant::now();
    let loaded = std::thread::scope(|sc| {
        // the stream starts decoding, then the flood arrives
        let stream = sc.spawn(move || stream_secs(port));
        std::thread::sleep(std::time::Duration::from_millis(300));
        for i in 0..prompts {
            sc.spawn(move || {
                post(
                    port,
                    "/v1/completions",
                    &json!({"prompt": prompt(i, chars), "max_tokens": 1}),
                )
            });
        }
        stream.join().unwrap()
    });
    (alone, loaded, t0.elapsed().as_secs_f64())
}

fn main() {
    let mut rows = vec![];
    // FLOOD_FLOORS=0.5,0.6,0 compares other shares
    let floors = std::env::var("FLOOD_FLOORS").unwrap_or_else(|_| "0.7,0".into());
    // FLOOD_PROMPTS=512 FLOOD_CHARS=400: guidellm's flood, shorter prompts
    let prompts: usize = std::env::var("FLOOD_PROMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let chars: usize = std::env::var("FLOOD_CHARS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1600);
    for floor in floors.split(',') {
        let (alone, loaded, flood) = run(floor, prompts, chars);
        rows.push(format!(
            "| --decode-floor {floor} | {alone:.2} s | {loaded:.2} s | {:.0}% | {flood:.1} s |",
            100.0 * alone / loaded
        ));
    }
    println!(
        "\n| setting | 160 tokens alone | 160 tokens, {prompts} × ~{}-token prompts arriving | decode rate kept | flood done |",
        chars / 4
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
