"""Many replicas behind Envoy and the endpoint picker: what the path costs, what routing buys.

    python -m bench.cluster [--replicas 3] [--runs 7] [--max-tokens 64]
                            [--model smollm2-135m-instruct] [--conversations 6]
                            [--history-tokens 1200] [--threads CORES-1]

Starts `inference-cluster` (replicas, the picker, Envoy) on loopback, then again
with `--no-picker`, runs both sections on each and prints two markdown tables:

1. What the path costs. The same chat request, greedy, `--max-tokens` long,
   sent directly to the first replica and through Envoy + the picker to the
   same cluster, the two sides alternating run by run (direct first on even
   runs, Envoy first on odd ones) so that the machine's noise hits both. Each
   request's system message starts with its own number (digits reversed, so
   consecutive numbers differ from the first character): no replica's cache
   holds more than the chat template's first tokens of it, wherever it lands,
   so both sides evaluate the same whole prompt. The same prompt on both sides
   would be answered from the cache on one side and perhaps not on the other
   (the picker only knows what it routed), which is a routing difference, not
   the path's. Client TTFT runs from sending the request to the first delta;
   the replica's own TTFT from the request reaching it to its first token.
   The table is the picker's cluster; a line after it repeats the overhead
   measured on the --no-picker cluster, to tell Envoy's share from the picker's.
2. What cache-aware routing buys. `--conversations` conversations with a long,
   distinct first turn (a system message of about `--history-tokens` tokens),
   then a second turn repeating it, on the cluster with the picker and on a
   fresh one with Envoy's least-request alone (`--no-picker`). The first
   turns go all at once, so that both balancers spread them over the
   replicas as real traffic would; the second turns one at a time, so that
   each TTFT is its own prompt's evaluation, not a queue. Every replica keeps
   room for every conversation (--cached-sequences, --context-size), so a
   second turn misses the cache only by landing on another replica.

How to read it. Table 1, "via - direct": the TTFT row carries the prefill's
run-to-run noise (see its min - max row), often more than the 2 ms target;
the difference within each run cancels the machine's slow drifts but not
its jitter; "client minus replica" takes each request's own prefill out, so
its difference is what Envoy, the picker's ext_proc round trips and the
extra loopback hop add: the figure to trust on a noisy machine. Decode
tokens/s should be the same (ratio >= 0.97): Envoy only forwards the stream.

Table 2: the picker's second turns should find the whole history cached and
start many times sooner; least-request finds it only when chance sends the
second turn where the first went (about one in `--replicas`), so with few
conversations its median can land on a lucky hit: the mean and the "there /
elsewhere" column (second turns on the first turn's replica, and on another)
show what a miss costs. Figures are medians ("p50") over runs or
conversations unless marked.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

import grpc

from bench.server import rate
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service.config import available_cores
from service.models.embedded import EMBEDDED_MODELS

REPLICA_HEADER = "x-inference-replica"
TARGET_TTFT_OVERHEAD_MS = 2.0
TARGET_DECODE_RATIO = 0.97
READY_TIMEOUT = 300.0
REQUEST_TIMEOUT = 600.0
FIRST_TURN_TOKENS = 16  # the answer the second turn repeats
SECOND_TURN_TOKENS = 8  # only its TTFT counts

SENTENCES = (
    "The harbour master logged every ship that entered the bay before dawn.",
    "A storm in the north delayed the grain barges by three days.",
    "The council voted to widen the bridge over the river market.",
    "Apprentices at the printing house worked in shifts through the winter.",
    "Merchants from the coast brought salt, copper and dyed wool.",
    "The old lighthouse was rebuilt in stone after the fire.",
    "Fishermen mended their nets on the quay while the tide was out.",
    "A new school opened beside the chapel, teaching letters and sums.",
    "The mill on the hill ground barley for four villages.",
    "Travellers paid a toll at the east gate and another at the ferry.",
    "The archive kept the city's charters in a locked oak chest.",
    "Every spring the guilds paraded through the square with banners.",
)


# --- the cluster -------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterAddresses:
    """Where a running cluster serves: Envoy, each replica, the picker (None without)."""

    listen: str
    replicas: tuple[str, ...]
    picker: str | None


def ready_addresses(line: str) -> ClusterAddresses | None:
    """The addresses in the launcher's `cluster ready` log line; None for any other line."""
    if not line.startswith("{"):
        return None  # Envoy and llama.cpp write lines of their own
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    if record.get("event") != "cluster ready":
        return None
    replicas = tuple(str(replica["address"]) for replica in record["replicas"])
    picker = record.get("picker")
    picker_address = str(picker["address"]) if picker else None
    return ClusterAddresses(str(record["listen"]), replicas, picker_address)


