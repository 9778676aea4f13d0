"""Write a llama-architecture GGUF with seeded random weights, for llama-server to load.

Deterministic and offline: no hub, no licence. The output is gibberish by design; the model
exists to be loaded, warmed up and asked for a completion. Needs only the ``gguf`` package.

    python make_tiny_gguf.py OUT.gguf [--preset tiny|medium|big] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import gguf
import numpy as np


@dataclass(frozen=True, slots=True)
class Shape:
    """Hyperparameters of one preset; sizes are F16 weights, so bytes ~ 2 x parameters."""

    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int


PRESETS: Final[dict[str, Shape]] = {
    "tiny": Shape(n_embd=128, n_head=4, n_ff=256, n_layer=8),  # about 1.4 MB
    "medium": Shape(n_embd=1024, n_head=16, n_ff=2816, n_layer=4),  # about 104 MB
    "big": Shape(n_embd=2048, n_head=32, n_ff=5632, n_layer=4),  # about 388 MB
}
CONTEXT: Final = 512
#: Words whose SPM pieces the vocab holds; everything else falls back to byte tokens.
WORDS: Final = (
    "hello world the model is a an of to and in that it for on with as was at by this from "
    "ready loading weights server token answer question two plus four five six seven eight nine "
    "ten one three zero yes no what where when how why who only hi cold start warm fast slow"
)
CHAT_TEMPLATE: Final = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_T = gguf.TokenType


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece ("llama") vocab: specials, 256 byte tokens, words with every prefix.

    Every prefix of each word is a token, so SPM's pairwise merging can reach whole words; a
    longer piece scores higher, so merges prefer it.
    """
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [_T.UNKNOWN, _T.CONTROL, _T.CONTROL, *([_T.BYTE] * 256)]
    words = WORDS.split()
    pieces = sorted({"\u2581" + w[:n] for w in words for n in range(1, len(w) + 1)})
    pieces += sorted({w[:n] for w in words for n in range(1, len(w) + 1)} - set(pieces))
    tokens += ["\u2581", *pieces]
    types += [_T.NORMAL] * (len(pieces) + 1)
    scores = [0.0] * 259 + [float(len(p)) for p in ["\u2581", *pieces]]
    return tokens, scores, [int(t) for t in types]


def _metadata(w: gguf.GGUFWriter, shape: Shape, vocab: tuple[list[str], list[float], list[int]]):
    tokens, scores, types = vocab
    w.add_name("tiny-random-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(shape.n_embd // shape.n_head)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _tensors(shape: Shape, n_vocab: int, seed: int):
    rng = np.random.default_rng(seed)

    def dense(rows: int, cols: int) -> np.ndarray:
        # Small weights keep activations finite through every layer.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(shape.n_embd, dtype=np.float32)

    e, ff = shape.n_embd, shape.n_ff
    yield "token_embd.weight", dense(n_vocab, e)
    for i in range(shape.n_layer):
        yield f"blk.{i}.attn_norm.weight", norm()
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            yield f"blk.{i}.{name}.weight", dense(e, e)
        yield f"blk.{i}.ffn_norm.weight", norm()
        yield f"blk.{i}.ffn_gate.weight", dense(ff, e)
        yield f"blk.{i}.ffn_up.weight", dense(ff, e)
        yield f"blk.{i}.ffn_down.weight", dense(e, ff)
    yield "output_norm.weight", norm()
    yield "output.weight", dense(n_vocab, e)


def write_model(path: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the model to ``path`` (parents created) and return the path."""
    shape = PRESETS[preset]
    vocab = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    _metadata(w, shape, vocab)
    for name, data in _tensors(shape, len(vocab[0]), seed):
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = write_model(args.out, args.preset, args.seed)
    print(f"{out} {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
