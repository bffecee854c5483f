"""The front's side of an engine process: start it, talk to it, notice its death.

`EngineProcess.start` runs `python -m service.engine` with one end of a socket
pair, sends `Load` and waits for the answer. After that a reader task takes
each batch of events off the socket and hands every event to the request it
belongs to; a request that stops early sends `Cancel`.

When the socket closes without the front having asked (a signal, an abort, an
OOM kill), every request in flight ends at once with UNAVAILABLE naming the
model and the cause, the last lines the engine wrote go to the log, and
`on_exit` tells the pool, which drops the model.

An image the front cancelled must end within `Liveness.cancel_seconds` of the
cancel; else the engine is killed and `on_failure` has the pool discard the
model (see service.engine.liveness): work nobody waits for must not hold the
CPU and memory for minutes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import IO

import structlog
from google.protobuf.message import DecodeError, Message

from inference.engine.v1 import engine_pb2 as epb
from inference.v1 import inference_pb2 as pb
from service.embeddings.requests import Embedded, EmbedRequest
from service.engine import wire
from service.engine.base import EngineCrashed, EngineHooks, EngineInfo, MeasuredMemory
from service.engine.exit_cause import OutputTail, describe_exit, oom_kill_count
from service.engine.framing import FrameError, encode, read_message
from service.engine.liveness import Liveness, Pulse, overdue
from service.engine.measure import GpuMemory, rss_bytes
from service.engine.options import EngineOptions
from service.errors import ServiceError, TimedOut, Unavailable
from service.images.requests import ImageRequest, ImageStep, RenderedImage
from service.request_id import current_request_id
from service.text.requests import GenerationRequest

log = structlog.get_logger("engine")

# How long a stopping engine may take to free its model before it is killed.
SHUTDOWN_SECONDS = 30.0
# How long after its socket closed a dying engine may take to be reaped.
EXIT_SECONDS = 5.0
# How often the front judges whether an engine with work is alive.
WATCH_SECONDS = 1.0

_Item = epb.Event | ServiceError
# Shared: one nvidia-smi reading answers for every engine's pid.
_GPU_MEMORY = GpuMemory()


class EngineProcess:
    def __init__(
        self,
        options: EngineOptions,
        process: subprocess.Popen[bytes],
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        output: OutputTail,
        oom_kills: int | None,
        hooks: EngineHooks,
        liveness: Liveness,
    ) -> None:
        self._options = options
        self._process = process
        self._reader, self._writer = connection
        self._output = output
        self._oom_kills = oom_kills
        self._info = EngineInfo("", 0)
        self._ids = itertools.count(1)
        self._requests: dict[int, asyncio.Queue[_Item]] = {}
        # Images cancelled and not yet ended: when their cancel was sent, and their
        # request ids (the log line that stops the engine names the request).
        self._cancelled_at: dict[int, tuple[float, str]] = {}
        self._running = self._waiting = 0
        self._closing: str | None = None
        self._dead: EngineCrashed | Unavailable | None = None
        self._reading: asyncio.Task[None] | None = None
        self._hooks = hooks
        self._liveness = liveness
        self._pulse = Pulse(time.monotonic())
        self._hung: str | None = None  # why the front killed it
        self._watching: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, options: EngineOptions, hooks: EngineHooks, liveness: Liveness | None = None
    ) -> EngineProcess:
        """A running engine with the model loaded; the load's error if it failed, or
        EngineCrashed if the process died loading it. `liveness`: when it counts as hung."""
        front_end, engine_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        oom_kills = oom_kill_count()
        try:
            process = _spawn(engine_end.fileno())
        except BaseException:
            front_end.close()
            raise
        finally:
            engine_end.close()
        output = OutputTail()
        _relay_output(process, options.name, output)
        connection = await asyncio.open_unix_connection(sock=front_end)
        engine = cls(options, process, connection, output, oom_kills, hooks, liveness or Liveness())
        try:
            await engine._load()
        except BaseException:
            engine._writer.close()
            if process.poll() is None:  # cancelled mid-load: it must not outlive its load
                process.kill()
                await asyncio.to_thread(process.wait)
            raise
        return engine

    async def _load(self) -> None:
        self._send(epb.ToEngine(load=self._options.to_pb()))
        answer = await self._next_message()
        kind = None if answer is None else answer.WhichOneof("message")
        if answer is not None and kind == "loaded":
            loaded = answer.loaded
            self._info = EngineInfo(loaded.backend, loaded.context_length, loaded.computes_off_cpu)
            self._pulse = Pulse(time.monotonic())
            self._reading = asyncio.create_task(self._read_events())
            self._watching = asyncio.create_task(self._watch())
            return
        if answer is not None and kind == "load_failed":
            await self._reap()
            raise wire.error_of(answer.load_failed)
        cause = describe_exit(await self._reap(), self._oom_kills, oom_kill_count())
        self._log_death(cause, "while loading")
        raise EngineCrashed(
            f"model {self.name!r} could not be loaded: its engine process (pid {self.pid}) "
            f"ended while loading it: {cause}; retry, or check the model file",
            cause,
        )

    # --- what the pool and the RPCs see ---------------------------------------------------

    @property
    def name(self) -> str:
        return self._options.name

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return self._waiting

    async def generate(
        self, request: GenerationRequest, received_at: float
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        socket_id = next(self._ids)
        message = wire.generate_message(
            socket_id, request, received_at, request_id=current_request_id()
        )
        async with aclosing(self._exchange(socket_id, message, self._ceiling())) as events:
            async for event in events:
                yield event.text

    async def tokenize(self, request: GenerationRequest) -> pb.TokenizeResponse:
        socket_id = next(self._ids)
        message = wire.tokenize_message(socket_id, request, request_id=current_request_id())
        return (await self._answer(socket_id, message)).tokenized

    async def detokenize(self, token_ids: Sequence[int]) -> pb.DetokenizeResponse:
        socket_id = next(self._ids)
        message = wire.detokenize_message(socket_id, token_ids, request_id=current_request_id())
        return (await self._answer(socket_id, message)).detokenized

    async def _answer(self, socket_id: int, message: epb.ToEngine) -> epb.Event:
        """The one event a request is answered by."""
        async for event in self._exchange(socket_id, message):
            answer = event
        return answer

    def _ceiling(self) -> float | None:
        """How long after its start the front lets a generation run: the engine's own
        decode ceiling, plus the time a hung engine takes to be noticed."""
        limit = self._options.max_decode_seconds
        return None if limit is None else limit + self._liveness.hang_seconds

    async def generate_image(
        self, request: ImageRequest, received_at: float
    ) -> AsyncGenerator[ImageStep | RenderedImage, None]:
        socket_id = next(self._ids)
        message = wire.image_message(
            socket_id, request, received_at, request_id=current_request_id()
        )
        async with aclosing(self._exchange(socket_id, message, watch_cancel=True)) as events:
            async for event in events:
                if event.WhichOneof("event") == "image":
                    yield wire.rendered_image(event.image)
                else:
                    progress = event.image_progress
                    yield ImageStep(progress.step, progress.total_steps, progress.elapsed_ms)

    async def embed(self, request: EmbedRequest) -> Embedded:
        socket_id = next(self._ids)
        message = wire.embed_message(
            socket_id, request, time.monotonic(), request_id=current_request_id()
        )
        embedded: Embedded | None = None
        async for event in self._exchange(socket_id, message):
            if event.WhichOneof("event") == "embedded":
                embedded = Embedded.from_pb(event.embedded)
        if embedded is None:
            raise Unavailable(f"model {self.name!r} ended the request without its vectors")
        return embedded

    def memory(self) -> MeasuredMemory | None:
        gpu = _GPU_MEMORY.of(self._process.pid) if self._info.computes_off_cpu else 0
        return MeasuredMemory(rss_bytes(self._process.pid), gpu)

    async def close(self, reason: str) -> None:
        """Have the engine end its requests with UNAVAILABLE and `reason` and exit; kill
        it if it takes longer than SHUTDOWN_SECONDS."""
        if self._dead is None and self._closing is None:
            self._closing = reason
            self._send(epb.ToEngine(shutdown=epb.Shutdown(reason=reason)))
        reading = self._reading
        if reading is not None:
            try:
                await asyncio.wait_for(asyncio.shield(reading), SHUTDOWN_SECONDS)
            except TimeoutError:
                log.warning("engine did not stop; killing it", model=self.name, pid=self.pid)
                self._process.kill()
                await reading
        self._writer.close()

    # --- the socket -------------------------------------------------------------------------

    async def _exchange(
        self,
        socket_id: int,
        message: epb.ToEngine,
        ceiling: float | None = None,
        *,
        watch_cancel: bool = False,
    ) -> AsyncGenerator[epb.Event, None]:
        """Send one request; yield its events until its end, raising its error. With a
        `ceiling`, the request may last that long after its first event, no longer. With
        `watch_cancel`, a cancel it sends must be answered by the request's end within
        `Liveness.cancel_seconds` (see `_watch`)."""
        if self._dead is not None:
            raise self._dead
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._requests[socket_id] = queue
        self._send(message)
        deadline: float | None = None
        try:
            while True:
                item = await self._next_item(queue, deadline)
                if deadline is None and ceiling is not None:
                    deadline = time.monotonic() + ceiling
                if isinstance(item, ServiceError):
                    raise item
                if item.WhichOneof("event") == "end":
                    if item.end.code != wire.OK:
                        raise wire.error_of(item.end)
                    return
                yield item
        finally:
            # Still registered: it stopped before its end (the client went away).
            if self._requests.pop(socket_id, None) is not None and self._dead is None:
                self._send(epb.ToEngine(cancel=epb.Cancel(id=socket_id)))
                if watch_cancel:
                    self._cancelled_at[socket_id] = (time.monotonic(), current_request_id())

    async def _next_item(self, queue: asyncio.Queue[_Item], deadline: float | None) -> _Item:
        if deadline is None:
            return await queue.get()
        try:
            # Not asyncio.wait_for: on Python 3.11 it loses a cancel that comes as the
            # item does, and the request then decodes to max_tokens with nobody waiting.
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await queue.get()
        except TimeoutError:
            raise TimedOut(
                f"model {self.name!r} did not end the generation within its ceiling of "
                f"{self._options.max_decode_seconds:g} s (--max-decode-seconds); it was "
                "cancelled"
            ) from None

    def _send(self, message: Message) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode(message))

    async def _next_message(self) -> epb.FromEngine | None:
        try:
            return await read_message(self._reader, epb.FromEngine)
        except (FrameError, DecodeError, OSError) as exc:
            log.error("unreadable message from engine", model=self.name, error=str(exc))
            self._process.kill()
            return None

    async def _read_events(self) -> None:
        while (message := await self._next_message()) is not None:
            kind = message.WhichOneof("message")
            progress = message.heartbeat.progress if kind == "heartbeat" else None
            self._pulse.heard(time.monotonic(), progress)
            if kind == "events":
                self._deliver(message.events)
            elif kind == "model_failed":
                self._hooks.on_failure(message.model_failed)
        await self._ended()

    async def _watch(self) -> None:
        """Kill the engine if it has work and is frozen or stuck, or goes on with an image
        cancelled too long ago (service.engine.liveness)."""
        while self._dead is None and self._closing is None:
            await asyncio.sleep(WATCH_SECONDS)
            if self._dead is not None or self._closing is not None:
                return
            now = time.monotonic()
            late = overdue([at for at, _ in self._cancelled_at.values()], now, self._liveness)
            if late is not None:
                self._stop_abandoned(late)
                return
            verdict = self._pulse.verdict(now, bool(self._requests), self._liveness)
            if verdict is not None:
                self._hung = verdict
                log.error("engine hung; killing it", model=self.name, pid=self.pid, why=verdict)
                self._process.kill()  # SIGKILL ends a stopped process too
                return

    def _stop_abandoned(self, late: float) -> None:
        """Kill an engine still computing an image `late` seconds after its cancel: a
        layer that cannot be interrupted (service.engine.liveness). It is closing, not
        crashed: its other requests end with UNAVAILABLE and "retry", and the pool
        discards the model without counting a crash."""
        limit = self._liveness.cancel_seconds
        why = (
            f"model {self.name!r} was restarted: it was still computing an image {late:.0f} s "
            f"after its request was cancelled (the limit is {limit:g} s, "
            "--image-cancel-seconds)"
        )
        _, request_id = min(self._cancelled_at.values())
        log.warning(
            "engine stopped: an image went on after its cancel",
            model=self.name,
            pid=self.pid,
            seconds=round(late, 1),
            request_id=request_id,  # the watch runs in the context of the load's request
        )
        self._closing = why
        self._process.kill()
        self._hooks.on_failure(why)

    def _deliver(self, batch: epb.EventBatch) -> None:
        self._running, self._waiting = batch.running, batch.waiting
        requests = self._requests
        for event in batch.events:
            queue = requests.get(event.id)
            if queue is None:  # it stopped early; these were on their way
                if event.WhichOneof("event") == "end":
                    self._cancelled_at.pop(event.id, None)  # it did stop
                continue
            if event.WhichOneof("event") == "end":
                del requests[event.id]
            queue.put_nowait(event)

    async def _ended(self) -> None:
        """The socket closed: the engine exited. End what is in flight, and say why."""
        cause = describe_exit(await self._reap(), self._oom_kills, oom_kill_count())
        if self._hung is not None:
            cause = f"the server killed it: {self._hung}"
        self._running = self._waiting = 0
        if self._closing is not None:
            self._dead = Unavailable(f"{self._closing}; retry")
        else:
            self._log_death(cause, "while serving")
            self._dead = EngineCrashed(
                f"model {self.name!r} stopped: its engine process (pid {self.pid}) ended: "
                f"{cause}; the next request starts it afresh, retry",
                cause,
            )
        requests, self._requests = self._requests, {}
        for queue in requests.values():
            queue.put_nowait(self._dead)
        if self._watching is not None:  # nothing left to watch
            self._watching.cancel()
        self._writer.close()
        if self._closing is None:
            self._hooks.on_exit(cause)

    async def _reap(self) -> int:
        """The exit status, once the process is gone (killed if it lingers)."""
        try:
            return await asyncio.to_thread(self._process.wait, EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return await asyncio.to_thread(self._process.wait)

    def _log_death(self, cause: str, when: str) -> None:
        log.error(
            "engine process died",
            model=self.name,
            pid=self.pid,
            cause=cause,
            when=when,
            output=self._output.text(),
        )


def _spawn(fd: int) -> subprocess.Popen[bytes]:
    """Start an engine on this thread: the kernel's parent-death signal follows the
    thread that started the child, and the event loop's lives as long as the pool."""
    command = [
        sys.executable,
        "-m",
        "service.engine",
        "--fd",
        str(fd),
        "--parent",
        str(os.getpid()),
    ]
    return subprocess.Popen(
        command,
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _relay_output(process: subprocess.Popen[bytes], model: str, tail: OutputTail) -> None:
    """Copy what the engine writes into our log, keeping the last lines for a crash report.

    Its own log lines are JSON and keep their level; anything else (a native
    library printing to stderr) is logged as a warning.
    """
    stream = process.stdout
    assert stream is not None  # started with stdout=PIPE

    def relay(stream: IO[bytes]) -> None:
        with stream:  # ends when the engine exits
            for raw in stream:
                line = raw.decode("utf-8", errors="replace").rstrip()
                if line:
                    tail.add(line)
                    _log_engine_line(line, model, process.pid)

    threading.Thread(
        target=relay, args=(stream,), name=f"engine-output:{model}", daemon=True
    ).start()


def _log_engine_line(line: str, model: str, pid: int) -> None:
    try:
        fields = json.loads(line)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        log.warning("engine output", model=model, engine_pid=pid, line=line)
        return
    level = str(fields.pop("level", "info"))
    event = str(fields.pop("event", ""))
    fields.pop("timestamp", None)
    fields.setdefault("model", model)
    emit = getattr(log, level, log.info)
    emit(event, engine_pid=pid, **fields)