def launcher_command(replicas: int, server_flags: Sequence[str], *, picker: bool) -> list[str]:
    command = [sys.executable, "-m", "service.cluster.launcher", "--replicas", str(replicas)]
    command += ["--listen", "127.0.0.1:0", "--replica-base-port", "0", "--http-listen", "none"]
    command += ["--picker-listen", "127.0.0.1:0", "--log-format", "json"]
    return command + ([] if picker else ["--no-picker"]) + ["--", *server_flags]


@contextmanager
def running_cluster(
    replicas: int, server_flags: Sequence[str] = (), *, picker: bool = True
) -> Iterator[ClusterAddresses]:
    """`inference-cluster` with free ports everywhere, until the block ends (then SIGTERM,
    which stops every replica, the picker and Envoy). Its log goes to a temporary file,
    not a pipe: nothing in this process has to keep reading it while requests are timed."""
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as folder:
        path = Path(folder) / "cluster.log"
        command = launcher_command(replicas, server_flags, picker=picker)
        env = {**os.environ, "INFERENCE_LOG_FORMAT": "json"}
        with path.open("ab") as writer, path.open("rb") as reader:
            process = subprocess.Popen(command, stdout=writer, stderr=writer, env=env)
            try:
                yield wait_until_ready(process, reader)
            finally:
                stop(process)


def wait_until_ready(process: subprocess.Popen[bytes], log: IO[bytes]) -> ClusterAddresses:
    deadline = time.monotonic() + READY_TIMEOUT
    pending = b""
    last: list[str] = []
    while time.monotonic() < deadline:
        *lines, pending = (pending + log.read()).split(b"\n")
        for line in lines:
            last = [*last[-4:], line.decode(errors="replace")]
            if found := ready_addresses(last[-1]):
                return found
        if process.poll() is not None:
            raise RuntimeError(f"inference-cluster exited ({process.returncode}): {last}")
        time.sleep(0.1)
    raise RuntimeError(f"inference-cluster not ready after {READY_TIMEOUT:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
        process.wait(timeout=10)


# --- one timed request ---------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One Generate as the client saw it, with the replica's own figures."""

    ttft_ms: float
    server_ttft_ms: float
    decode_tps: float
    tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int
    replica: str  # Envoy's x-inference-replica; empty on a direct connection
    text: str


def timed_generate(stub: pb_grpc.InferenceStub, request: pb.GenerateRequest) -> Turn:
    start = time.perf_counter()
    call = stub.Generate(request, timeout=REQUEST_TIMEOUT)
    first = last = start
    count = 0
    pieces: list[str] = []
    finished = pb.GenerationFinished()
    for event in call:
        if event.HasField("finished"):
            finished = event.finished
        if not event.HasField("delta"):
            continue
        last = time.perf_counter()
        first = last if count == 0 else first
        count += len(event.delta.token_ids)
        pieces.append(event.delta.text)
    return Turn(
        ttft_ms=(first - start) * 1000 if count else finished.timing.ttft_ms,
        server_ttft_ms=finished.timing.ttft_ms,
        decode_tps=rate(count, first, last),
        tokens=count,
        prompt_tokens=finished.usage.prompt_tokens,
        cached_prompt_tokens=finished.usage.cached_prompt_tokens,
        replica=str(dict(call.initial_metadata()).get(REPLICA_HEADER, "")),
        text="".join(pieces),
    )


def chat(model: str, max_tokens: int, *messages: tuple[str, str]) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        model=model,
        messages=[pb.ChatMessage(role=role, content=content) for role, content in messages],
        max_tokens=max_tokens,
        temperature=0,
    )


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


# --- 1. the path's overhead ----------------------------------------------------------


def story_prompt(index: int) -> tuple[tuple[str, str], tuple[str, str]]:
    """The same request each time but for its first characters: the run's number, its
    digits reversed so that consecutive numbers differ from the first one (a replica's
    cache then holds no prefix of it but the chat template's first tokens)."""
    tag = f"{index:04d}"[::-1]
    system = ("system", f"{tag}. You are a helpful assistant.")
    return system, (
        "user",
        "Write a long story about a lighthouse keeper who finds a message in a bottle. "
        "Describe the island, the weather and the keeper's days.",
    )


