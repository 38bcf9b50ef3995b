"""Small models built offline, so every run works without a model hub: a seq2seq T5 (``gpuflow-demo``) and a
decoder-only, Llama-shaped model (``gpuflow-demo-causal``).

Each is built from a config with seeded random weights, and its tokenizer is a BPE trained with ``tokenizers`` on
a fixed corpus. The same seed gives the same files, so tests can compare answers across processes.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

log = logging.getLogger(__name__)

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"

_WORDS = ["the", "a", "gpu", "dataflow", "pipeline", "model", "answers", "prompt", "question", "streaming", "batch", "worker", "driver", "cuda", "beam", "airflow", "token", "weights", "export", "container", "image", "quota", "region", "zone", "cloud", "storage", "topic", "subscription", "message", "latency", "memory", "bf16", "float", "tensor", "inference", "generate", "translate", "summarize", "what", "why", "how", "when", "where", "which", "is", "are", "can", "does", "run", "runs", "ran", "fast", "slow", "small", "large", "red", "blue", "green", "cat", "dog", "bird", "tree", "river", "mountain", "city", "country", "france", "paris", "germany", "berlin", "capital", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "hundred", "thousand", "please", "tell", "me", "about", "explain", "describe", "list"]


def demo_corpus(num_sentences: int = 2000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 16))) for _ in range(num_sentences)]


ARCHITECTURES = ("seq2seq", "causal")


def build_demo_tokenizer(vocab_size: int = 512, seed: int = 0, architecture: str = "seq2seq"):
    """A BPE tokenizer with T5's layout: Metaspace word boundaries, pad=0, eos=1, unk=2. The seq2seq one ends each
    input with EOS, as T5's does; the causal one leaves the prompt as it is, for the answer to continue."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, UNK],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz0123456789?!.,'-"),
        show_progress=False,
    )
    tokenizer.train_from_iterator(demo_corpus(seed=seed), trainer=trainer)
    eos_id = tokenizer.token_to_id(EOS)
    if architecture == "seq2seq":
        tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, eos_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, model_max_length=4096,
        padding_side="right" if architecture == "seq2seq" else "left",
    )


def build_demo_model(vocab_size: int, seed: int = 0, **shape):
    """A T5 with random, seeded weights; ``shape`` overrides the small default dimensions."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    dims = dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16)
    dims.update(shape)
    config = T5Config(
        vocab_size=vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tie_word_embeddings=True,
        **dims,
    )
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(config)
    with torch.no_grad():
        # Untrained, the model would often answer with an immediate end-of-sequence. Zeroing the
        # special tokens' (tied) embeddings keeps their logits at 0, below the best word's, so
        # every answer has max_new_tokens real tokens that depend on the prompt.
        model.shared.weight[[config.pad_token_id, config.eos_token_id, 2]] = 0.0
    model.eval()
    return model


def build_demo_causal_model(vocab_size: int, seed: int = 0, **shape):
    """A decoder-only model of Llama's shape (rotary positions, RMSNorm, SwiGLU, grouped KV heads) with random,
    seeded weights; ``shape`` overrides the small default dimensions."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=1024)
    dims.update(shape)
    config = LlamaConfig(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                         tie_word_embeddings=True, **dims)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # as for the T5: the special tokens never win, so every answer has max_new_tokens tokens
        model.model.embed_tokens.weight[[config.pad_token_id, config.eos_token_id, 2]] = 0.0
    model.eval()
    return model


def write_demo_model(directory: str | Path, seed: int = 0, architecture: str = "seq2seq", **shape) -> Path:
    """Write model and tokenizer in Hugging Face format to ``directory``; return the directory."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, not {architecture!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_demo_tokenizer(seed=seed, architecture=architecture)
    build = build_demo_model if architecture == "seq2seq" else build_demo_causal_model
    model = build(vocab_size=len(tokenizer), seed=seed, **shape)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    log.info("Wrote the demo %s model (%d parameters) to %s", architecture, model.num_parameters(), directory)
    return directory
