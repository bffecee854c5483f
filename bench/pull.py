"""Pull through the service against huggingface_hub's own download, same file, same hub.

Both fetch SmolLM2's 98 MB GGUF from the loopback hub of tests/fake_hub.py
into an empty hub cache, rounds alternating: `hf_hub_download` called
directly, and the Pull RPC of a server in this process (admission included,
its header read once per round; the file hashed as it arrives). Then the
same Pull again, which moves nothing but re-hashes the cached file. Prints
medians and the ratio; loopback makes the disk and the copy the limit, so
absolute figures are only a guide.

    python -m bench.pull [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub import hf_hub_download

from inference.v1 import inference_pb2 as pb
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo

FILE = EMBEDDED_MODELS[SMOLLM].locate()
NAME = FILE.name
REPO = "acme/smol-gguf"


def raw_seconds(hub: FakeHub, cache: Path) -> float:
    start = time.perf_counter()
    hf_hub_download(REPO, NAME, cache_dir=cache, endpoint=hub.url, token=False)
    return time.perf_counter() - start


def service_seconds(hub: FakeHub, cache: Path) -> tuple[float, float]:
    """A pull into the empty cache, then a repeat pull (which re-hashes what is cached)."""
    settings = make_settings(
        hf_cache_dir=cache, hf_offline=False, hf_endpoint=hub.url, hf_token=None, allow_pull=True
    )
    with serving(settings) as (_, stub):
        times = []
        for expected in (FILE.stat().st_size, 0):
            start = time.perf_counter()
            events = list(stub.Pull(pb.PullRequest(model=REPO)))
            times.append(time.perf_counter() - start)
            assert events[-1].finished.bytes_transferred == expected
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hub = FakeHub(repos={REPO: FakeRepo({NAME: FILE})}).start()
    raw: list[float] = []
    served: list[float] = []
    repeated: list[float] = []
    try:
        for _ in range(args.rounds):
            with _empty_cache() as cache:
                raw.append(raw_seconds(hub, cache))
            with _empty_cache() as cache:
                first, again = service_seconds(hub, cache)
                served.append(first)
                repeated.append(again)
    finally:
        hub.stop()
    size_mb = FILE.stat().st_size / 1e6
    raw_s, served_s = statistics.median(raw), statistics.median(served)
    again_s = statistics.median(repeated)
    print(f"{size_mb:.0f} MB GGUF, loopback hub, medians of {args.rounds}")
    print(f"hf_hub_download     {raw_s:6.2f} s  {size_mb / raw_s:7.1f} MB/s")
    print(f"Pull RPC            {served_s:6.2f} s  {size_mb / served_s:7.1f} MB/s")
    print(f"Pull / raw time     {served_s / raw_s:6.2f}x")
    print(f"Pull again (cached) {again_s:6.2f} s  (checks the cached file's sha256)")


@contextmanager
def _empty_cache() -> Iterator[Path]:
    cache = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    try:
        yield cache
    finally:
        shutil.rmtree(cache)


if __name__ == "__main__":
    main()
