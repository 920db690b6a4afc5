//! The Open Responses compliance cases, their WebSocket cases (`x-openresponses-websocket`: events as
//! the stream's schemas, errors as `WebSocketErrorEvent`, a failed continuation evicted) and the
//! stateful Responses surfaces (background runs, compaction, conversations) on
//! Qwen2.5-Coder-0.5B-Instruct, validated by tests/open_responses_check.py
//! against the spec's published OpenAPI document (the `openresponses-py` wheel carries it) and
//! openai-python's generated types, driven partly by the OpenAI SDK. `KVGATE_CI_PYTHON` names the venv
//! (scripts/test.sh sets it), `KVGATE_TEST_MODELS` the GGUFs; without them the test says so and checks
//! nothing.

mod common;

use common::{run_python_check, Server};

#[test]
fn open_responses_compliance_background_compaction_and_conversations_on_qwen() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the Open Responses check not run");
        return;
    };
    let Some(dir) = common::test_models_dir() else { return };
    let qwen = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(qwen.is_file(), "{qwen:?}: scripts/fetch-test-models.sh fetches it");
    let s = Server::start(&["--model", qwen.to_str().unwrap(), "--served-model-name", "qwen"]);
    run_python_check(&python, "open_responses_check.py", &[&s.url(""), "qwen"]);
}
