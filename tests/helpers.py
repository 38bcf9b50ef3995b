"""Helpers shared by tests. No side effects on import (unlike conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mixed_length_prompts(tokenizer, count: int, max_tokens: int = 300, seed: int = 7) -> list[str]:
    """Prompts whose token counts (with EOS) spread from 1 to ``max_tokens``."""
    import random

    from gpuflow.demo_model import _WORDS

    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        target = 1 + (i * (max_tokens - 1)) // max(count - 1, 1)
        words: list[str] = []
        while True:
            candidate = " ".join([*words, rng.choice(_WORDS)])
            if len(tokenizer(candidate)["input_ids"]) > target:
                break
            words = candidate.split()
        prompts.append(" ".join(words) if words else rng.choice(_WORDS))
    rng.shuffle(prompts)
    return prompts


#: The project id the gcp-profile tests use on the emulators.
GCP_TEST_PROJECT = "gpuflow-gcp-test"
