"""The engine process: one model, served to the front over a socket.

`python -m service.engine --fd N --parent PID` is started by the front (see
`service.engine.process`) with one end of a socket pair as fd N. It reads a
`Load`, loads the model on its worker thread and answers `Loaded` or
`LoadFailed`; then its main thread reads requests and cancellations while
the worker thread decodes and writes batches of events, one frame per
scheduler step.

It never outlives the front: the kernel kills it when the front dies
(PR_SET_PDEATHSIG), and it exits at once when the socket closes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence

import structlog
from google.protobuf.message import Message

from inference.engine.v1 import engine_pb2 as epb
from inference.v1 import inference_pb2 as pb
from service.decode.sink import Cancellation
from service.embeddings.requests import Embedded
from service.engine import wire
from service.engine.core import EngineCore
from service.engine.framing import BlockingLink
from service.engine.loading import load_backend
from service.engine.options import EngineOptions
from service.engine.worker import ModelWorker
from service.images.requests import ImageStep, RenderedImage
from service.log import configure
from service.request_id import bound_request_id

log = structlog.get_logger("engine")

PR_SET_PDEATHSIG = 1
# How much likelier than the front an engine is to be the OOM killer's choice:
# an engine's death costs its model's requests in flight (the next request starts
# a fresh one); the front's costs every connection.
OOM_SCORE_ADJ_ABOVE_FRONT = 500
# How often an engine tells the front it lives (service.engine.liveness).
HEARTBEAT_SECONDS = 1.0


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when the front dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: EOF still ends us
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(0)


def prefer_to_be_killed(path: str = "/proc/self/oom_score_adj") -> None:
    """Rank this process above the front (whose setting it inherited) for the OOM
    killer, so memory running out (a model larger than thought, a chat template
    doubling a string) takes an engine, not the server. Raising one's own score
    needs no privilege; elsewhere than Linux there is nothing to do."""
    with contextlib.suppress(OSError, ValueError), open(path, "r+") as setting:
        inherited = int(setting.read())
        setting.seek(0)
        setting.write(str(min(1000, inherited + OOM_SCORE_ADJ_ABOVE_FRONT)))


class Outgoing:
    """Events waiting to go to the front; `flush` sends them as one frame."""

    def __init__(self, link: BlockingLink, load: Callable[[], tuple[int, int]]) -> None:
        self._link = link
        self._load = load
        self._events: list[epb.Event] = []
        self._lock = threading.Lock()
        self._load_sent = (0, 0)

    def add(self, event: epb.Event) -> None:
        with self._lock:
            self._events.append(event)

    def flush(self) -> None:
        """Send what was added, if anything, or the scheduler's load if it changed.

        Taking and sending under one lock keeps batches in order when the main
        thread flushes (a refused request) while the worker does.
        """
        with self._lock:
            events, self._events = self._events, []
            load = self._load()
            if not events and load == self._load_sent:
                return
            self._load_sent = load
            batch = epb.EventBatch(events=events, running=load[0], waiting=load[1])
            self.send(epb.FromEngine(events=batch))

    def send(self, message: Message) -> None:
        try:
            self._link.send(message)
        except OSError:  # the front is gone: nothing is listening, and we end with it
            os._exit(0)


class RemoteSink:
    """One request's results, as events for the front; `cancelled` is set when the
    front says the client went away. `request_id` is the RPC's, for log lines: the
    sink is closed on whichever thread ended the request, which has not bound it."""

    def __init__(
        self, socket_id: int, request_id: str, outgoing: Outgoing, forget: Callable[[int], None]
    ) -> None:
        self._id = socket_id
        self.request_id = request_id
        self._outgoing = outgoing
        self._forget = forget
        self._cancelled = Cancellation()

    @property
    def cancelled(self) -> Cancellation:
        return self._cancelled

    def send(
        self,
        item: pb.GenerateResponse
        | ImageStep
        | RenderedImage
        | Embedded
        | pb.TokenizeResponse
        | pb.DetokenizeResponse,
    ) -> None:
        event = epb.Event(id=self._id)
        if isinstance(item, pb.GenerateResponse):
            event.text.CopyFrom(item)
        elif isinstance(item, pb.TokenizeResponse):
            event.tokenized.CopyFrom(item)
        elif isinstance(item, pb.DetokenizeResponse):
            event.detokenized.CopyFrom(item)
        elif isinstance(item, Embedded):
            event.embedded.CopyFrom(item.to_pb(""))
        elif isinstance(item, ImageStep):
            event.image_progress.CopyFrom(item.to_pb().progress)
        else:
            event.image.CopyFrom(wire.rendered_image_pb(item))
        self._outgoing.add(event)

    def close(self, error: BaseException | None = None) -> None:
        self._forget(self._id)
        with bound_request_id(self.request_id):  # status_of logs a bug's traceback
            end = wire.status_of(error)
            _log_end(end)
        self._outgoing.add(epb.Event(id=self._id, end=end))


def _log_end(end: epb.Status) -> None:
    """The engine's last line about a request. A failure is at info, as the front's
    summary line of the RPC is: the client was told, and the operator can match the
    two by request id; the engine's line also says where it failed."""
    if end.code == wire.OK:
        log.debug("request ended")
    else:
        log.info("request ended with error", code=wire.code_name(end.code), error=end.message)


