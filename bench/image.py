"""GenerateImage through the service versus the same diffusers pipeline called directly.

    python -m bench.image [--runs 3] [--steps 10] [--size 64]

The pipeline is the tiny random Stable Diffusion the tests build (no trained
image model can be downloaded on these machines), so the absolute times say
little; the ratio shows what the service adds per image: gRPC, progress
events, PNG encoding and the worker-thread hand-off.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from bench.server import running_server
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores
from tests.tiny_pipeline import build_tiny_sd_pipeline


def raw_seconds(directory: Path, size: int, steps: int, seed: int) -> float:
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils.logging import disable_progress_bar

    disable_progress_bar()
    pipeline = DiffusionPipeline.from_pretrained(  # type: ignore[no-untyped-call]
        directory, local_files_only=True
    )
    pipeline.set_progress_bar_config(disable=True)
    generator = torch.Generator("cpu").manual_seed(seed)
    started = time.perf_counter()
    with torch.inference_mode():
        pipeline(
            "a red apple", width=size, height=size, num_inference_steps=steps, generator=generator
        )
    return time.perf_counter() - started


def service_seconds(stub: pb_grpc.InferenceStub, size: int, steps: int, seed: int) -> float:
    request = pb.GenerateImageRequest(
        model="tiny-sd", prompt="a red apple", width=size, height=size, steps=steps, seed=seed
    )
    started = time.perf_counter()
    for _ in stub.GenerateImage(request):
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(available_cores())
    with tempfile.TemporaryDirectory() as models:
        directory = build_tiny_sd_pipeline(Path(models) / "tiny-sd")
        extra = ["--models-dir", models]
        with (
            running_server("smollm2-135m-instruct", available_cores(), extra) as (address, _),
            grpc.insecure_channel(address) as channel,
        ):
            stub = pb_grpc.InferenceStub(channel)
            service_seconds(stub, args.size, 1, 0)  # load the pipeline once, like raw below
            raw, served = [], []
            for run in range(args.runs):
                raw.append(raw_seconds(directory, args.size, args.steps, run))
                served.append(service_seconds(stub, args.size, args.steps, run))
    r, s = statistics.median(raw), statistics.median(served)
    print(
        f"tiny SD pipeline  {args.size}x{args.size}  {args.steps} steps  runs {args.runs} (medians)"
    )
    print(f"{'':24}{'raw diffusers':>14}{'service':>12}{'service/raw':>13}")
    print(f"{'seconds per image':24}{r:14.3f}{s:12.3f}{s / r:13.2f}")


if __name__ == "__main__":
    main()
