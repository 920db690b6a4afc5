//! The Jev conformance suite (`jevcompat` 0.1.1 from PyPI, installed into .ci/venv by
//! scripts/setup-test-deps.sh with the official Python SDK `typesafe-sdk[zstd]`) against `serve` on the
//! default model, on default flags and again with an API key: every MUST and every SHOULD it tests
//! passes (the key run covers the auth requirements the keyless run cannot, and the reverse). Then the
//! SDK itself (tests/jev_sdk_check.py): `models.list()` and a zstd-compressed `system_one`.
//! `KVGATE_JEVCOMPAT` names the `jevcompat` executable (scripts/test.sh sets it); without it the test
//! says so and checks nothing.

mod common;

use common::{run_python_check, Server};
use serde_json::Value;

fn run_suite(jevcompat: &str, s: &Server, key: Option<&str>) -> Value {
    let out = std::env::temp_dir().join(format!("kvgate-jevcompat-{}-{}.json", std::process::id(), s.port));
    let mut cmd = std::process::Command::new(jevcompat);
    cmd.args(["test", &s.url(""), "--json", out.to_str().unwrap(), "--evidence", "3"]);
    if let Some(k) = key {
        cmd.args(["--key", k]);
    }
    let run = cmd.output().expect("jevcompat runs");
    let text = String::from_utf8_lossy(&run.stdout);
    eprintln!(
        "{}",
        text.lines().filter(|l| !l.contains('✓')).collect::<Vec<_>>().join("\n")
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).expect("a JSON report")).unwrap();
    let _ = std::fs::remove_file(out);
    report
}

#[test]
fn jevcompat_every_must_and_should_passes() {
    let Some(jevcompat) = std::env::var_os("KVGATE_JEVCOMPAT") else {
        eprintln!("KVGATE_JEVCOMPAT is not set (scripts/test.sh sets it): jevcompat not run");
        return;
    };
    let jevcompat = jevcompat.to_string_lossy().into_owned();
    assert!(
        std::path::Path::new(&jevcompat).is_file(),
        "{jevcompat}: not installed (scripts/setup-test-deps.sh installs it)"
    );
    for key in [None, Some("jevcompat-test-key")] {
        let args: Vec<&str> = key.map(|k| vec!["--api-key", k]).unwrap_or_default();
        let s = Server::start(&args);
        let r = run_suite(&jevcompat, &s, key);
        let sum = &r["summary"];
        assert_eq!(sum["verdict"], "conformant", "key {key:?}: {sum}");
        for level in ["MUST", "SHOULD"] {
            assert_eq!(sum[level]["failed"], 0, "key {key:?}, {level}: {sum}");
        }
        // with a key the auth SHOULDs are tested too (15); without, 13
        let should = if key.is_some() { 15 } else { 13 };
        assert_eq!(sum["SHOULD"]["passed"], should, "key {key:?}: {sum}");
        assert!(sum["MUST"]["passed"].as_u64().unwrap() >= 32, "key {key:?}: {sum}");
        if let Some(k) = key {
            let python = std::path::Path::new(&jevcompat).with_file_name("python");
            run_python_check(python.as_os_str(), "jev_sdk_check.py", &[&s.url(""), k]);
        }
    }
}
