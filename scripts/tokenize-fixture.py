#!/usr/bin/env python3
"""Regenerates tests/fixtures/tokenize-llamacpp.json: llama.cpp's own tokenization (llama-server's
/tokenize) of a fixed set of strings for the benchmark GGUFs of ../shared/anchors/llama-cpp.sh, as the
oracle for kvgate's GGUF tokenizers (issue 12). Needs the anchor built; kvgate's tests only read the
output.

    eval "$(../shared/anchors/llama-cpp.sh --env)"
    LLAMA_SERVER=$LLAMA_SERVER ANCHOR_MODELS=$ANCHOR_MODELS python3 scripts/tokenize-fixture.py
"""
import hashlib
import json
import os
import subprocess
import time
import urllib.request

STRINGS = [
    "Hello world",
    "Hello, world! How are you?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "multiple   spaces   inside",
    "   ",
    " ",
    "",
    "line one\nline two\n\nline four",
    "\ttab\tseparated\t",
    "Mixed\r\nline endings\r",
    "  indented\n    more indented\n\t\tand tabs",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 1,000,000",
    "中文测试：你好，世界",
    "日本語のテキストです。",
    "한국어 문장",
    "Emoji: 🙂🚀👍🏽 and 🇫🇷",
    "Accents: café naïve résumé Ångström Łódź",
    "Code: fn main() { println!(\"hi\"); }",
    "\u0001\u0002 control characters \u007f",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters",
    "<unk> <pad> literal angle brackets <not_a_token>",
]

CONTROL = {
    "gemma": [
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos>",
    ],
    "qwen": [
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>text<|fim_prefix|>",
    ],
}

MODELS = {
    "gemma": "gemma-3-270m-q4_k_m.gguf",
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    server = os.environ["LLAMA_SERVER"]
    models = os.environ["ANCHOR_MODELS"]
    # the anchor's pinned commit (../shared/anchors/llama-cpp.sh builds from a source snapshot)
    commit = os.environ.get("LLAMA_COMMIT", "0c1e57098")
    out = {"llama_cpp": f"llama-server /tokenize, commit {commit}", "models": {}}
    port = 8399
    for name, file in MODELS.items():
        path = os.path.join(models, file)
        proc = subprocess.Popen(
            [server, "-m", path, "--port", str(port), "--host", "127.0.0.1", "-c", "512", "--no-warmup"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
                    break
                except Exception:
                    time.sleep(0.2)
            cases = []
            for text in STRINGS + CONTROL[name]:
                case = {"text": text}
                for special in (False, True):
                    r = post(port, "/tokenize", {"content": text, "add_special": special})
                    case["ids_with_special" if special else "ids"] = r["tokens"]
                cases.append(case)
            out["models"][name] = {"file": file, "sha256": sha256(path), "cases": cases}
        finally:
            proc.kill()
            proc.wait()
    dst = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tokenize-llamacpp.json")
    # one case per line
    text = json.dumps(out, ensure_ascii=False, indent=1)
    for model in out["models"].values():
        for case in model["cases"]:
            one = json.dumps(case, ensure_ascii=False, indent=1)
            text = text.replace("\n    ".join(one.split("\n")), json.dumps(case, ensure_ascii=False), 1)
    with open(dst, "w") as f:
        f.write(text + "\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
