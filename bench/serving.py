"""A serving benchmark in the shape of vLLM's benchmark_serving: real traffic, side by side.

    python -m bench.serving [--model gemma3-270m] [--dataset random] [--num-prompts 64]
        [--input-len 100:2000] [--output-len 32:512] [--concurrency 8 | --request-rate 4]
        [--llama-server PATH/llama-server] [--batched-bench PATH/llama-batched-bench]
        [--sampled | --samplings greedy,sampled] [--sample-in-graph on,off] [--out DIR]

Distinct prompts of the drawn lengths (bench.workload: random, shared-prefix or
multi-turn; seeded) go to the service, started in a subprocess with its
default settings apart from the sequence count and context, and, with
`--llama-server`, to llama.cpp's own server on the same model, prompts and
lengths, one after the other in one run. A fixed concurrency keeps N requests
in flight; `--request-rate` sends open-loop with Poisson arrivals. For each
server it prints requests/s, output tokens/s, TTFT p50/p90/p99, inter-token
latency p50/p99 and goodput (requests/s that met `--slo-ttft-ms` and
`--slo-itl-ms`), the ratios against llama-server, and the load generator's own
CPU use (one asyncio process; if it nears 100% of a core, the figures are the
client's, not the server's). With `--batched-bench`, llama.cpp's own batched
loop runs at the same lengths and batch (bench.ceiling) as the ceiling row. `--out`
writes the figures as JSON and a chart.

`--samplings greedy,sampled` sends the same work greedy, then sampled
(temperature 0.8, top_p 0.95; `whole`: the same without top-k, so that top-p and
min-p decide over the whole vocabulary), to one server; `--sample-in-graph on,off` starts
the service once per setting (issue 39: draws inside llama.cpp's graph, or on
the host). Each service row is then named by both, and every row's ratios to
the first service row, to llama-server and to the ceiling are printed.
Each configuration's row is also printed the moment it finishes ("finished: ..."),
so a run cut short by a machine's time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import cast, get_args

import llama_cpp

from bench.ceiling import Ceiling, batched_bench_command, measure
from bench.chart import bar_chart
from bench.llama_server import GPU_FLAGS, llama_server
from bench.py_spy import recording
from bench.server import SAMPLED, WHOLE_ROW, running_server
from bench.targets import LlamaServerTarget, Outcome, ServiceTarget, Target
from bench.workload import Lengths, Request, Texts, parse_range, poisson_gaps, requests
from service.admission.gates import llama_cpp_computes_on_gpu
from service.backends.names import KvLayout, batch_size_on, kv_layout_on
from service.config import available_cores
from service.models.embedded import EMBEDDED_MODELS


@dataclass(frozen=True)
class Figures:
    server: str
    requests: int
    errors: int
    seconds: float
    requests_per_second: float
    output_tokens_per_second: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    goodput_rps: float
    client_cpu: float  # the load generator's CPU seconds per wall second


async def drive(
    target: Target, work: Sequence[Request], concurrency: int, gaps: list[float] | None
) -> tuple[list[Outcome], float, float]:
    """Send the work; the outcomes, the wall seconds, the client's CPU seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    if gaps is None:
        outcomes = await _closed_loop(target, work, concurrency)
    else:
        outcomes = await _open_loop(target, work, gaps)
    return outcomes, time.perf_counter() - started, time.process_time() - cpu


async def _closed_loop(target: Target, work: Sequence[Request], clients: int) -> list[Outcome]:
    """`clients` at once, each sending its next request when its last ended; a
    conversation's turns stay in order on one client."""
    queues: list[list[Request]] = [[] for _ in range(clients)]
    for index, request in enumerate(work):
        queues[(request.conversation if request.turn else index) % clients].append(request)

    async def client(queue: list[Request]) -> list[Outcome]:
        return [await target.send(request) for request in queue]

    results = await asyncio.gather(*(client(queue) for queue in queues))
    return [outcome for result in results for outcome in result]


async def _open_loop(target: Target, work: Sequence[Request], gaps: list[float]) -> list[Outcome]:
    tasks = []
    for request, gap in zip(work, gaps, strict=True):
        await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(target.send(request)))
    return list(await asyncio.gather(*tasks))


