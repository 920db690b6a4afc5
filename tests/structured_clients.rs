//! Structured outputs and tool calls with real clients (tests/structured_clients_check.py: the OpenAI
//! Python SDK's `parse()` with a Pydantic model and with a strict tool, its stream helper with a named
//! tool; LangChain's `with_structured_output` by json_schema, function_calling and json_mode, and
//! `bind_tools` invoked, streamed and continued with a tool result) against `serve` on the default
//! model. `KVGATE_CI_PYTHON` names .ci/venv's Python (scripts/test.sh sets it; openai and
//! langchain-openai come from scripts/setup-test-deps.sh); without it the test says so and checks
//! nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn openai_parse_and_langchain_structured_output_and_tools_work() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the structured-output client check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "structured_clients_check.py", &[&s.url("")]);
}
