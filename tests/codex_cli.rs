//! Codex CLI (npm `@openai/codex` 0.169.0, installed into .ci/node by scripts/setup-test-deps.sh), which
//! speaks only `/v1/responses`, with a custom provider pointed at `serve` on the default model: `codex
//! exec "Say hello."` in a scratch directory (read-only sandbox, its own CODEX_HOME) completes its turn —
//! a ~6,400-token first request with Codex's instructions, function, `namespace` and `web_search` tools,
//! `reasoning`, `include`, `store: false`, `prompt_cache_key` and `client_metadata` (a turn the sampled
//! 135M model writes to the context limit ends `incomplete`, which Codex reports as an error: accepted
//! as the model's answer, never a 4xx or a broken stream). `KVGATE_CI_NODE`
//! names the directory (scripts/test.sh sets it); without it the test says so and checks nothing.
//!
//! Over its WebSocket transport too (`supports_websockets = true` on the provider): the start-up
//! prewarm (`generate: false`) and the turn go over `GET /v1/responses` upgraded, no 4xx.
//!
//! Then Codex compacting: a provider with `remote_compaction = "v2"` and an auto-compact limit of
//! 1,000 tokens; a first turn, then `codex exec resume --last` — Codex compacts before the second
//! turn (a `/v1/responses` input ending with `compaction_trigger`, answered with one `compaction`
//! item) and continues with the `compaction` item in its input.

mod common;

use std::process::Command;

use common::Server;

/// Codex's home and working directories (under a scratch directory `name`), with a config for
/// `serve` at `url`.
fn setup(url: &str, name: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let scratch = std::env::temp_dir().join(format!("kvgate-codex-{}-{name}", std::process::id()));
    let (home, work) = (scratch.join("home"), scratch.join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            "model = \"smollm2-135m-instruct\"\nmodel_provider = \"kvgate\"\n\n[model_providers.kvgate]\n\
             name = \"kvgate\"\nbase_url = \"{url}\"\nwire_api = \"responses\"\nenv_key = \"KVGATE_CODEX_KEY\"\n",
        ),
    )
    .unwrap();
    (scratch, home, work)
}

/// Runs `codex args` there: whether it succeeded (or stopped at the output limit, the sampled tiny
/// model's answer), and its output.
fn codex(codex: &std::path::Path, home: &std::path::Path, work: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(codex)
        .args(args)
        .current_dir(work)
        .env("CODEX_HOME", home)
        .env("KVGATE_CODEX_KEY", "unused")
        .output()
        .expect("codex runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    let ran_out = text.contains("Incomplete response returned, reason: max_output_tokens");
    (out.status.success() || ran_out, text)
}

fn codex_bin() -> Option<std::path::PathBuf> {
    let Some(dir) = std::env::var_os("KVGATE_CI_NODE") else {
        eprintln!("KVGATE_CI_NODE is not set (scripts/test.sh sets it): the Codex CLI check not run");
        return None;
    };
    let codex = std::path::PathBuf::from(dir).join("node_modules/.bin/codex");
    assert!(
        codex.is_file(),
        "{codex:?}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    Some(codex)
}

#[test]
fn codex_exec_completes_a_turn() {
    let Some(bin) = codex_bin() else { return };
    let s = Server::start(&["--log-requests"]);
    let (scratch, home, work) = setup(&s.url("/v1"), "turn");
    let (ok, text) = codex(&bin, &home, &work, &["exec", "--skip-git-repo-check", "Say hello."]);
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(ok, "codex exec failed:\n{text}");
    let log = s.log_text();
    assert!(
        log.contains("route=/v1/responses status=200"),
        "no answered /v1/responses request:\n{log}"
    );
    assert!(!log.contains("status=4"), "a 4xx reached Codex:\n{log}");
}

#[test]
fn codex_exec_completes_a_turn_over_its_websocket_transport() {
    let Some(bin) = codex_bin() else { return };
    let s = Server::start(&["--log-requests"]);
    let (scratch, home, work) = setup(&s.url("/v1"), "websocket");
    let cfg = home.join("config.toml");
    let base = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{base}supports_websockets = true\n")).unwrap();
    let (ok, text) = codex(&bin, &home, &work, &["exec", "--skip-git-repo-check", "Say hello."]);
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(ok, "codex exec failed:\n{text}");
    assert!(
        !text.contains("prewarm setup failed"),
        "the prewarm was refused:\n{text}"
    );
    let log = s.log_text();
    assert!(
        log.contains("route=/v1/responses status=101"),
        "Codex did not upgrade to the WebSocket:\n{log}"
    );
    assert!(
        log.contains("responses websocket event") && log.contains(r#""generate":false"#),
        "no prewarm and turn over the socket:\n{log}"
    );
    assert!(!log.contains("status=4"), "a 4xx reached Codex:\n{log}");
}

#[test]
fn codex_compacts_and_continues() {
    let Some(bin) = codex_bin() else { return };
    let s = Server::start(&["--log-requests"]);
    let extra =
        "model_auto_compact_token_limit = 1000\n\n[model_providers.kvgate.capabilities]\nremote_compaction = \"v2\"\n";
    // (the capabilities table must follow the provider's: written after it)
    let (scratch, home, work) = setup(&s.url("/v1"), "compact");
    let cfg = home.join("config.toml");
    let base = std::fs::read_to_string(&cfg).unwrap();
    let (limit, caps) = extra.split_once("\n\n").unwrap();
    std::fs::write(&cfg, format!("{limit}\n{base}\n{caps}")).unwrap();
    let (ok, text) = codex(&bin, &home, &work, &["exec", "--skip-git-repo-check", "Say hello."]);
    assert!(ok, "codex exec failed:\n{text}");
    if text.contains("Incomplete response returned") {
        // the sampled 135M model wrote its first turn to the context limit: Codex ends that turn as
        // an error without counting its tokens, so it has no reason to compact, and resuming sends
        // more than the window holds — the model's answer, not a compaction to check
        let _ = std::fs::remove_dir_all(&scratch);
        eprintln!("the first turn ran to the context limit: Codex does not compact after it; nothing checked");
        return;
    }
    let (ok, text) = codex(
        &bin,
        &home,
        &work,
        &["exec", "--skip-git-repo-check", "resume", "--last", "Now say goodbye."],
    );
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(ok, "codex exec resume failed:\n{text}");
    assert!(!text.contains("Error running remote compact task"), "{text}");
    let log = s.log_text();
    assert!(
        !log.contains("status=4") && !log.contains("status=5"),
        "an error reached Codex:\n{log}"
    );
    let bodies: Vec<&str> = log.lines().filter(|l| l.contains("responses request")).collect();
    let trigger = bodies.iter().position(|l| l.contains(r#""type":"compaction_trigger""#));
    let trigger = trigger.unwrap_or_else(|| panic!("Codex did not compact:\n{log}"));
    assert!(
        bodies[trigger + 1..]
            .iter()
            .any(|l| l.contains(r#""type":"compaction""#) && l.contains("Now say goodbye.")),
        "Codex did not continue from the compaction item:\n{log}"
    );
}
