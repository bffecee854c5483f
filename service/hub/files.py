"""Which files of a hub repo a backend needs, from the repo's file names alone."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Iterable

from service.errors import InvalidRequest, ModelNotFound, excerpt
from service.model_source import SourceKind

# llama.cpp opens the other parts of a split GGUF by this pattern, beside the first.
SPLIT_GGUF = re.compile(r"^(?P<prefix>.+)-\d{5}-of-(?P<count>\d{5})\.gguf$")
# Beside its safetensors, what mlx-lm (and transformers' tokenizers) read from a checkpoint.
_CHECKPOINT_SIDE_FILES = re.compile(r"^[^/]+\.(json|model|tiktoken|txt|jinja)$")
# Weight formats a diffusers component may hold; safetensors wins where both exist.
PIPELINE_WEIGHTS = (".safetensors", ".bin")
_NEVER = (".onnx", ".msgpack", ".h5", ".ot", ".pb", ".tflite", ".mlmodel")
# Names a message lists before "and N more".
NAMES_SHOWN = 5


def repo_kind(names: Collection[str], file: str | None) -> SourceKind:
    """What a repo holds: a diffusers pipeline, a safetensors checkpoint, or GGUF files."""
    if file is not None:
        return "gguf"
    if "model_index.json" in names:
        return "diffusers"
    if "config.json" in names and any(_top_level(n, ".safetensors") for n in names):
        return "checkpoint"
    if any(n.endswith(".gguf") for n in names):
        return "gguf"
    return "unknown"


def pick_gguf(names: Collection[str], file: str | None, label: str) -> str:
    """The GGUF file a reference means: named exactly, the one whose name carries the
    tag (`:Q4_K_M`), or the repo's only one. For a split file, its first part."""
    ggufs = sorted(n for n in names if n.endswith(".gguf") and is_first_part(n))
    if file is not None and file in names:
        return file
    if file is not None:
        tag = file.lower()
        ggufs = [n for n in ggufs if tag in posixpath.basename(n).lower()]
        if not ggufs:
            raise ModelNotFound(
                f"{excerpt(label)}: no GGUF file in the repo matches {excerpt(file)}"
            )
    if not ggufs:
        raise ModelNotFound(f"{excerpt(label)}: the repo holds no GGUF file")
    if len(ggufs) > 1:
        what = excerpt(file) if file is not None else "the repo"
        raise InvalidRequest(
            f"{excerpt(label)}: {what} matches several GGUF files ({_with_sizes(ggufs, names)}); "
            "name one with :FILE or a quantization tag such as :Q4_K_M"
        )
    return ggufs[0]


# GGUF choices an ambiguity message lists, with their sizes when the hub gave them.
_CHOICES_SHOWN = 20


def _with_sizes(ggufs: list[str], names: Collection[str]) -> str:
    if not isinstance(names, dict):
        return some_names(ggufs)
    choices = gguf_choices(names)
    shown = [f"{excerpt(n)} {choices.get(n, 0) / 1e9:.2f} GB" for n in ggufs[:_CHOICES_SHOWN]]
    more = len(ggufs) - _CHOICES_SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def gguf_parts(name: str, names: Collection[str]) -> list[str]:
    """The files llama.cpp opens for a GGUF: itself, or every part of a split one."""
    match = SPLIT_GGUF.match(posixpath.basename(name))
    if match is None:
        return [name]
    count = int(match["count"])
    prefix = posixpath.join(posixpath.dirname(name), match["prefix"])
    parts = [f"{prefix}-{part:05d}-of-{count:05d}.gguf" for part in range(1, count + 1)]
    missing = [part for part in parts if part not in names]
    if missing:
        raise ModelNotFound(
            f"the split GGUF {excerpt(name)} lacks {some_names(missing)} in the repo"
        )
    return parts


def gguf_choices(sizes: dict[str, int]) -> dict[str, int]:
    """Every GGUF a repo offers (a split one by its first part), with its bytes (all parts)."""
    choices: dict[str, int] = {}
    for name in sorted(sizes):
        if name.endswith(".gguf") and is_first_part(name):
            try:
                choices[name] = sum(sizes[part] for part in gguf_parts(name, sizes))
            except ModelNotFound:  # a split one with a part missing: not a choice
                continue
    return choices


def checkpoint_files(names: Iterable[str]) -> list[str]:
    """A safetensors checkpoint's weights, configs and tokenizer files (top level)."""
    return sorted(
        n for n in names if _top_level(n, ".safetensors") or _CHECKPOINT_SIDE_FILES.match(n)
    )


def pipeline_files(names: Collection[str], components: Iterable[str]) -> list[str]:
    """model_index.json and the named components' folders: their configs, and their
    weights in safetensors where a folder has them, else in .bin."""
    chosen = ["model_index.json"]
    for component in sorted(set(components)):
        inside = [n for n in names if n.startswith(f"{component}/") and not n.endswith(_NEVER)]
        safetensors = any(n.endswith(".safetensors") for n in inside)
        for name in sorted(inside):
            if safetensors and name.endswith(".bin"):
                continue
            chosen.append(name)
    return chosen


def _top_level(name: str, suffix: str) -> bool:
    return "/" not in name and name.endswith(suffix)


def is_first_part(name: str) -> bool:
    """Whether a GGUF is one llama.cpp opens: a whole file, or a split one's first part."""
    match = SPLIT_GGUF.match(posixpath.basename(name))
    return match is None or name.endswith(f"-00001-of-{match['count']}.gguf")


def some_names(names: list[str]) -> str:
    """A few of the names, for a message, and how many more there are."""
    shown = ", ".join(excerpt(name) for name in names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown
