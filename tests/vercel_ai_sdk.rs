//! The Vercel AI SDK (tests/vercel_ai_sdk_check.mjs; ai 7.0.173 and @ai-sdk/openai 4.0.118, installed into
//! .ci/node by scripts/setup-test-deps.sh) against `serve` on the default model, on the provider's default
//! model API (`/v1/responses`): `generateText`, `streamText` (the same text), a tool it runs, and
//! `generateObject`. `KVGATE_CI_NODE` names that directory (scripts/test.sh sets it); without it the test
//! says so and checks nothing.

mod common;

use common::run_node_check;

#[test]
fn the_vercel_ai_sdk_works_over_responses() {
    let Some(dir) = std::env::var_os("KVGATE_CI_NODE") else {
        eprintln!("KVGATE_CI_NODE is not set (scripts/test.sh sets it): the Vercel AI SDK check not run");
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    assert!(
        dir.join("node_modules/@ai-sdk/openai").is_dir(),
        "{dir:?}: the AI SDK is not installed (scripts/setup-test-deps.sh installs it)"
    );
    run_node_check(&dir, "vercel_ai_sdk_check.mjs", &[], "the AI SDK check");
}