# What each --samplings kind sends (None: greedy, the targets' default).
SAMPLINGS: dict[str, dict[str, float] | None] = {
    "greedy": None,
    "sampled": dict(SAMPLED),
    "whole": dict(WHOLE_ROW),
}


def figures(
    server: str, outcomes: list[Outcome], seconds: float, cpu: float, slo: tuple[float, float]
) -> Figures:
    good = [o for o in outcomes if not o.error and o.first]
    ttfts = [o.ttft * 1000 for o in good]
    itls = [
        (later - earlier) * 1000
        for o in good
        for earlier, later in zip([o.first, *o.token_times], o.token_times, strict=False)
    ]
    met = [o for o in good if o.ttft * 1000 <= slo[0] and _mean_itl_ms(o) <= slo[1]]
    return Figures(
        server=server,
        requests=len(outcomes),
        errors=len(outcomes) - len(good),
        seconds=seconds,
        requests_per_second=len(good) / seconds,
        output_tokens_per_second=sum(o.output_tokens for o in good) / seconds,
        ttft_ms=_percentiles(ttfts, (50, 90, 99)),
        itl_ms=_percentiles(itls, (50, 99)),
        goodput_rps=len(met) / seconds,
        client_cpu=cpu / seconds,
    )


def _mean_itl_ms(outcome: Outcome) -> float:
    if outcome.output_tokens < 2:
        return 0.0
    return (outcome.ended - outcome.first) * 1000 / (outcome.output_tokens - 1)


def _percentiles(values: list[float], which: tuple[int, ...]) -> dict[str, float]:
    if len(values) < 2:
        return {f"p{p}": values[0] if values else 0.0 for p in which}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {f"p{p}": cuts[p - 1] for p in which}


def llama_server_flags(threads: int, gpu_layers: int) -> list[str]:
    """llama-server's settings beside the service's: its threads on a CPU; on a GPU
    every layer there, with flash attention."""
    return ["-t", str(threads), *(GPU_FLAGS if gpu_layers else [])]


async def run_one(
    make: Callable[[], Target], work: list[Request], args: argparse.Namespace
) -> Figures:
    target = make()  # in the running loop: grpc.aio channels belong to one
    gaps = None
    if args.request_rate:
        gaps = poisson_gaps(len(work), args.request_rate, args.seed)
    warm = Request(work[0].prompt[:200], 0, 2)
    await target.send(warm)  # the model loaded and its first-call costs paid
    outcomes, seconds, cpu = await drive(target, work, args.concurrency, gaps)
    await target.close()
    return figures(target.name, outcomes, seconds, cpu, (args.slo_ttft_ms, args.slo_itl_ms))


HEADER = "server        req/s  out tok/s  TTFT p50/p90/p99 ms     ITL p50/p99 ms  goodput  cpu"


def row_line(r: Figures) -> str:
    """One configuration's figures, as a row under HEADER."""
    ttft = "/".join(f"{r.ttft_ms[p]:.0f}" for p in ("p50", "p90", "p99"))
    itl = "/".join(f"{r.itl_ms[p]:.1f}" for p in ("p50", "p99"))
    return (
        f"{r.server:12} {r.requests_per_second:6.2f} {r.output_tokens_per_second:10.1f}  "
        f"{ttft:>20}  {itl:>14}  {r.goodput_rps:7.2f}  {r.client_cpu:4.0%}"
        + (f"  ({r.errors} errors)" if r.errors else "")
    )


def finished(results: list[Figures], result: Figures) -> None:
    """Keep one configuration's figures and print them now: a run cut short by a
    machine's time limit keeps every row it finished (the table and ratios follow at
    the end)."""
    results.append(result)
    print(f"finished: {row_line(result)}", flush=True)


