"""Write a llama-shaped GGUF with random weights and a real vocabulary, for GPU benchmarks.

    python -m bench.gpu_model OUT.gguf --vocab ggml-vocab-llama-bpe.gguf [--shape 1b]
        [--type F16|Q8_0|Q4_K_M|...]
    python -m bench.gpu_model OUT.gguf --from MODEL-F16.gguf --type Q4_K_M

The 1b shape has Llama-3.2-1B's dimensions (16 layers, width 2048, 32 heads, 8
KV heads, feed-forward 8192, tied embeddings), so a decode step reads what the
real model's would; the text it writes is noise. The tokenizer is copied from
any GGUF that has one: llama.cpp's vocab-only `models/ggml-vocab-llama-bpe.gguf`
(in the sdist that scripts/cuda/fetch-sdist.sh trims) is Llama 3's.

F16 and Q8_0 are written directly with the `gguf` package (Q8_0 through its own
quantizer), with nothing else installed. Any other llama.cpp file type (Q4_K_M,
Q6_K, ...) is written as F16 beside OUT, quantized by llama.cpp through
llama-cpp-python (the code behind llama-quantize), and the F16 file removed;
`--from` quantizes an F16 file written earlier instead.

The random weights come from seed 0 and one shared buffer (each tensor a window
into it), so that a 1b file takes about 30 s to write, and the same arguments
give the same bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

Q8_0 = gguf.GGMLQuantizationType.Q8_0
WEIGHT_SCALE = 0.02  # standard deviation of the random weights
_WINDOW_STRIDE = 977  # each tensor starts this far into the buffer after the last one
_WINDOW_SPAN = 4096


@dataclass(frozen=True)
class Shape:
    width: int
    layers: int
    heads: int
    kv_heads: int
    feed_forward: int
    context: int = 8192
    rope_base: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


SHAPES = {
    "1b": Shape(width=2048, layers=16, heads=32, kv_heads=8, feed_forward=8192),
    "tiny": Shape(width=128, layers=2, heads=4, kv_heads=2, feed_forward=256),
}


def copy_tokenizer(vocab: Path, writer: gguf.GGUFWriter) -> int:
    """Copy every tokenizer.* key of `vocab` into `writer`; returns the vocabulary size."""
    size = 0
    for name, field in gguf.GGUFReader(vocab).fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            value = field.contents()
            writer.add_key_value(name, value, kind, sub_type=field.types[-1])
            if name == "tokenizer.ggml.tokens":
                size = len(value)
        else:
            writer.add_key_value(name, field.contents(), kind)
    if not size:
        raise SystemExit(f"{vocab} has no tokenizer.ggml.tokens")
    return size


def tensor_shapes(shape: Shape, vocab_size: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the llama architecture, as llama.cpp names them (numpy order)."""
    width, kv_width, ff = shape.width, shape.kv_heads * shape.head_dim, shape.feed_forward
    yield "token_embd.weight", (vocab_size, width)
    yield "output_norm.weight", (width,)
    for index in range(shape.layers):
        block = f"blk.{index}."
        yield block + "attn_norm.weight", (width,)
        yield block + "attn_q.weight", (width, width)
        yield block + "attn_k.weight", (kv_width, width)
        yield block + "attn_v.weight", (kv_width, width)
        yield block + "attn_output.weight", (width, width)
        yield block + "ffn_norm.weight", (width,)
        yield block + "ffn_gate.weight", (ff, width)
        yield block + "ffn_up.weight", (ff, width)
        yield block + "ffn_down.weight", (width, ff)


class RandomWeights:
    """Windows into one buffer of random float16 values, as many as the largest tensor."""

    def __init__(self, largest: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        values = rng.standard_normal(largest + _WINDOW_SPAN, dtype=np.float32) * WEIGHT_SCALE
        self._buffer = values.astype(np.float16)
        self._offset = 0

    def take(self, shape: tuple[int, ...]) -> npt.NDArray[np.float16]:
        start = self._offset % _WINDOW_SPAN
        self._offset += _WINDOW_STRIDE
        return self._buffer[start : start + int(np.prod(shape))].reshape(shape)


def write_model(out: Path, vocab: Path, shape_name: str, quantized: bool = False) -> None:
    """Write the model in F16, or in Q8_0 when `quantized` (norms stay F32 either way)."""
    shape = SHAPES[shape_name]
    writer = gguf.GGUFWriter(out, "llama")
    vocab_size = copy_tokenizer(vocab, writer)
    writer.add_name(f"random-llama-{shape_name}")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.width)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(vocab_size)
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if quantized else gguf.LlamaFileType.MOSTLY_F16
    writer.add_file_type(file_type)
    weights = RandomWeights(vocab_size * shape.width)
    ones = np.ones(shape.width, dtype=np.float32)
    for name, dims in tensor_shapes(shape, vocab_size):
        if len(dims) == 1:
            writer.add_tensor(name, ones)
        elif quantized:
            data = gguf.quants.quantize(weights.take(dims).astype(np.float32), Q8_0)
            writer.add_tensor(name, data, raw_dtype=Q8_0)
        else:
            writer.add_tensor(name, weights.take(dims))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_quantize(source: Path, out: Path, file_type: str, threads: int) -> None:
    """Quantize with llama.cpp's own quantizer, through llama-cpp-python."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(out).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed ({status}) for {file_type}")


def build(out: Path, vocab: Path, shape: str, file_type: str, threads: int) -> None:
    file_type = file_type.upper()
    if file_type in ("F16", "Q8_0"):
        write_model(out, vocab, shape, quantized=file_type == "Q8_0")
        return
    f16 = out.with_name(out.stem + ".f16.gguf")
    try:
        write_model(f16, vocab, shape)
        llama_quantize(f16, out, file_type, threads)
    finally:
        f16.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--vocab", type=Path, help="a GGUF whose tokenizer.* keys are copied")
    source.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="quantize this F16 model to --type instead of writing one",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    parser.add_argument(
        "--type",
        default="F16",
        help="F16 or Q8_0 (written directly), or a llama.cpp file type such as Q4_K_M "
        "(needs llama-cpp-python); default: F16",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.source is not None:
        llama_quantize(args.source, args.out, args.type.upper(), args.threads)
    else:
        build(args.out, args.vocab, args.shape, args.type, args.threads)
    size = args.out.stat().st_size
    print(
        f"wrote {args.out} ({args.type.upper()}, {size / 2**20:.1f} MiB) "
        f"in {time.perf_counter() - start:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
