"""Model load time with engine processes against loading inside the server.

    python -m bench.load [--model gemma3-270m] [--runs 5]

Starts the service twice, with `--engine-mode process` and `in-process`, and
times the same thing on both: a Generate of one token for a model that is not
loaded (admission, the load, one token) against the same request once it is
(one token). The difference is what loading costs a client; each run unloads
the model again (keep-alive 0.05 s) so that the next one loads it afresh.
Prints both, and the extra time an engine process costs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import grpc

from bench.server import running_server
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores

DEFAULT_MODEL = "smollm2-135m-instruct"


def one_token(stub: pb_grpc.InferenceStub, model: str) -> float:
    """Seconds for a one-token Generate of `model`."""
    request = pb.GenerateRequest(model=model, prompt="Hello", max_tokens=1, temperature=0)
    start = time.perf_counter()
    for _ in stub.Generate(request):
        pass
    return time.perf_counter() - start


def loaded(stub: pb_grpc.InferenceStub, model: str) -> bool:
    models = stub.ListModels(pb.ListModelsRequest()).models
    return any(m.name == model and m.loaded for m in models)


def load_seconds(mode: str, model: str, runs: int, threads: int) -> list[float]:
    """Per run: a cold one-token Generate minus a warm one."""
    flags = ["--engine-mode", mode, "--keep-alive", "0.05", "--context-size", "2048"]
    costs: list[float] = []
    with (
        running_server(DEFAULT_MODEL, threads, flags) as (address, _),
        grpc.insecure_channel(address) as channel,
    ):
        stub = pb_grpc.InferenceStub(channel)
        for _ in range(runs):
            while loaded(stub, model):  # unloaded after the keep-alive
                time.sleep(0.05)
            cold = one_token(stub, model)
            warm = one_token(stub, model)
            costs.append(cold - warm)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help="a model other than the default")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    threads = available_cores()
    medians = {}
    for mode in ("in-process", "process"):
        costs = load_seconds(mode, args.model, args.runs, threads)
        medians[mode] = statistics.median(costs)
        spread = ", ".join(f"{cost:.2f}" for cost in costs)
        print(f"{mode:>10}: load {medians[mode]:.2f} s median ({spread})")
    extra = medians["process"] - medians["in-process"]
    print(f"an engine process adds {extra:+.2f} s to a load (target: about 1 s at most)")


if __name__ == "__main__":
    main()
