"""`inference-client`: talk to an inference server from a terminal or a script.

inference-client generate [--chat] [--model M] [--max-tokens N] PROMPT
inference-client generate --json PROMPT    # one JSON object per stream event
inference-client image PROMPT --out FILE.png [--model M] [--width W] [--height H]
inference-client admit MODEL [--image]      # can the server serve it, and how
inference-client pull owner/name[:Q4_K_M]   # download it into the server's cache
inference-client pull --dry-run owner/name  # what a pull would fetch, and the quantizations
inference-client cache list [--json]        # the hub models in the server's cache
inference-client cache delete owner/name[@rev][:FILE]
inference-client models
inference-client health

Connection options come before the command: --target HOST:PORT, --tls-ca FILE (TLS;
with --tls-cert/--tls-key for mTLS), --token TOKEN (or INFERENCE_TOKEN), --request-id ID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NoReturn

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tqdm import tqdm

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

DEFAULT_TARGET = "127.0.0.1:50051"


class UsageError(Exception):
    """A mistake in how the client was called: printed as one line, exit status 2."""


def _channel(args: argparse.Namespace) -> grpc.Channel:
    """Plaintext, or TLS when a CA is given (mutual when a client certificate is too)."""
    if args.tls_ca is None:
        return grpc.insecure_channel(args.target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_pem(args.tls_ca, "--tls-ca"),
        private_key=_pem(args.tls_key, "--tls-key") if args.tls_key else None,
        certificate_chain=_pem(args.tls_cert, "--tls-cert") if args.tls_cert else None,
    )
    return grpc.secure_channel(args.target, credentials)


def _pem(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from exc


def _metadata(args: argparse.Namespace) -> list[tuple[str, str]]:
    metadata = []
    if args.token:
        metadata.append(("authorization", f"Bearer {args.token}"))
    if args.request_id:
        metadata.append(("x-request-id", args.request_id))
    return metadata


# Flags copied to the request's field of the same name when given.
_SAMPLING_FLAGS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


def _generate_request(args: argparse.Namespace) -> pb.GenerateRequest:
    # A person watching is told why nothing comes yet; --json keeps the plain stream.
    request = pb.GenerateRequest(model=args.model, stop=args.stop, report_loading=not args.json)
    if args.grammar is not None:
        request.grammar = args.grammar
    if args.json_schema is not None:
        request.response_format.json_schema = args.json_schema
    if args.top_logprobs is not None:
        request.logprobs, request.top_logprobs = True, args.top_logprobs
    for tool in args.tool:
        name, _, schema = tool.partition("=")
        request.tools.append(pb.Tool(name=name, parameters_json=schema))
    if args.tool_choice is not None:
        request.tool_choice.SetInParent()  # set and empty: any of the tools
        if args.tool_choice != "required":
            request.tool_choice.name = args.tool_choice
    if args.chat:
        request.messages.append(pb.ChatMessage(role="user", content=args.prompt))
    else:
        request.prompt = args.prompt
    for name in _SAMPLING_FLAGS:
        value = getattr(args, name)
        if value is not None:
            setattr(request, name, value)
    return request


def _summary_line(finished: pb.GenerationFinished) -> str:
    reason = pb.FinishReason.Name(finished.finish_reason).removeprefix("FINISH_REASON_").lower()
    usage, timing = finished.usage, finished.timing
    return (
        f"[ttft {timing.ttft_ms:.0f} ms | {usage.prompt_tokens} prompt + "
        f"{usage.completion_tokens} completion tokens | "
        f"{timing.decode_tokens_per_second:.1f} tokens/s | finish: {reason}]"
    )


def _print_stream(stream: Iterable[pb.GenerateResponse], as_json: bool) -> None:
    printer = _StreamPrinter(as_json)
    try:
        for response in stream:
            printer.show(response)
    finally:
        printer.end()


class _StreamPrinter:
    """Text on stdout as it comes, the rest on stderr; an error that cuts the text
    short is printed on a line of its own."""

    def __init__(self, as_json: bool) -> None:
        self._as_json = as_json
        self._bar: tqdm[NoReturn] | None = None  # a pull first (--pull-on-demand)
        self._mid_line = False

    def show(self, response: pb.GenerateResponse) -> None:
        if self._as_json:
            print(json_format.MessageToJson(response, indent=None), flush=True)
            return
        event = response.WhichOneof("event")
        if event == "pull_progress":
            self._pulled(response.pull_progress)
            return
        self._close_bar()
        if event == "loading":
            print(f"loading {response.loading.model}...", file=sys.stderr, flush=True)
        elif event == "delta":
            text = response.delta.text
            print(text, end="", flush=True)
            self._mid_line = (self._mid_line and not text) or (bool(text) and text[-1] != "\n")
        elif event == "finished":
            self._mid_line = False
            print(file=sys.stderr)
            for call in response.finished.tool_calls:
                print(f"[tool call: {call.name} {call.arguments_json}]", file=sys.stderr)
            print(_summary_line(response.finished), file=sys.stderr)

    def end(self) -> None:
        self._close_bar()
        if self._mid_line:
            print(flush=True)

    def _pulled(self, progress: pb.PullProgress) -> None:
        if self._bar is None:
            self._bar = _bytes_bar("pulling", progress.bytes_total, progress.bytes_done)
        self._bar.update(progress.bytes_done - self._bar.n)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def generate(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        stub = pb_grpc.InferenceStub(channel)
        _print_stream(
            stub.Generate(_generate_request(args), timeout=args.timeout, metadata=_metadata(args)),
            args.json,
        )
    return 0


def _image_request(args: argparse.Namespace) -> pb.GenerateImageRequest:
    request = pb.GenerateImageRequest(
        model=args.model, prompt=args.prompt, negative_prompt=args.negative_prompt
    )
    for name in ("width", "height", "steps", "guidance", "seed"):
        value = getattr(args, name)
        if value is not None:
            setattr(request, name, value)
    return request


def _progress_bar(progress: pb.ImageProgress, width: int = 30) -> str:
    done = width * progress.step // max(progress.total_steps, 1)
    bar = "#" * done + "." * (width - done)
    seconds = progress.elapsed_ms / 1000
    return f"\r[{bar}] step {progress.step}/{progress.total_steps}  {seconds:.1f} s"


def image(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        stream = pb_grpc.InferenceStub(channel).GenerateImage(
            _image_request(args), timeout=args.timeout, metadata=_metadata(args)
        )
        for response in stream:
            if response.WhichOneof("event") == "progress":
                print(_progress_bar(response.progress), end="", file=sys.stderr, flush=True)
                continue
            result = response.image
            args.out.write_bytes(result.data)
            seconds = result.total_ms / 1000
            print(
                f"\n{args.out}: {result.width}x{result.height} {result.media_type}, seed "
                f"{result.seed}, {result.model} on {result.backend}, {seconds:.1f} s",
                file=sys.stderr,
            )
    return 0


def admit(args: argparse.Namespace) -> int:
    capability = pb.CAPABILITY_IMAGE if args.image else pb.CAPABILITY_TEXT
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).Admit(
            pb.AdmitRequest(model=args.model, capability=capability),
            timeout=args.timeout,
            metadata=_metadata(args),
        )
    print(json_format.MessageToJson(reply))
    return 0 if reply.admitted else 1


def pull(args: argparse.Namespace) -> int:
    """Download a hub model into the server's cache, with a progress bar on stderr."""
    capability = pb.CAPABILITY_IMAGE if args.image else pb.CAPABILITY_TEXT
    if args.dry_run:
        return _dry_run(args, capability)
    finished: pb.PullFinished | None = None
    bar: tqdm[NoReturn] | None = None
    with _channel(args) as channel:
        stream = pb_grpc.InferenceStub(channel).Pull(
            pb.PullRequest(model=args.model, capability=capability),
            timeout=args.timeout,
            metadata=_metadata(args),
        )
        try:
            for event in stream:
                kind = event.WhichOneof("event")
                if kind == "started":
                    bar = _pull_bar(args.model, event.started)
                elif kind == "progress" and bar is not None:
                    bar.update(event.progress.bytes_done - bar.n)
                    bar.set_postfix_str(event.progress.file, refresh=False)
                elif kind == "finished":
                    finished = event.finished
        finally:
            if bar is not None:
                bar.close()
    if finished is None:
        return 1
    print(json_format.MessageToJson(finished))
    return 0 if finished.admit.admitted else 1