def warm_up(
    direct: Sequence[pb_grpc.InferenceStub], via: pb_grpc.InferenceStub, model: str
) -> None:
    """One request to each replica directly, then through Envoy until every replica has
    answered one (so Envoy holds a connection to each, and the picker to Envoy)."""
    for stub in direct:
        timed_generate(stub, chat(model, 4, ("user", "Hello")))
    seen: set[str] = set()
    for attempt in range(8 * len(direct)):
        seen.add(timed_generate(via, chat(model, 4, ("user", f"Hi {attempt}"))).replica)
        if len(seen) >= len(direct):
            return


def measure_path(
    direct: pb_grpc.InferenceStub, via: pb_grpc.InferenceStub, args: argparse.Namespace
) -> dict[str, list[Turn]]:
    """Per side, one Turn per run; the sides alternate which goes first."""
    turns: dict[str, list[Turn]] = {"direct": [], "via": []}
    sides = {"direct": direct, "via": via}
    for run in range(args.runs):
        order = ("direct", "via") if run % 2 == 0 else ("via", "direct")
        for offset, side in enumerate(order):
            request = chat(args.model, args.max_tokens, *story_prompt(2 * run + offset))
            turns[side].append(timed_generate(sides[side], request))
    return turns


def path_figures(turns: Sequence[Turn]) -> dict[str, float]:
    ttfts = [t.ttft_ms for t in turns]
    return {
        "ttft_ms": median(ttfts),
        "ttft_min": min(ttfts),
        "ttft_max": max(ttfts),
        "server_ttft_ms": median([t.server_ttft_ms for t in turns]),
        "outside_ms": median([t.ttft_ms - t.server_ttft_ms for t in turns]),
        "decode_tps": median([t.decode_tps for t in turns]),
        "tokens": median([t.tokens for t in turns]),
        "prompt_tokens": median([t.prompt_tokens for t in turns]),
        "cached": median([t.cached_prompt_tokens for t in turns]),
    }


# --- 2. second turns ----------------------------------------------------------------


def document(index: int, tokens: int) -> str:
    """A text of about `tokens` tokens (~4 characters each), distinct for each index:
    its own first line and its own order of sentences."""
    rng = random.Random(index)
    lines = [f"Chronicle {index} of the harbour town."]
    while sum(len(line) + 1 for line in lines) < 4 * tokens:
        lines += rng.sample(SENTENCES, len(SENTENCES))
    return " ".join(lines)


def first_turn(model: str, index: int, tokens: int) -> pb.GenerateRequest:
    history = ("system", "You answer questions about this chronicle.\n" + document(index, tokens))
    return chat(model, FIRST_TURN_TOKENS, history, ("user", "What happened to the grain barges?"))


def second_turn(first: pb.GenerateRequest, answer: str) -> pb.GenerateRequest:
    follow_up = [pb.ChatMessage(role="assistant", content=answer)]
    follow_up.append(pb.ChatMessage(role="user", content="And what did the council decide?"))
    request = pb.GenerateRequest()
    request.CopyFrom(first)
    request.messages.extend(follow_up)
    request.max_tokens = SECOND_TURN_TOKENS
    return request


@dataclass(frozen=True)
class Conversation:
    first: Turn
    second: Turn


def conversations(stub: pb_grpc.InferenceStub, args: argparse.Namespace) -> list[Conversation]:
    """Every first turn at once, then every second turn one after another."""
    firsts = [first_turn(args.model, i, args.history_tokens) for i in range(args.conversations)]
    with ThreadPoolExecutor(max_workers=len(firsts)) as pool:
        answers = list(pool.map(lambda request: timed_generate(stub, request), firsts))
    seconds = [
        timed_generate(stub, second_turn(r, a.text)) for r, a in zip(firsts, answers, strict=True)
    ]
    return [Conversation(first, second) for first, second in zip(answers, seconds, strict=True)]


def routing_figures(done: Sequence[Conversation]) -> dict[str, float]:
    ttfts = [c.second.ttft_ms for c in done]
    there = [c.second.ttft_ms for c in done if c.first.replica == c.second.replica]
    elsewhere = [c.second.ttft_ms for c in done if c.first.replica != c.second.replica]
    return {
        "ttft_ms": median(ttfts),
        "mean_ms": statistics.fmean(ttfts),
        "cached": median([c.second.cached_prompt_tokens for c in done]),
        "prompt_tokens": median([c.second.prompt_tokens for c in done]),
        "same_replica": len(there),
        "there_ms": median(there),
        "elsewhere_ms": median(elsewhere),
        "replicas_used": len({c.first.replica for c in done}),
    }


