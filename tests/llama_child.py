"""Load GGUF files with the service's llama.cpp backend in a child process.

A broken model file can abort the process that loads it (a GGML_ASSERT is a
SIGABRT), so the files are loaded in a child: it loads each file as the
server would, creates a small context and decodes a few tokens, and prints
one line per file. When the child dies by a signal, the file it was on is
marked killed by that signal and a new child carries on with the rest.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_CHILD = r"""
import resource, sys
from pathlib import Path

# A mutated header may ask for absurd buffers: fail the allocation, not the machine.
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

from service.backends.base import SequenceRequest
from service.backends.llama_cpp import LlamaCppBackend, LlamaCppOptions
from service.text.requests import SamplingParams

OPTIONS = LlamaCppOptions(
    context_size=256, threads=1, max_sequences=1, cached_sequences=0, batch_size=32,
    prefill_chunk=32,
)
GREEDY = SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0, repeat_penalty=1, seed=1)


def run(path: Path) -> str:
    backend = LlamaCppBackend(path, OPTIONS)
    try:
        prompt = backend.tokenize("Hello, how are", add_bos=True) or [0]
        sequence = backend.start(SequenceRequest(tuple(prompt), GREEDY, max_tokens=4))
        tokens = []
        for _ in range(8):
            tokens += [s.token for s in backend.step([sequence], lambda: None) if s]
            if len(tokens) >= 3:
                break
        backend.finish(sequence)
        return f"decoded {len(tokens)}"
    finally:
        backend.close()


for name in sys.argv[1:]:
    try:
        outcome = "ok " + run(Path(name))
    except Exception as exc:
        outcome = "raised " + type(exc).__name__ + ": " + str(exc)[:200].replace("\n", " ")
    print("@@", outcome, flush=True)
"""


@dataclass(frozen=True)
class Outcome:
    path: Path
    kind: str  # "ok", "raised", "killed" (by a signal) or "hung"
    detail: str

    @property
    def killed(self) -> bool:
        return self.kind in ("killed", "hung")


def load_in_children(paths: list[Path], timeout: float = 120) -> list[Outcome]:
    """Each file loaded and decoded as the server would, in as few children as can be."""
    outcomes: list[Outcome] = []
    while len(outcomes) < len(paths):
        outcomes += _one_child(paths[len(outcomes) :], timeout)
    return outcomes


def _one_child(paths: list[Path], timeout: float) -> list[Outcome]:
    command = [sys.executable, "-c", _CHILD, *map(str, paths)]
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return _read(paths, stdout, "hung", f"no answer within {timeout} s")
    if done.returncode < 0:
        why = signal.Signals(-done.returncode).name
        return _read(paths, done.stdout, "killed", f"{why}; {done.stderr[-300:]}")
    if done.returncode != 0:
        raise RuntimeError(f"the child failed outside any model: {done.stderr[-2000:]}")
    return _read(paths, done.stdout, "", "")


def _read(paths: list[Path], stdout: str, fatal: str, why: str) -> list[Outcome]:
    """Finished files from the child's lines; with `fatal`, the file it died on too."""
    lines = [line[3:] for line in stdout.splitlines() if line.startswith("@@ ")]
    outcomes = [
        Outcome(path, *line.split(" ", 1)) for path, line in zip(paths, lines, strict=False)
    ]
    if fatal and len(outcomes) < len(paths):
        outcomes.append(Outcome(paths[len(outcomes)], fatal, why))
    return outcomes