def report(results: list[Figures], args: argparse.Namespace, work: list[Request]) -> None:
    load = (
        f"{args.request_rate} req/s (Poisson)"
        if args.request_rate
        else (f"concurrency {args.concurrency}")
    )
    prompt = statistics.mean(r.prompt_tokens for r in work)
    print(
        f"{args.dataset}, {len(work)} requests, {load}; prompts {prompt:.0f} tokens on "
        f"average ({args.input_len}), outputs up to {args.output_len}; "
        f"{args.samplings or ('sampled' if args.sampled else 'greedy')}; {args.kv_layout} KV "
        "cache, the "
        f"service's steps of up to {args.step_tokens} tokens"
    )
    print(HEADER)
    for r in results:
        print(row_line(r))
    peers = [r for r in results if r.server.startswith("llama-server")]
    theirs = max(peers, key=lambda r: r.output_tokens_per_second, default=None)
    ours = [r for r in results if not r.server.startswith("llama-server")]
    for row in ours[1:]:
        print(f"{row.server} / {ours[0].server}: {_ratios(row, ours[0])}")
    for row in ours if theirs else []:
        print(f"{row.server} / {theirs.server if theirs else ''}: {_ratios(row, theirs)}")
    if any(r.client_cpu > 0.8 for r in results):
        print("the load generator used over 80% of a core: the figures may be its own")


def _ratios(ours: Figures, theirs: Figures | None) -> str:
    assert theirs is not None
    return (
        f"output tokens/s {ours.output_tokens_per_second / theirs.output_tokens_per_second:.2f}x,"
        f" TTFT p50 {ours.ttft_ms['p50'] / max(theirs.ttft_ms['p50'], 1e-9):.2f}x, TTFT p99 "
        f"{ours.ttft_ms['p99'] / max(theirs.ttft_ms['p99'], 1e-9):.2f}x, ITL p50 "
        f"{ours.itl_ms['p50'] / max(theirs.itl_ms['p50'], 1e-9):.2f}x"
    )


def service_rows(
    args: argparse.Namespace,
    work: list[Request],
    flags: list[str],
    samplings: list[str],
    suffix: str = "",
) -> list[Figures]:
    """The service's rows: started once per --sample-in-graph setting, sent the work
    once per sampling."""
    results: list[Figures] = []
    placements = [p for p in args.sample_in_graph.split(",") if p] or [""]
    named = len(samplings) > 1 or placements != [""]
    for placement in placements:
        extra = ["--sample-in-graph", placement] if placement else []
        with running_server(args.model, args.threads, flags + extra) as (address, pid):
            profile = (args.out or Path("bench-results")) / "py-spy-service.txt"
            with recording(args.py_spy, pid, profile):
                for kind in samplings:
                    target = partial(ServiceTarget, address, SAMPLINGS[kind])
                    result = asyncio.run(run_one(target, work, args))
                    name = f"svc {kind[:6]} {placement or 'dflt'}" if named else result.server
                    finished(results, replace(result, server=name + suffix))
    return results


def llama_server_rows(
    args: argparse.Namespace,
    work: list[Request],
    model: str,
    context: int,
    unified: bool,
    suffix: str = "",
) -> list[Figures]:
    """llama-server's rows, one per --llama-server-variants configuration."""
    results: list[Figures] = []
    # llama-server gets the first sampling only: its rows compare with the service's first.
    sampling = SAMPLINGS[
        (args.samplings or ("sampled" if args.sampled else "greedy")).split(",")[0]
    ]
    for variant in args.llama_server_variants.split(";"):
        parts = set(variant.split("+")) - {""}
        flags = llama_server_flags(args.threads, args.gpu_layers)
        flags += ["--backend-sampling"] if "backend-sampling" in parts else []
        layout = unified if not {"kvu", "no-kvu"} & parts else "kvu" in parts
        server = llama_server(
            args.llama_server, model, args.concurrency, context, flags, unified=layout
        )
        with server as url:
            result = asyncio.run(run_one(lambda: LlamaServerTarget(url, sampling), work, args))
        name = f"llama-server[{variant}]" if variant else result.server
        finished(results, replace(result, server=name + suffix))
    return results