# --- the run -------------------------------------------------------------------------


@contextmanager
def stubs(
    cluster: ClusterAddresses,
) -> Iterator[tuple[list[pb_grpc.InferenceStub], pb_grpc.InferenceStub]]:
    """A stub for each replica directly, and one through Envoy."""
    with ExitStack() as stack:
        channels = [stack.enter_context(grpc.insecure_channel(a)) for a in cluster.replicas]
        via = stack.enter_context(grpc.insecure_channel(cluster.listen))
        yield [pb_grpc.InferenceStub(c) for c in channels], pb_grpc.InferenceStub(via)


@dataclass(frozen=True)
class ClusterResults:
    """Both sections' figures from one cluster."""

    path: dict[str, list[Turn]]
    conversations: list[Conversation]


def on_cluster(args: argparse.Namespace, flags: list[str], *, picker: bool) -> ClusterResults:
    """Section 1, then section 2's conversations, on one fresh cluster."""
    cluster = running_cluster(args.replicas, flags, picker=picker)
    with cluster as addresses, stubs(addresses) as (direct, via):
        warm_up(direct, via, args.model)
        path = measure_path(direct[0], via, args)
        path["direct"] = [replace(t, replica=addresses.replicas[0]) for t in path["direct"]]
        return ClusterResults(path, conversations(via, args))


def server_flags(args: argparse.Namespace) -> list[str]:
    # Room to keep every conversation's cache on any one replica, so that a second
    # turn misses only for being sent elsewhere, never for an eviction.
    context = max(4096, 2 * (args.history_tokens + 256))
    return [
        "--default-model", args.model,
        "--threads", str(args.threads),
        "--context-size", str(context),
        "--cached-sequences", str(max(4, args.conversations + 1)),
    ]  # fmt: skip


def verdict(ok: bool, target: str) -> str:
    return f"{target}: {'met' if ok else 'MISSED'}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, the first column left-aligned and the others right."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def path_table(turns: dict[str, list[Turn]]) -> str:
    direct, via = path_figures(turns["direct"]), path_figures(turns["via"])
    header = ("p50 of each side's runs", "direct", "Envoy + picker", "via - direct", "target")
    return table(header, ttft_rows(direct, via, paired_ttft_ms(turns)) + decode_rows(direct, via))


def paired_ttft_ms(turns: dict[str, list[Turn]]) -> float:
    """The median over runs of via - direct within each run: the two requests of a run
    are seconds apart, so the machine's slower drifts cancel out of the difference."""
    pairs = zip(turns["direct"], turns["via"], strict=True)
    return median([via.ttft_ms - direct.ttft_ms for direct, via in pairs])


def ttft_rows(direct: dict[str, float], via: dict[str, float], paired: float) -> list[list[str]]:
    def row(name: str, key: str, *, target: bool = False) -> list[str]:
        added = via[key] - direct[key]
        goal = f"<= +{TARGET_TTFT_OVERHEAD_MS:.0f} ms"
        mark = verdict(added <= TARGET_TTFT_OVERHEAD_MS, goal) if target else ""
        return [name, f"{direct[key]:.1f}", f"{via[key]:.1f}", f"{added:+.1f} ms", mark]

    spread = [f"{f['ttft_min']:.0f} - {f['ttft_max']:.0f}" for f in (direct, via)]
    return [
        row("TTFT, client (ms)", "ttft_ms", target=True),
        ["TTFT, client, min - max (ms)", *spread, "", ""],
        ["TTFT, client, via - direct in each run (ms)", "", "", f"{paired:+.1f} ms", ""],
        row("TTFT, the replica's own (ms)", "server_ttft_ms"),
        row("client minus replica (ms)", "outside_ms", target=True),
    ]


def decode_rows(direct: dict[str, float], via: dict[str, float]) -> list[list[str]]:
    speed = ratio(via["decode_tps"], direct["decode_tps"])
    mark = verdict(speed >= TARGET_DECODE_RATIO, f">= {TARGET_DECODE_RATIO}")
    tps = [f"{f['decode_tps']:.1f}" for f in (direct, via)]
    tokens = [f"{f['tokens']:.0f}" for f in (direct, via)]
    prompts = [f"{f['prompt_tokens']:.0f} ({f['cached']:.0f})" for f in (direct, via)]
    return [
        ["decode tokens/s", *tps, f"{speed:.3f}x", mark],
        ["tokens generated", *tokens, "", ""],
        ["prompt tokens (cached)", *prompts, "", ""],
    ]


