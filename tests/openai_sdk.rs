//! The OpenAI Python SDK (tests/openai_sdk_check.py, openai 3.60.0 in .ci/venv from
//! scripts/setup-test-deps.sh) against `serve` on the default model: `models.retrieve()`, the harmless
//! fields, `continuous_usage_stats`, `max_tokens=0` with `echo`, an empty prompt. `KVGATE_CI_PYTHON`
//! names that venv's Python (scripts/test.sh sets it); without it the test says so and checks nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn the_openai_python_sdk_works() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the OpenAI SDK check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "openai_sdk_check.py", &[&s.url("")]);
}