class EngineServer:
    def __init__(self, link: BlockingLink, options: EngineOptions) -> None:
        self._link = link
        self._options = options
        self._worker = ModelWorker(options.name)
        self._outgoing = Outgoing(link, self._load)
        self._sinks: dict[int, RemoteSink] = {}
        self._core: EngineCore | None = None

    def run(self) -> None:
        """Load, then serve until the front closes the socket or says to shut down."""
        if not self._load_model():
            return
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()
        for message in self._link.messages(epb.ToEngine):
            if not self._dispatch(message):
                return

    def _beat(self) -> None:
        """Tell the front, every HEARTBEAT_SECONDS, that this process lives and how far
        the worker has got: a frozen process sends nothing, a stuck worker no progress."""
        while True:  # a daemon thread: it ends with the process
            beat = epb.Heartbeat(progress=self._worker.progress)
            self._outgoing.send(epb.FromEngine(heartbeat=beat))
            time.sleep(HEARTBEAT_SECONDS)

    def _load_model(self) -> bool:
        try:
            backend = self._worker.run(lambda: load_backend(self._options))
        except Exception as exc:  # the front answers the waiting requests with it
            self._outgoing.send(epb.FromEngine(load_failed=wire.status_of(exc)))
            return False
        self._core = EngineCore(
            self._options,
            backend,
            self._worker,
            on_failure=self._model_failed,
            publish=self._outgoing.flush,
        )
        info = self._core.info
        loaded = epb.Loaded(
            backend=info.backend,
            context_length=info.context_length,
            computes_off_cpu=info.computes_off_cpu,
        )
        self._outgoing.send(epb.FromEngine(loaded=loaded))
        return True

    def _dispatch(self, message: epb.ToEngine) -> bool:
        """Act on one message from the front; False once it said to shut down."""
        kind = message.WhichOneof("message")
        if kind == "generate":
            self._generate(message.generate)
        elif kind == "generate_image":
            self._generate_image(message.generate_image)
        elif kind == "embed":
            self._embed(message.embed)
        elif kind == "tokenize":
            self._tokenize(message.tokenize)
        elif kind == "detokenize":
            self._detokenize(message.detokenize)
        elif kind == "cancel":
            self._cancel(message.cancel.id)
        elif kind == "shutdown":
            self._shut_down(message.shutdown.reason)
            return False
        return True

    def _generate(self, generate: epb.Generate) -> None:
        sink = self._sink(generate.id, generate.request_id)
        # Bound here, the id also reaches the preparation and worker threads: the core
        # runs this request's work there in a copy of this context.
        with bound_request_id(generate.request_id):
            log.debug("request received", kind="text")
            self._start_text(generate, sink)

    def _start_text(self, generate: epb.Generate, sink: RemoteSink) -> None:
        try:
            request = wire.generation_request(generate)
        except Exception as exc:  # the front checked it; a mismatch is ours to report
            sink.close(exc)
            self._outgoing.flush()
            return
        self._served().submit_text(request, generate.received_at, sink)

    def _generate_image(self, image: epb.GenerateImage) -> None:
        sink = self._sink(image.id, image.request_id)
        with bound_request_id(image.request_id):  # as in _generate
            log.debug("request received", kind="image")
            self._served().submit_image(wire.image_request(image), image.received_at, sink)

    def _embed(self, embed: epb.Embed) -> None:
        sink = self._sink(embed.id, embed.request_id)
        with bound_request_id(embed.request_id):  # as in _generate
            log.debug("request received", kind="embed", inputs=len(embed.inputs))
            try:
                request = wire.embed_request(embed, self._options.name)
            except Exception as exc:  # the front checked it; a mismatch is ours to report
                sink.close(exc)
                self._outgoing.flush()
                return
            self._served().submit_embed(request, sink)

    def _tokenize(self, tokenize: epb.Tokenize) -> None:
        sink = self._sink(tokenize.id, tokenize.request_id)
        with bound_request_id(tokenize.request_id):  # as in _generate
            log.debug("request received", kind="tokenize")
            request = wire.tokenize_request(tokenize, self._options.name)
            self._served().submit_tokenize(request, sink)

    def _detokenize(self, detokenize: epb.Detokenize) -> None:
        sink = self._sink(detokenize.id, detokenize.request_id)
        with bound_request_id(detokenize.request_id):
            log.debug("request received", kind="detokenize")
            self._served().submit_detokenize(tuple(detokenize.token_ids), sink)

    def _cancel(self, socket_id: int) -> None:
        sink = self._sinks.get(socket_id)
        if sink is not None:  # else it ended already; the front had not heard yet
            with bound_request_id(sink.request_id):
                log.debug("request cancelled")
            sink.cancelled.set()
            self._served().cancel_queued_image(sink)  # else it waits for the image ahead

    def _sink(self, socket_id: int, request_id: str) -> RemoteSink:
        sink = RemoteSink(socket_id, request_id, self._outgoing, self._forget)
        self._sinks[socket_id] = sink
        return sink

    def _forget(self, socket_id: int) -> None:
        self._sinks.pop(socket_id, None)

    def _served(self) -> EngineCore:
        assert self._core is not None  # requests come only after Loaded
        return self._core

    def _shut_down(self, reason: str) -> None:
        core = self._served()
        try:
            self._worker.run(lambda: core.close(reason))
        finally:
            self._outgoing.flush()
            self._worker.shutdown()

    def _model_failed(self, why: str) -> None:
        """The library failed inside the model: the front drops it from the pool."""
        self._outgoing.send(epb.FromEngine(model_failed=why))

    def _load(self) -> tuple[int, int]:
        core = self._core
        return (0, 0) if core is None else (core.running, core.waiting)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m service.engine")
    parser.add_argument("--fd", type=int, required=True, help="this end of the socket pair")
    parser.add_argument("--parent", type=int, required=True, help="the front's pid")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    prefer_to_be_killed()
    # Ctrl-C reaches the front's whole process group, and a service manager's stop
    # may signal its whole cgroup: the front drains, then tells us when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link = BlockingLink(socket.socket(fileno=args.fd))
    load = link.receive(epb.ToEngine)
    if load is None or load.WhichOneof("message") != "load":
        return
    options = EngineOptions.from_pb(load.load)
    configure(as_json=True, level=options.log_level)
    EngineServer(link, options).run()
    # Daemon threads (the worker, llama.cpp's) must not keep a dying engine alive.
    os._exit(0)
