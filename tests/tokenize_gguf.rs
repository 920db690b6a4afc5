//! GGUF vocabularies built by kvgate against llama.cpp's own `/tokenize` (tests/fixtures/
//! tokenize-llamacpp.json, made by scripts/tokenize-fixture.py): Gemma 3 (SentencePiece, add_bos) and
//! Qwen2.5 (byte-level BPE), with and without the model's special tokens added. The GGUFs are fetched
//! by `scripts/fetch-test-models.sh` (run by `scripts/test.sh`, which exports `KVGATE_TEST_MODELS`), or
//! taken from the anchor's `ANCHOR_MODELS`; without either the test says so and checks nothing.

mod common;

use kvgate_model::Tokenizer;

#[test]
fn gguf_tokenizers_match_llama_cpp() {
    let fixture = common::fixture("tokenize-llamacpp.json");
    let Some(dir) = common::test_models_dir() else {
        return;
    };
    let (mut failures, mut checked) = (Vec::new(), 0);
    for (name, m) in fixture["models"].as_object().unwrap() {
        let path = dir.join(m["file"].as_str().unwrap());
        if !path.is_file() {
            eprintln!("{}: not found, skipped", path.display());
            continue;
        }
        let tok = Tokenizer::from_gguf_file(&path).unwrap();
        for case in m["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            for (key, special) in [("ids", false), ("ids_with_special", true)] {
                let want: Vec<u32> = case[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect();
                let got = tok.encode(text, special).unwrap();
                checked += 1;
                if got != want {
                    failures.push(format!("{name} {key} {text:?}: {got:?} vs llama.cpp {want:?}"));
                }
            }
        }
    }
    eprintln!("{checked} tokenizations compared with llama.cpp");
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
