//! pydantic-ai (tests/pydantic_ai_check.py, pydantic-ai-slim[openai] 2.68.0 in .ci/venv from
//! scripts/setup-test-deps.sh) against `serve` on the default model, on its Responses model: a plain run
//! and a structured output. `KVGATE_CI_PYTHON` names that venv's Python (scripts/test.sh sets it);
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
