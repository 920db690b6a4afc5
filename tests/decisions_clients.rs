//! OpenAI's Decisions API clients against `serve` on the default model: openai-python 3.60
//! (`decisions.create` sync, async and raw, a 400's `param`, a DecisionsToolRunner run twice) and
//! langchain-openai 1.8.1 (OpenAIDecisions, OpenAIClassifier with tool items and `input_json`) from
//! tests/decisions_clients_check.py; the AI SDK's `experimental_decide` and openai-node's
//! `decisions.create` from tests/decisions_node_check.mjs. `KVGATE_CI_PYTHON` / `KVGATE_CI_NODE` name
//! the clients' environments (scripts/test.sh sets them); without them the test says so and checks
//! nothing.

mod common;

use common::{run_node_check, run_python_check, Server};

#[test]
fn decisions_python_clients() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the decisions client check not run");
        return;
    };
    assert!(
        std::path::Path::new(&python).is_file(),
        "{python:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&[]);
    run_python_check(&python, "decisions_clients_check.py", &[&s.url("")]);
}

#[test]
fn decisions_node_clients() {
    let Some(dir) = std::env::var_os("KVGATE_CI_NODE") else {
        eprintln!("KVGATE_CI_NODE is not set (scripts/test.sh sets it): the decisions Node check not run");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    for pkg in ["@ai-sdk/openai", "ai", "openai"] {
        assert!(
            dir.join("node_modules").join(pkg).is_dir(),
            "{dir:?}: {pkg} is not installed (scripts/setup-test-deps.sh installs it)"
        );
    }
    run_node_check(&dir, "decisions_node_check.mjs", &[], "the Node decisions check");
}