def _pull_bar(model: str, started: pb.PullStarted) -> tqdm[NoReturn]:
    download = started.download
    count = len(download.files)
    print(
        f"pulling {download.repo} at {download.commit[:12]}: "
        f"{count} file{'s' if count != 1 else ''}",
        file=sys.stderr,
    )
    return _bytes_bar(model, download.total_bytes, started.cached_bytes)


def _bytes_bar(what: str, total: int, initial: int) -> tqdm[NoReturn]:
    return tqdm(
        total=total,
        initial=initial,
        desc=what,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        mininterval=0.2,
    )


def _dry_run(args: argparse.Namespace, capability: pb.Capability) -> int:
    """What a pull would fetch, from Admit (which reads the hub's metadata only)."""
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).Admit(
            pb.AdmitRequest(model=args.model, capability=capability),
            timeout=args.timeout,
            metadata=_metadata(args),
        )
    download = reply.download
    if reply.available_locally:
        print(f"{args.model} is in the server's cache: a pull checks it and fetches nothing")
    elif reply.HasField("download"):
        print(f"{download.repo} at {download.commit[:12]}:")
        for file in download.files:
            print(f"  {_size(file.size_bytes):>10}  {file.path}")
        room = "fits" if download.fits_on_disk else "does NOT fit"
        print(
            f"  {_size(download.total_bytes):>10}  in all; {room} in the cache's "
            f"{_size(download.disk_free_bytes)} free"
        )
        chosen = {file.path for file in download.files}
        if download.choices:
            print("quantizations in the repo (pull one as owner/name:FILE or :TAG):")
        for choice in download.choices:
            mark = "*" if choice.path in chosen else " "
            print(f"  {mark} {_size(choice.size_bytes):>10}  {choice.path}")
    print(("admitted: " if reply.admitted else "refused: ") + reply.reason)
    return 0 if reply.admitted else 1


