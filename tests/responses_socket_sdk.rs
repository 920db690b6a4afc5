//! openai-python's `client.responses.connect()` (openai 3.60 and `websockets` in .ci/venv, from
//! scripts/setup-test-deps.sh) against `serve` on the default model: tests/responses_socket_check.py
//! streams turns over one WebSocket, continues a `store: false` chain and a tool call by
//! `previous_response_id`, and reads the `previous_response_not_found` error event.
//! `KVGATE_CI_PYTHON` names that venv's Python (scripts/test.sh sets it); without it the test says so
//! and checks nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn openai_python_responses_connect_works() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the WebSocket SDK check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "responses_socket_check.py", &[&s.url("")]);
}
