"""The official Jev Python SDK (typesafe-sdk) against a running `serve`: `models.list()` parses the
Jev-shaped model list, and `system_one` sends its body zstd-compressed (forced, and over the SDK's
1 KiB threshold) and parses a noul, a choice and a score answer. Run by tests/jevcompat.rs with the
.ci/venv Python: `python tests/jev_sdk_check.py URL KEY`. Prints one line per check; exits non-zero on
any failure."""
import sys

from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

url, key = sys.argv[1], sys.argv[2]
with TypeSafeClient(api_key=key, base_url=url, compression="zstd") as client:
    names = [m.name for m in client.models.list().models]
    assert "jev-latest" in names, names
    print("models.list:", names)
    state = "My payouts have failed for three days and support has not answered. " * 30
    assert len(state) > 1024
    r = client.system_one(
        state=state,
        questions={
            "urgent": Noul(instructions="Is this urgent?"),
            "team": Choice(instructions="Which team?", criteria={"billing": "payments", "tech": None}),
            "anger": Score(instructions="How angry?", criteria=["calm", "annoyed", "furious"]),
        },
    )
    assert 0.0 <= r.nouls["urgent"].noul <= 1.0
    assert r.choices["team"].choice in ("billing", "tech")
    assert 0.0 <= r.scores["anger"].score <= 2.0
    print("system_one (zstd body):", r.nouls["urgent"].noul, r.choices["team"].choice, r.scores["anger"].score)