def round_ratios(results: Sequence[Figures], rounds: int) -> str:
    """Per service configuration, its output tokens/s over the fastest llama-server
    row of the same round, round by round, and their median."""
    by_name: dict[str, list[float]] = {}
    for index in range(1, rounds + 1):
        mine = [r for r in results if r.server.endswith(f" #{index}")]
        theirs = [r.output_tokens_per_second for r in mine if r.server.startswith("llama-server")]
        for row in mine if theirs else []:
            if not row.server.startswith("llama-server"):
                name = row.server.removesuffix(f" #{index}")
                by_name.setdefault(name, []).append(row.output_tokens_per_second / max(theirs))
    if not by_name:
        return "no round finished both servers"
    return "\n".join(
        f"{name} / fastest llama-server, by round: "
        f"{', '.join(f'{ratio:.2f}x' for ratio in ratios)}; median "
        f"{statistics.median(ratios):.2f}x"
        for name, ratios in by_name.items()
    )


def measure_ceiling(args: argparse.Namespace, model: str, unified: bool) -> Ceiling:
    """llama-batched-bench at the run's lengths, batch and KV layout."""
    lengths = (parse_range(args.input_len)[0], parse_range(args.output_len)[0])
    command = batched_bench_command(
        args.batched_bench,
        model,
        lengths,
        args.concurrency,
        unified=unified,
        gpu_layers=args.gpu_layers,
        threads=args.threads,
    )
    return measure(command, args.concurrency)


def report_ceiling(service: Figures, ceiling: Ceiling) -> None:
    print(
        f"llama-batched-bench {ceiling.layout}, {ceiling.streams} sequences: "
        f"{ceiling.output_tokens_per_second:.1f} output tok/s over its whole run, prompts "
        f"in {ceiling.prefill_seconds * 1000:.0f} ms, a decode step {ceiling.step_ms:.1f} ms"
    )
    print(
        f"{service.server} / ceiling: output tokens/s "
        f"{service.output_tokens_per_second / ceiling.output_tokens_per_second:.2f}x, "
        f"TTFT p50 {service.ttft_ms['p50'] / (ceiling.prefill_seconds * 1000):.2f}x its "
        f"prompt time, ITL p50 {service.itl_ms['p50'] / ceiling.step_ms:.2f}x its step"
    )


