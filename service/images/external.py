"""The external image command: an escape hatch for architectures no in-process backend has.

It follows mflux-generate's arguments: `--base-model NAME` for the command's
built-in models, `--base-model FAMILY --model REPO` for other checkpoints, then
`--prompt`, `--output`, `--width`, `--height`, `--steps`, `--guidance`, `--seed`.

The command is resolved from settings: a managed copy is preferred, but only
when it actually runs (`--help` exits 0; a copy whose environment is broken
exists on disk and fails on import), else the configured name on PATH. Its
`--help` also says which built-in models it knows, so that list comes from
the tool, not from this file.

Each generation runs in a temporary directory the server owns, under a
timeout; cancelling the request kills the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from pathlib import Path

from service.errors import BackendFailure, NotSupported, TimedOut
from service.images.requests import ImageRequest, ImageStep, RenderedImage
from service.scratch import temporary_directory_problem

BACKEND_NAME = "mflux"
PROBE_TIMEOUT = 60.0
# How long a probe result is trusted before the command is probed again.
PROBE_TTL = 300.0
STDERR_TAIL = 2000

# mflux's built-in model names, consulted only to recognise a request for one
# when no working command can be asked for its own list (to say so clearly).
FALLBACK_BASE_MODELS = frozenset(
    {"dev", "schnell", "krea-dev", "dev-krea", "qwen", "fibo", "z-image", "z-image-turbo"}
)

_BASE_MODEL_CHOICES = re.compile(r"--base-model\s+\{([^}]*)\}")
_STEP = re.compile(r"(\d+)\s*/\s*(\d+)")


@dataclass(frozen=True)
class ImageCommand:
    executable: str
    base_models: frozenset[str]


@dataclass(frozen=True)
class ExternalRoute:
    """An image model the external command serves."""

    model: str  # the name the request used
    base_model: str
    repo: str | None = None  # None for the command's built-in models

    def arguments(self) -> list[str]:
        if self.repo is None:
            return ["--base-model", self.base_model]
        return ["--base-model", self.base_model, "--model", self.repo]


class CommandResolver:
    def __init__(self, command: str, managed: Path | None) -> None:
        self._command = command
        self._managed = managed
        self._cached: tuple[float, ImageCommand | None] | None = None

    def resolve(self) -> ImageCommand | None:
        """The command to run, or None when neither the managed copy nor PATH's runs.

        Blocking (it may run `--help`): call it off the event loop.
        """
        if self._cached is not None and time.monotonic() - self._cached[0] < PROBE_TTL:
            return self._cached[1]
        found = self._probe_all()
        self._cached = (time.monotonic(), found)
        return found

    def known_base_models(self) -> frozenset[str]:
        command = self.resolve()
        return command.base_models if command else FALLBACK_BASE_MODELS

    def missing_reason(self) -> str:
        managed = f" (the managed copy {self._managed} does not run)" if self._managed else ""
        return (
            f"the external image command {self._command!r} was not found or does not run"
            f"{managed}; install mflux or set --image-command"
        )

    def _probe_all(self) -> ImageCommand | None:
        candidates = [str(self._managed)] if self._managed and self._managed.is_file() else []
        on_path = shutil.which(self._command)
        candidates += [on_path] if on_path else []
        for executable in candidates:
            help_text = _help_text(executable)
            if help_text is not None:
                return ImageCommand(executable, _base_models(help_text))
        return None


def _help_text(executable: str) -> str | None:
    try:
        done = subprocess.run(
            [executable, "--help"], capture_output=True, text=True, timeout=PROBE_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _base_models(help_text: str) -> frozenset[str]:
    match = _BASE_MODEL_CHOICES.search(help_text)
    if match is None:
        return FALLBACK_BASE_MODELS
    return frozenset(name.strip() for name in match.group(1).split(",") if name.strip())


def command_line(
    command: ImageCommand, route: ExternalRoute, request: ImageRequest, output: Path
) -> list[str]:
    argv = [command.executable, *route.arguments(), "--prompt", request.prompt]
    argv += ["--output", str(output), "--seed", str(request.seed)]
    for flag, value in (
        ("--width", request.width),
        ("--height", request.height),
        ("--steps", request.steps),
        ("--guidance", request.guidance),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv


@contextlib.contextmanager
def _working_folder() -> Iterator[str]:
    """A folder of the request's own in the temporary directory; FAILED_PRECONDITION
    naming the folders tried and the fix where there is none to write in."""
    try:
        folder = tempfile.mkdtemp(prefix="inference-image-")
    except OSError as exc:
        problem = temporary_directory_problem() or (exc.strerror or str(exc))
        raise NotSupported(f"the external image command needs a working folder: {problem}") from exc
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def run_external(
    command: ImageCommand,
    route: ExternalRoute,
    request: ImageRequest,
    timeout: float,
    started: float | None = None,
) -> AsyncGenerator[ImageStep | RenderedImage, None]:
    """Run the command; yield progress parsed from its stderr, then the image.

    Progress times count from `started` (time.monotonic; None: now).
    """
    if started is None:
        started = time.monotonic()
    with _working_folder() as workdir:
        output = Path(workdir) / "image.png"
        argv = command_line(command, route, request, output)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as one
            )
        except OSError as exc:
            raise NotSupported(f"cannot start {command.executable}: {exc.strerror}") from exc
        tail = _Tail()
        try:
            async with asyncio.timeout(timeout):
                assert process.stderr is not None
                async for step, total in _progress(process.stderr, tail):
                    yield ImageStep(step, total, (time.monotonic() - started) * 1000)
                code = await process.wait()
        except TimeoutError as exc:
            raise TimedOut(
                f"{Path(command.executable).name} took longer than {timeout:g} s "
                "(--image-command-timeout) and was stopped"
            ) from exc
        finally:
            await _kill(process)
        # Reading the file blocks: off the event loop.
        yield await asyncio.to_thread(_read_output, command, code, output, tail.text)


class _Tail:
    """The last characters of the command's stderr, for error messages."""

    def __init__(self) -> None:
        self.text = ""

    def add(self, chunk: str) -> None:
        self.text = (self.text + chunk)[-STDERR_TAIL:]