def cache_list(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).ListCached(
            pb.ListCachedRequest(), timeout=args.timeout, metadata=_metadata(args)
        )
    if args.json:
        print(json_format.MessageToJson(reply))
        return 0
    print(f"{reply.cache_dir} ({_size(reply.disk_free_bytes)} free)")
    for repo in reply.repos:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(repo.last_used_unix_ms / 1000))
        partial = f", {_size(repo.incomplete_bytes)} of interrupted pulls" * bool(
            repo.incomplete_bytes
        )
        print(f"{repo.repo}  {_size(repo.size_bytes)}{partial}, last used {used}")
        for revision in repo.revisions:
            refs = f" ({', '.join(revision.refs)})" if revision.refs else ""
            print(f"  {revision.commit[:12]}{refs}  {_size(revision.size_bytes)}")
            for file in revision.files:
                print(f"    {_size(file.size_bytes):>10}  {file.path}")
    return 0


def cache_delete(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).DeleteCached(
            pb.DeleteCachedRequest(model=args.model), timeout=args.timeout, metadata=_metadata(args)
        )
    commits = ", ".join(commit[:12] for commit in reply.commits) or "no snapshot"
    print(f"deleted {args.model} ({commits}): {_size(reply.freed_bytes)} freed")
    return 0


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def embed(args: argparse.Namespace) -> int:
    """One JSON line per input: its vector, and how many tokens the model read."""
    request = pb.EmbedRequest(
        model=args.model,
        inputs=[pb.EmbedInput(text=text) for text in args.text],
        truncate=args.truncate,
    )
    if args.raw:
        request.normalize = False
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).Embed(
            request, timeout=args.timeout, metadata=_metadata(args)
        )
    for text, item in zip(args.text, reply.embeddings, strict=True):
        line = {
            "text": text,
            "tokens": item.tokens,
            "embedding": [round(v, 6) for v in item.values],
        }
        if item.truncated:
            line["truncated"] = True
        print(json.dumps(line))
    print(
        f"{reply.model}: {len(reply.embeddings)} vectors of {reply.dimensions} ({reply.pooling} "
        f"pooling{', unit length' if reply.normalized else ''}), {reply.prompt_tokens} tokens, "
        f"{reply.total_ms:.0f} ms",
        file=sys.stderr,
    )
    return 0