def write(results: list[Figures], out: Path, ceiling: Ceiling | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "serving.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    if ceiling:
        (out / "ceiling.json").write_text(json.dumps(asdict(ceiling), indent=2))
    groups = ["TTFT p50", "TTFT p90", "TTFT p99", "ITL p50 x10", "ITL p99 x10"]
    series: dict[str, Sequence[float]] = {
        r.server: [*r.ttft_ms.values(), r.itl_ms["p50"] * 10, r.itl_ms["p99"] * 10] for r in results
    }
    bar_chart(out / "serving.png", "bench.serving: latency (ms)", groups, series, "ms")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help="an embedded model's name")
    parser.add_argument("--model-path", type=Path, help="a GGUF file instead")
    parser.add_argument(
        "--dataset", default="random", choices=("random", "shared-prefix", "multi-turn")
    )
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", default="100:2000", help="tokens, N or LOW:HIGH")
    parser.add_argument("--output-len", default="32:512", help="tokens, N or LOW:HIGH")
    parser.add_argument("--shared-prefix-len", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--parallel-sequences",
        type=int,
        help="the service's --parallel-sequences (default: --concurrency)",
    )
    parser.add_argument("--request-rate", type=float, help="open loop, requests/s (Poisson)")
    parser.add_argument("--sampled", action="store_true", help="temperature 0.8, top_p 0.95")
    parser.add_argument(
        "--samplings",
        help="comma-separated: greedy, sampled, whole (sampled without top-k); each "
        "sent to the same server in turn (default: --sampled's choice)",
    )
    parser.add_argument(
        "--sample-in-graph",
        default="",
        help="comma-separated: auto, on, off; the service started once for each "
        "(default: its own default)",
    )
    parser.add_argument("--slo-ttft-ms", type=float, default=2000)
    parser.add_argument("--slo-itl-ms", type=float, default=200)
    parser.add_argument("--llama-server", help="a llama-server binary to compare against")
    parser.add_argument(
        "--llama-server-variants",
        default="",
        help="semicolon-separated llama-server configurations, each run in turn, of "
        "kvu or no-kvu (default: the service's layout) and backend-sampling, joined by "
        "+ (e.g. 'no-kvu;kvu;no-kvu+backend-sampling'); ratios are to the fastest",
    )
    parser.add_argument(
        "--batched-bench",
        help="a llama-batched-bench binary: the ceiling row, at fixed --input-len and "
        "--output-len and a batch of --concurrency, in the service's KV layout",
    )
    parser.add_argument(
        "--py-spy",
        help="a py-spy binary: sample the service's processes during its run into "
        "OUT/py-spy-service.txt (collapsed stacks; OUT is --out, else bench-results)",
    )
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument(
        "--kv-layout",
        default="auto",
        help="the KV cache layout of both servers: one pool (unified; llama-server -kvu) "
        "or a cache per sequence (per-sequence; llama-server's slots without -kvu); auto, "
        "the service's default, is per-sequence with --gpu-layers on a GPU build, else "
        "unified. Comma-separated, the service runs once per layout; llama-server and "
        "the ceiling take the first",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every server this many times, alternating, and print each round's "
        "ratio and their median (for machines whose speed drifts)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    unknown_layouts = set(args.kv_layout.split(",")) - set(get_args(KvLayout))
    if unknown_layouts:
        parser.error(
            f"--kv-layout: {', '.join(sorted(unknown_layouts))}? (auto, unified, per-sequence)"
        )
    fixed = all(":" not in text for text in (args.input_len, args.output_len))
    if args.batched_bench and not (fixed and args.dataset == "random"):
        parser.error("--batched-bench needs the random dataset with fixed lengths")
    return args


def main() -> None:
    args = parse_args()
    path = args.model_path or EMBEDDED_MODELS[args.model].locate()
    vocabulary = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    texts = Texts(
        lambda text: list(vocabulary.tokenize(text.encode(), add_bos=False)),
        lambda ids: vocabulary.detokenize(ids).decode("utf-8", errors="ignore"),
        args.seed,
    )
    lengths = Lengths(
        parse_range(args.input_len), parse_range(args.output_len), args.shared_prefix_len
    )
    work = requests(args.dataset, args.num_prompts, lengths, texts, args.seed)
    slots = args.concurrency
    longest = max(r.prompt_tokens + r.max_tokens for r in work) + 16
    context = slots * longest
    # As the service settles "auto" (see service.models.pool.kv_cache_layout).
    on_gpu = args.gpu_layers != 0 and llama_cpp_computes_on_gpu()
    layouts = [kv_layout_on(cast(KvLayout, name), on_gpu) for name in args.kv_layout.split(",")]
    args.kv_layout = layouts[0]
    args.step_tokens = batch_size_on(None, on_gpu)  # the service's default, as it settles it
    unified = args.kv_layout == "unified"
    samplings = (args.samplings or ("sampled" if args.sampled else "greedy")).split(",")
    unknown = set(samplings) - set(SAMPLINGS)
    if unknown:
        raise SystemExit(f"--samplings: {', '.join(sorted(unknown))}? (greedy, sampled, whole)")
    parallel = args.parallel_sequences or slots
    flags = ["--parallel-sequences", str(parallel), "--gpu-layers", str(args.gpu_layers)]
    if args.model_path:
        args.model = "bench"
        flags += ["--model", f"bench={path}"]
    results: list[Figures] = []
    for round_index in range(args.rounds):
        # Several rounds alternate the servers, so that a machine whose speed drifts
        # (a shared VM) shows as a spread of ratios rather than one lucky one.
        suffix = f" #{round_index + 1}" if args.rounds > 1 else ""
        for layout in layouts:
            # A pool holds every stream's longest; a cache per sequence holds one.
            size = context if layout == "unified" else longest
            cache = ["--kv-layout", layout, "--context-size", str(size)]
            named = f" {layout}" if len(layouts) > 1 else ""
            results += service_rows(args, work, flags + cache, samplings, named + suffix)
        if args.llama_server:
            results += llama_server_rows(args, work, str(path), context, unified, suffix)
    report(results, args, work)
    if args.rounds > 1 and args.llama_server:
        print(round_ratios(results, args.rounds))
    ceiling = None
    if args.batched_bench:
        ceiling = measure_ceiling(args, str(path), unified)
        for row in results:
            if not row.server.startswith("llama-server"):
                report_ceiling(row, ceiling)
    if args.out:
        write(results, args.out, ceiling)


if __name__ == "__main__":
    main()