ROUTING_HEADER = (
    "routing",
    "2nd-turn TTFT p50 (ms)",
    "mean (ms)",
    "cached prompt tokens p50",
    "2nd turn on 1st's replica",
    "TTFT p50 there / elsewhere (ms)",
    "replicas of 1st turns",
)


def routing_table(picked: Sequence[Conversation], balanced: Sequence[Conversation]) -> str:
    picker, least = routing_figures(picked), routing_figures(balanced)
    slower = [f"{ratio(least[key], picker[key]):.2f}x" for key in ("ttft_ms", "mean_ms")]
    return table(
        ROUTING_HEADER,
        [
            routing_row("picker (cache-aware)", picker, len(picked)),
            routing_row("Envoy least-request", least, len(balanced)),
            ["least-request / picker", *slower, "", "", "", ""],
        ],
    )


def routing_row(name: str, figures: dict[str, float], count: int) -> list[str]:
    def ms(key: str) -> str:
        return "-" if math.isnan(figures[key]) else f"{figures[key]:.0f}"  # none of them

    return [
        name,
        f"{figures['ttft_ms']:.1f}",
        f"{figures['mean_ms']:.1f}",
        f"{figures['cached']:.0f} of {figures['prompt_tokens']:.0f}",
        f"{figures['same_replica']:.0f} of {count}",
        f"{ms('there_ms')} / {ms('elsewhere_ms')}",
        f"{figures['replicas_used']:.0f}",
    ]


def describe(args: argparse.Namespace, flags: list[str]) -> str:
    command = shlex.join(["python", "-m", "bench.cluster", *sys.argv[1:]])
    return (
        f"`{command}`: {args.replicas} replicas of {args.model}, {args.runs} runs, "
        f"{args.max_tokens} max tokens, {args.conversations} conversations of about "
        f"{args.history_tokens} history tokens; {available_cores()} cores available "
        f"({os.cpu_count()} on the machine); replica flags `{shlex.join(flags)}`"
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3, help="replicas in each cluster")
    parser.add_argument("--runs", type=int, default=7, help="runs of each side, section 1")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per run, section 1")
    parser.add_argument("--model", default="smollm2-135m-instruct", choices=sorted(EMBEDDED_MODELS))
    parser.add_argument("--conversations", type=int, default=6, help="section 2")
    parser.add_argument("--history-tokens", type=int, default=1200, help="first turn's length")
    parser.add_argument(
        "--threads",
        type=int,
        default=max(available_cores() - 1, 1),
        help="each replica's decode threads; by default one core is left to Envoy, the picker "
        "and this client, which a deployment runs elsewhere: a replica whose threads take "
        "every core stalls a whole decode step whenever Envoy forwards a token",
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    flags = server_flags(args)
    picked = on_cluster(args, flags, picker=True)
    balanced = on_cluster(args, flags, picker=False)
    print(describe(args, flags))
    print(f"\n1. The path: direct to one replica against Envoy + picker ({served(picked.path)})\n")
    print(path_table(picked.path))
    print("\n" + without_picker_line(picked.path, balanced.path))
    print("\n2. Second turns: the picker's cache-aware routing against least-request\n")
    print(routing_table(picked.conversations, balanced.conversations))


def without_picker_line(picked: dict[str, list[Turn]], plain: dict[str, list[Turn]]) -> str:
    """Section 1 on the --no-picker cluster too: how much of the path is the picker's."""
    with_picker, alone = added(picked, "outside_ms"), added(plain, "outside_ms")
    return (
        f"Client minus replica, via - direct: Envoy + picker {with_picker:+.1f} ms; "
        f"Envoy alone (the --no-picker cluster, measured the same way) {alone:+.1f} ms; "
        f"so the picker's ext_proc round trips add about {with_picker - alone:+.1f} ms."
    )


def added(path: dict[str, list[Turn]], key: str) -> float:
    """What going through Envoy adds to a figure's median (via - direct)."""
    return path_figures(path["via"])[key] - path_figures(path["direct"])[key]


def served(path: dict[str, list[Turn]]) -> str:
    """Which replicas answered each side, and how often."""
    counts = {side: collections.Counter(t.replica for t in turns) for side, turns in path.items()}
    return "; ".join(
        f"{side}: " + ", ".join(f"{replica} x{n}" for replica, n in sorted(count.items()))
        for side, count in counts.items()
    )


if __name__ == "__main__":
    main()
