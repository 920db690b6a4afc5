//! pydantic-ai (tests/pydantic_ai_check.py, pydantic-ai-slim[openai] 2.68.0 in .ci/venv from
//! scripts/setup-test-deps.sh) against `serve` on the default model, on its Responses model: a plain run
//! and a structured output; and on Qwen2.5-Coder-0.5B (the 135M model loops on tools) a free tool round
//! trip over both its Responses and its Chat Completions model. `KVGATE_CI_PYTHON` names that venv's Python (scripts/test.sh sets it);
//! without it the test says so and checks nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn pydantic_ai_runs_over_responses() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the pydantic-ai check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "pydantic_ai_check.py", &[&s.url("")]);
}

#[test]
fn pydantic_ai_tool_round_trip_on_qwen() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the pydantic-ai check not run");
        return;
    };
    let Some(dir) = common::test_models_dir() else { return };
    let qwen = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    // Exact arithmetic: on the default 8-bit activations this 0.5B model's greedy tool call carries two
    // invented arguments (`temperature`, `description`) that pydantic-ai's validation refuses.
    let s = Server::start(&[
        "--model",
        qwen.to_str().unwrap(),
        "--served-model-name",
        "qwen",
        "--activations",
        "f32",
    ]);
    run_python_check(&python, "pydantic_ai_check.py", &[&s.url(""), "qwen", "tool"]);
}
