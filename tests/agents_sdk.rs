//! The OpenAI Agents SDK (tests/agents_sdk_check.py, openai-agents 0.24.0 in .ci/venv from
//! scripts/setup-test-deps.sh) against `serve` on the default model, on the SDK's default model API
//! (`/v1/responses`): an agent with a function tool runs to its final output, not streamed and streamed,
//! calling the tool each time, over HTTP and over the SDK's WebSocket transport. `KVGATE_CI_PYTHON` names that venv's Python (scripts/test.sh sets it);
//! without it the test says so and checks nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn the_openai_agents_sdk_runs_a_tool_over_responses() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the Agents SDK check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "agents_sdk_check.py", &[&s.url("")]);
}
