#!/usr/bin/env python3
"""Regenerates tests/fixtures/gguf-llamacpp-logprobs.json: llama.cpp's next-token top-10 logprobs (and
the prompt's ids, special tokens added as llama.cpp adds them) for a fixed prompt set on the real-weight
test GGUFs, the oracle of tests/gguf_real_weights.rs. Needs the anchor built; kvgate's tests only read
the output. Each case also carries `f32_top10`: scripts/f32-reference.py's exact-arithmetic result on the
same dequantized weights (needs `pip install gguf numpy`), which tells kvgate's error from llama.cpp's.

    eval "$(../shared/anchors/llama-cpp.sh --env)"
    LLAMA_SERVER=$LLAMA_SERVER ANCHOR_MODELS=$ANCHOR_MODELS python3 scripts/logprobs-fixture.py

`FIXTURE_MODELS=qwen15` (comma-separated names) regenerates only those models' cases and keeps the
others as the committed file has them.
"""
import json
import os
import sys
import subprocess
import time
import urllib.request

from importlib import import_module

def long_prompt():
    """Over 512 tokens (Gemma 3's sliding window), with the fact asked for at the start: only the global
    layers still see it when the last token is read."""
    lines = ["Lab notebook. The first sample was a blue crystal of copper sulfate."]
    things = ["salt", "sugar", "sand", "chalk", "iron filings", "baking soda", "starch", "zinc"]
    for day in range(1, 49):
        lines.append(f"Day {day}: weighed {day * 7 % 23 + 2} grams of {things[day % 8]} at {15 + day % 9} degrees.")
    lines.append("Question: what colour was the first sample? Answer: it was")
    return "\n".join(lines)


PROMPTS = {
    "gemma": [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "Once upon a time, in a small village by the sea,",
        "The three primary colors are red, blue and",
        "Water boils at a temperature of",
        "The largest planet in our solar system is",
        "The quick brown fox jumps over the",
        "Q: What is 12 times 12?\nA:",
        "<start_of_turn>user\nHello! Who are you?<end_of_turn>\n<start_of_turn>model\n",
        "Paris, Berlin, Madrid, Rome,",
        "Le petit déjeuner français typique comprend",
        "東京は日本の首都で、",
        long_prompt(),
    ],
    "smollm2": [
        "The capital of France is",
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
        "Once upon a time, in a small village by the sea,",
        "The three primary colors are red, blue and",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Write a haiku about rain.<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox jumps over the",
        "<|im_start|>user\nHelp! My payouts have been failing for 3 days. Is this urgent? Answer yes or no."
        "<|im_end|>\n<|im_start|>assistant\n",
        "Water boils at a temperature of",
        "Q: What is 12 times 12?\nA:",
        "Paris, Berlin, Madrid, Rome,",
        "The largest planet in our solar system is",
        "<|im_start|>user\nTranslate 'good morning' into Spanish.<|im_end|>\n<|im_start|>assistant\n",
        "The chemical symbol for gold is",
        "import numpy as np\nx = np.",
        "SELECT name FROM users WHERE",
        "<|im_start|>user\nName a fruit that is yellow.<|im_end|>\n<|im_start|>assistant\n",
        "In 1969, the first humans landed on",
        "for i in range(10):\n    print(",
        "The opposite of hot is",
        "<|im_start|>system\nYou are a support agent.<|im_end|>\n<|im_start|>user\nMy order never arrived."
        " What should I do?<|im_end|>\n<|im_start|>assistant\n",
        "Photosynthesis is the process by which plants",
        "The Great Wall of China was built to",
        "Monday, Tuesday, Wednesday,",
        "<|im_start|>user\nWrite one sentence about the ocean.<|im_end|>\n<|im_start|>assistant\n",
        "A triangle has three sides, a square has",
        "The author of Romeo and Juliet is",
        "function add(a, b) {\n  return",
        "Dear customer, thank you for your",
        "<|im_start|>user\nIs the sky blue? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n",
        "The speed of light is approximately",
        "My favourite hobby is reading because",
        "1, 2, 3, 4, 5,",
        "The meeting has been moved to next",
        "<|im_start|>user\nSummarize: The server crashed twice overnight and the backups failed."
        "<|im_end|>\n<|im_start|>assistant\n",
        "To make a cup of tea, first",
        "The main ingredient of guacamole is",
        "Error: connection refused. This usually means",
        "Once the rain stopped, the children",
    ],
    "qwen": [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
        "The three primary colors are red, blue and",
        "import numpy as np\nx = np.",
        "SELECT name FROM users WHERE",
        "fn main() {\n    println!(\"",
        "The quick brown fox jumps over the",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Write a haiku about rain.<|im_end|>\n<|im_start|>assistant\n",
        "// Sort an array of numbers in JavaScript\nconst sorted = arr.",
        "东京是日本的",
        "Q: What is 12 times 12?\nA:",
    ],
}
MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "gemma": "gemma-3-270m-q4_k_m.gguf",
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "qwen15": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
}
# The 1.5B (issue 55) reads the 0.5B's prompts: the same tokenizer, the size people run.
PROMPTS["qwen15"] = PROMPTS["qwen"]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())


def main():
    sys.path.insert(0, os.path.dirname(__file__))
    global f32
    f32 = import_module("f32-reference")
    server, models = os.environ["LLAMA_SERVER"], os.environ["ANCHOR_MODELS"]
    out = {"llama_cpp": "llama-server /completion n_probs=10, 2 threads, commit "
           + os.environ.get("LLAMA_COMMIT", "0c1e57098"),
           "f32": "scripts/f32-reference.py: numpy f32 forward on the GGUF's dequantized weights",
           "models": {}}
    dst = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "gguf-llamacpp-logprobs.json")
    only = [m for m in os.environ.get("FIXTURE_MODELS", "").split(",") if m]
    if only:
        with open(dst) as f:
            out["models"] = json.load(f)["models"]
    port = 8398
    for name, file in MODELS.items():
        if only and name not in only:
            continue
        proc = subprocess.Popen(
            [server, "-m", os.path.join(models, file), "--port", str(port), "--host", "127.0.0.1",
             "-t", "2", "-c", "2048", "--no-warmup"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
                    break
                except Exception:
                    time.sleep(0.2)
            cases = []
            ref = f32.Reference(os.path.join(models, file))
            for prompt in PROMPTS[name]:
                ids = post(port, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
                r = post(port, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0,
                                               "n_probs": 10, "cache_prompt": False})
                top = [{"id": t["id"], "logprob": round(t["logprob"], 5)}
                       for t in r["completion_probabilities"][0]["top_logprobs"]]
                cases.append({"prompt": prompt, "ids": ids, "top10": top, "f32_top10": f32.top10(ref, ids)})
            out["models"][name] = {"file": file, "cases": cases}
        finally:
            proc.kill()
            proc.wait()
    with open(dst, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
