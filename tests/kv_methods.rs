//! `--kv-cache-method` through the whole server, in process over the tiny model: every (quantized
//! dtype, method) serves; a prompt served again from the prefix cache is read with the transform and
//! scales it was written with (the warm answer is bit-identical to the cold one, with the prompt's
//! blocks counted as cached); and a method a dtype cannot take is a startup error that names both.

mod common;

use common::InProcess;
use kvgate_cpu::tiny::TinySpec;
use kvgate_server::testing::TestServer;
use serde_json::{json, Value};

fn post(s: &InProcess, path: &str, body: &Value) -> (u16, Value) {
    let (st, _, b) = common::raw_at(
        s.port,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .unwrap();
    (st, common::parse(&b))
}

#[test]
fn every_method_serves_and_prefix_hits_read_what_was_written() {
    // a prompt of several full blocks, so the second request reuses them
    let prompt = "the quick brown fox jumps over the lazy dog and then it runs far away into the forest ".repeat(3);
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3});
    for dtype in ["fp8_e4m3", "fp8_e5m2", "nvfp4", "int8"] {
        let d = kvgate_kv::KvDtype::parse(dtype).unwrap().unwrap();
        for method in kvgate_kv::KvQuant::methods_for(d).iter().map(|q| q.name()) {
            let s = InProcess::tiny(&["--kv-cache-dtype", dtype, "--kv-cache-method", method]);
            let (st, cold) = post(&s, "/v1/completions", &body);
            assert_eq!(st, 200, "{dtype} {method}: {cold}");
            let (st, warm) = post(&s, "/v1/completions", &body);
            assert_eq!(st, 200);
            let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            assert!(
                cached >= 16,
                "{dtype} {method}: the prompt's blocks come from the cache ({warm})"
            );
            assert_eq!(
                cold["choices"][0]["logprobs"], warm["choices"][0]["logprobs"],
                "{dtype} {method}: a cached block reads as it was written"
            );
            assert_eq!(cold["choices"][0]["text"], warm["choices"][0]["text"]);
        }
    }
}

#[test]
fn a_method_the_dtype_cannot_take_is_a_startup_error() {
    for (dtype, method) in [
        ("float32", "rotation"),
        ("bfloat16", "fine"),
        ("float16", "both"),
        ("float32", "smooth"),
    ] {
        let err = TestServer::try_tiny_with(
            &["--kv-cache-dtype", dtype, "--kv-cache-method", method],
            TinySpec::default(),
        )
        .err()
        .unwrap_or_else(|| panic!("{dtype} {method} started"));
        assert!(
            err.contains(&format!("--kv-cache-method {method}"))
                && err.contains(dtype)
                && err.contains("fp8, nvfp4 and int8"),
            "{err}"
        );
    }
    // int8 has its own scales already: the fp8 `fine` methods do not apply
    for method in ["fine", "both+smooth"] {
        let err = TestServer::try_tiny_with(
            &["--kv-cache-dtype", "int8", "--kv-cache-method", method],
            TinySpec::default(),
        )
        .err()
        .unwrap_or_else(|| panic!("int8 {method} started"));
        assert!(
            err.contains(&format!("--kv-cache-method {method}")) && err.contains("its own scales"),
            "{err}"
        );
    }
    let err = TestServer::try_tiny_with(&["--kv-cache-method", "sideways"], TinySpec::default())
        .err()
        .expect("an unknown method is refused");
    assert!(
        err.contains("sideways") && err.contains("plain, rotation, fine, both"),
        "{err}"
    );
    // `auto` and `plain` fit every dtype
    for dtype in ["float32", "bfloat16"] {
        for method in ["auto", "plain"] {
            assert!(TestServer::try_tiny_with(
                &["--kv-cache-dtype", dtype, "--kv-cache-method", method],
                TinySpec::default()
            )
            .is_ok());
        }
    }
}
