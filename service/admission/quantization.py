"""How a checkpoint stores its weights, named in one vocabulary for every format.

Two sources describe it: a GGUF file's `general.file_type` and tensor types,
and a config.json's `quantization` block (MLX) or `quantization_config` block
(Hugging Face `quant_method` families such as awq, gptq, bitsandbytes).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inference.v1 import inference_pb2 as pb


class QuantScheme(enum.Enum):
    UNQUANTIZED = pb.QUANTIZATION_SCHEME_UNQUANTIZED
    AFFINE_GROUP_INT = pb.QUANTIZATION_SCHEME_AFFINE_GROUP_INT
    BLOCK_SCALED_FLOAT = pb.QUANTIZATION_SCHEME_BLOCK_SCALED_FLOAT
    GGUF_K_QUANT = pb.QUANTIZATION_SCHEME_GGUF_K_QUANT
    GGUF_BLOCK = pb.QUANTIZATION_SCHEME_GGUF_BLOCK
    UNKNOWN_METHOD = pb.QUANTIZATION_SCHEME_UNKNOWN_METHOD


# MLX's own quantization modes (mlx.core.quantize's `mode`).
BLOCK_SCALED_FLOAT_MODES = frozenset({"mxfp4", "mxfp8", "nvfp4"})
# A method or dtype name is a word ("awq", "bitsandbytes", "bfloat16"); a config's
# longer one is kept cut to this, so a description stays small whatever it named.
METHOD_CHARACTERS = 64
_FLOAT_BITS = {"f32": 32, "float32": 32, "f16": 16, "float16": 16, "bf16": 16, "bfloat16": 16}


@dataclass(frozen=True)
class Quantization:
    scheme: QuantScheme
    method: str
    bits: int = 0
    group_size: int = 0

    def to_pb(self) -> pb.Quantization:
        return pb.Quantization(
            scheme=self.scheme.value, method=self.method, bits=self.bits, group_size=self.group_size
        )


def from_gguf_type_name(name: str, block_size: int = 0) -> Quantization:
    """A GGUF file type or tensor type name: "Q4_K_M", "Q8_0", "IQ4_XS", "BF16", "MXFP4_MOE"."""
    upper = name.upper()
    if upper.lower() in _FLOAT_BITS:
        return Quantization(QuantScheme.UNQUANTIZED, upper, _FLOAT_BITS[upper.lower()])
    bits_match = re.search(r"(\d+)", upper)
    bits = int(bits_match.group(1)) if bits_match else 0
    if upper.startswith(("MXFP", "NVFP")):
        return Quantization(QuantScheme.BLOCK_SCALED_FLOAT, upper, bits, block_size)
    if "_K" in upper:
        return Quantization(QuantScheme.GGUF_K_QUANT, upper, bits, block_size or 256)
    return Quantization(QuantScheme.GGUF_BLOCK, upper, bits, block_size)


def from_checkpoint_config(config: Mapping[str, Any]) -> Quantization:
    """The layout a config.json declares; full precision when it declares none."""
    mlx_block = config.get("quantization")
    if isinstance(mlx_block, Mapping):
        return _from_mlx_block(mlx_block)
    hf_block = config.get("quantization_config")
    if isinstance(hf_block, Mapping):
        method = hf_block.get("quant_method")
        if method is None:  # mlx-lm writes its block under this name too
            return _from_mlx_block(hf_block)
        return Quantization(
            QuantScheme.UNKNOWN_METHOD,
            _name(method),
            _int(hf_block.get("bits") or hf_block.get("w_bit")),
            _int(hf_block.get("group_size") or hf_block.get("q_group_size")),
        )
    dtype = _name(config.get("torch_dtype") or config.get("dtype") or "float16")
    return Quantization(QuantScheme.UNQUANTIZED, dtype, _FLOAT_BITS.get(dtype, 0))


def _from_mlx_block(block: Mapping[str, Any]) -> Quantization:
    mode = _name(block.get("mode") or "affine")
    bits, group_size = _int(block.get("bits")), _int(block.get("group_size"))
    if mode in BLOCK_SCALED_FLOAT_MODES:
        return Quantization(QuantScheme.BLOCK_SCALED_FLOAT, mode, bits, group_size)
    if mode == "affine":
        return Quantization(QuantScheme.AFFINE_GROUP_INT, "affine", bits, group_size)
    return Quantization(QuantScheme.UNKNOWN_METHOD, mode, bits, group_size)


def _name(value: Any) -> str:
    """A method, mode or dtype as named in a config, lower case, at most METHOD_CHARACTERS."""
    return str(value)[: METHOD_CHARACTERS * 4].lower()[:METHOD_CHARACTERS]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