async def _progress(
    stream: asyncio.StreamReader, tail: _Tail
) -> AsyncGenerator[tuple[int, int], None]:
    """(step, total) pairs from progress bars; tqdm redraws with carriage returns."""
    pending, last = "", 0
    while chunk := await stream.read(4096):
        text = chunk.decode("utf-8", errors="replace")
        tail.add(text)
        *lines, pending = re.split(r"[\r\n]", pending + text)
        for line in lines:
            match = _STEP.search(line)
            if match is None:
                continue
            step, total = int(match.group(1)), int(match.group(2))
            if total > 0 and last < step <= total:
                last = step
                yield step, total


async def _kill(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it ended on its own just now
            os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


def _read_output(command: ImageCommand, code: int, output: Path, stderr: str) -> RenderedImage:
    name = Path(command.executable).name
    if code != 0:
        raise BackendFailure(f"{name} exited with status {code}: {stderr.strip()[-STDERR_TAIL:]}")
    if not output.is_file():
        raise BackendFailure(f"{name} exited 0 but wrote no image to --output")
    png = output.read_bytes()
    size = png_size(png)
    if size is None:
        raise BackendFailure(f"{name} wrote a file that is not a PNG image")
    return RenderedImage(png, *size)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's header chunk (IHDR, with its CRC checked, as Pillow
    does when it opens one), or None for bytes that do not start a PNG. Read here rather
    than with Pillow: the text image, which runs this command too, has no Pillow."""
    if len(data) < 33 or not data.startswith(_PNG_SIGNATURE):
        return None
    length, kind = struct.unpack(">I4s", data[8:16])
    if length != 13 or kind != b"IHDR":  # the first chunk, always, of this length
        return None
    if zlib.crc32(data[12:29]) != struct.unpack(">I", data[29:33])[0]:
        return None
    width, height = struct.unpack(">II", data[16:24])
    return (width, height) if width and height else None
