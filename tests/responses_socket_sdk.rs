//! The OpenAI SDKs' Responses WebSocket mode against `serve` on the default model: openai-python's
//! `client.responses.connect()` (openai 3.60 and `websockets` in .ci/venv) in
//! tests/responses_socket_check.py — streamed turns, a `store: false` chain and a tool call continued by
//! `previous_response_id`, the `previous_response_not_found` error event — and openai-node's
//! `ResponsesWS` (openai 7.60 and `ws` 8 in .ci/node) in tests/responses_socket_node_check.mjs, both
//! installed by scripts/setup-test-deps.sh. `KVGATE_CI_PYTHON` / `KVGATE_CI_NODE` name them
//! (scripts/test.sh sets both); without them the tests say so and check nothing.

mod common;

use common::{run_node_check, run_python_check, Server};

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

#[test]
fn openai_node_responses_ws_works() {
    let Some(dir) = std::env::var_os("KVGATE_CI_NODE") else {
        eprintln!("KVGATE_CI_NODE is not set (scripts/test.sh sets it): the Node WebSocket check not run");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    assert!(
        dir.join("node_modules/ws").is_dir(),
        "{dir:?}: `ws` is not installed (scripts/setup-test-deps.sh installs it)"
    );
    run_node_check(&dir, "responses_socket_node_check.mjs", &[], "the Node WebSocket check");
}
