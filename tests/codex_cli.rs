//! Codex CLI (npm `@openai/codex` 0.169.0, installed into .ci/node by scripts/setup-test-deps.sh), which
//! speaks only `/v1/responses`, with a custom provider pointed at `serve` on the default model: `codex
//! exec "Say hello."` in a scratch directory (read-only sandbox, its own CODEX_HOME) completes its turn —
//! a ~6,400-token first request with Codex's instructions, function, `namespace` and `web_search` tools,
//! `reasoning`, `include`, `store: false`, `prompt_cache_key` and `client_metadata` (a turn the sampled
//! 135M model writes to the context limit ends `incomplete`, which Codex reports as an error: accepted
//! as the model's answer, never a 4xx or a broken stream). `KVGATE_CI_NODE`
//! names the directory (scripts/test.sh sets it); without it the test says so and checks nothing.

mod common;

use std::process::Command;

use common::Server;

#[test]
fn codex_exec_completes_a_turn() {
    let Some(dir) = std::env::var_os("KVGATE_CI_NODE") else {
        eprintln!("KVGATE_CI_NODE is not set (scripts/test.sh sets it): the Codex CLI check not run");
        return;
    };
    let codex = std::path::PathBuf::from(dir).join("node_modules/.bin/codex");
    assert!(
        codex.is_file(),
        "{codex:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    let s = Server::start(&["--log-requests"]);
    let scratch = std::env::temp_dir().join(format!("kvgate-codex-{}", std::process::id()));
    let (home, work) = (scratch.join("home"), scratch.join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"smollm2-135m-instruct\"\nmodel_provider = \"kvgate\"\n\n[model_providers.kvgate]\n\
             name = \"kvgate\"\nbase_url = \"{}\"\nwire_api = \"responses\"\nenv_key = \"KVGATE_CODEX_KEY\"\n",
            s.url("/v1")
        ),
    )
    .unwrap();
    let out = Command::new(&codex)
        .args(["exec", "--skip-git-repo-check", "Say hello."])
        .current_dir(&work)
        .env("CODEX_HOME", &home)
        .env("KVGATE_CODEX_KEY", "unused")
        .output()
        .expect("codex runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("{text}");
    // Codex samples (no temperature of its own), and the 135M model sometimes writes until the context
    // is full: Codex then reports the `response.incomplete` as an error. That is the model's answer,
    // not the protocol; anything else that fails the turn is.
    let ran_out = text.contains("Incomplete response returned, reason: max_output_tokens");
    assert!(out.status.success() || ran_out, "codex exec failed:\n{text}");
    let log = s.log_text();
    assert!(
        log.contains("route=/v1/responses status=200"),
        "no answered /v1/responses request:\n{log}"
    );
    assert!(!log.contains("status=4"), "a 4xx reached Codex:\n{log}");
}