def models(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        reply = pb_grpc.InferenceStub(channel).ListModels(
            pb.ListModelsRequest(), timeout=args.timeout, metadata=_metadata(args)
        )
    print(json_format.MessageToJson(reply))
    return 0


def health_check(args: argparse.Namespace) -> int:
    with _channel(args) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=args.service),
            timeout=args.timeout,
            metadata=_metadata(args),
        )
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inference-client", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, help="server HOST:PORT")
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument("--tls-ca", type=Path, help="connect with TLS, trusting this CA (PEM)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate for mTLS (PEM)")
    parser.add_argument("--tls-key", type=Path, help="client key for mTLS (PEM)")
    parser.add_argument(
        "--token",
        default=os.environ.get("INFERENCE_TOKEN"),
        help="bearer token the server asks for (default: $INFERENCE_TOKEN)",
    )
    parser.add_argument("--request-id", help="x-request-id to send (the server makes one)")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="stream a completion")
    gen.add_argument("prompt", help="the prompt (or the user message with --chat)")
    gen.add_argument("--model", default="", help="model name (default: the server's)")
    gen.add_argument("--chat", action="store_true", help="send as a chat message")
    gen.add_argument("--max-tokens", type=int)
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--min-p", type=float)
    gen.add_argument("--repeat-penalty", type=float, help="1 is off")
    gen.add_argument("--presence-penalty", type=float, help="in [-2, 2]; 0 is off")
    gen.add_argument("--frequency-penalty", type=float, help="in [-2, 2]; 0 is off")
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", default=[], help="stop sequence; repeatable")
    gen.add_argument("--json", action="store_true", help="print each event as one JSON line")
    gen.add_argument("--grammar", help="GBNF grammar the output must follow (start rule: root)")
    gen.add_argument("--json-schema", help="JSON Schema (as text) the output must satisfy")
    gen.add_argument(
        "--top-logprobs", type=int, help="report logprobs with N alternatives (see --json)"
    )
    gen.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="NAME[=SCHEMA]",
        help="a function the model may call, with its arguments' JSON Schema; repeatable",
    )
    gen.add_argument(
        "--tool-choice",
        metavar="NAME|required",
        help="make the model call that tool, or any of them (required)",
    )
    gen.set_defaults(run=generate)

    img = commands.add_parser("image", help="generate an image and save the PNG")
    img.add_argument("prompt")
    img.add_argument("--out", type=Path, required=True, help="where to write the PNG")
    img.add_argument("--model", default="", help="image model (default: the server's)")
    img.add_argument("--negative-prompt", default="")
    img.add_argument("--width", type=int)
    img.add_argument("--height", type=int)
    img.add_argument("--steps", type=int)
    img.add_argument("--guidance", type=float)
    img.add_argument("--seed", type=int)
    img.set_defaults(run=image)

    check_model = commands.add_parser(
        "admit", help="ask whether a model can be served; exit 0 if so"
    )
    check_model.add_argument("model", help="a model name, a path under a models dir, or a hub repo")
    check_model.add_argument("--image", action="store_true", help="ask about image generation")
    check_model.set_defaults(run=admit)

    fetch = commands.add_parser(
        "pull", help="download a hub model into the server's cache (it needs --allow-pull)"
    )
    fetch.add_argument("model", help="owner/name, owner/name@rev, owner/name:FILE or :Q4_K_M")
    fetch.add_argument("--image", action="store_true", help="an image pipeline")
    fetch.add_argument(
        "--dry-run", action="store_true", help="show what would be fetched; fetch nothing"
    )
    fetch.set_defaults(run=pull)

    cache = commands.add_parser("cache", help="the hub models in the server's cache")
    cache_commands = cache.add_subparsers(dest="cache_command", required=True)
    listing = cache_commands.add_parser("list", aliases=["ls"], help="list them")
    listing.add_argument("--json", action="store_true", help="print the reply as JSON")
    listing.set_defaults(run=cache_list)
    delete = cache_commands.add_parser(
        "delete",
        aliases=["rm"],
        help="delete a repo, one revision, or one file of one (it needs --allow-pull)",
    )
    delete.add_argument(
        "model",
        help="owner/name (the repo), owner/name@REVISION (one revision), or "
        "owner/name[@REVISION]:FILE (one file, or the GGUF a tag such as Q4_K_M picks, "
        "of that revision, main by default)",
    )
    delete.set_defaults(run=cache_delete)

    vectors = commands.add_parser("embed", help="embed texts: one JSON line per text")
    vectors.add_argument("text", nargs="+", help="a text to embed; several are sent together")
    vectors.add_argument("--model", default="", help="embedding model (default: the server's)")
    vectors.add_argument(
        "--truncate", action="store_true", help="cut a text longer than the model's window"
    )
    vectors.add_argument(
        "--raw", action="store_true", help="as the model gives them, not unit length"
    )
    vectors.set_defaults(run=embed)

    commands.add_parser("models", help="list the server's models").set_defaults(run=models)

    check = commands.add_parser("health", help="ask grpc.health.v1; exit 0 when SERVING")
    check.add_argument("--service", default="", help="service name ('' = the whole server)")
    check.set_defaults(run=health_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
