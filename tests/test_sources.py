"""The resolver keeps every path a request names inside the roots the operator allowed.

Real directory trees in a temporary directory: models dirs with symlinks in and
out, a hub cache laid out as huggingface_hub lays it out, and an `outside`
directory that nothing a request names may reach. `touched` records every
file system call the resolver makes, to show that nothing outside is even
stat'ed, so that no answer can depend on what exists there.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest

from service.errors import AccessDenied, InvalidRequest, ModelNotFound, ServiceError
from service.models import confine
from service.models.sources import MAX_MODEL_NAME_LENGTH, SourceResolver, check_model_name
from tests.fixtures import write_checkpoint, write_gguf_header, write_hub_snapshot

FT = gguf.LlamaFileType
Q = gguf.GGMLQuantizationType
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # the one write_hub_snapshot uses


def gguf_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_gguf_header(path, "llama", FT.MOSTLY_Q8_0, [Q.Q8_0])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """models/ (the models dir), hub/ (the hub cache) and outside/ (out of bounds)."""
    outside = tmp_path / "outside"
    gguf_file(outside / "secret.gguf")
    (outside / "weights.safetensors").write_bytes(b"\0" * 64)
    (outside / "ref").write_text(COMMIT)  # a ref a revision might climb out to
    models = tmp_path / "models"
    gguf_file(models / "tiny.gguf")
    gguf_file(models / "nested" / "deeper" / "inner.gguf")
    (models / "alias.gguf").symlink_to("nested/deeper/inner.gguf")
    (models / "sub").mkdir()
    (models / "sub" / "x.gguf").symlink_to(outside / "secret.gguf")
    write_checkpoint(models / "good-ckpt", {"model_type": "llama"}, 64)
    (models / "ckpt-link").symlink_to("good-ckpt")
    write_checkpoint(models / "ckpt", {"model_type": "llama"})
    (models / "ckpt" / "model.safetensors").symlink_to("../../outside/weights.safetensors")
    (models / "linkdir").symlink_to(outside)
    hub = tmp_path / "hub"
    q8 = (models / "tiny.gguf").read_bytes()
    write_hub_snapshot(hub, "acme/tiny-gguf", {"tiny-Q8_0.gguf": q8, "tiny-Q4_K_M.gguf": q8})
    write_hub_snapshot(hub, "acme/tiny-llama", {"config.json": b'{"model_type": "llama"}'})
    return tmp_path


@pytest.fixture
def resolver(tree: Path) -> SourceResolver:
    return SourceResolver([tree / "models"], tree / "hub")


Touched = list[tuple[str, str]]


@pytest.fixture
def touched(monkeypatch: pytest.MonkeyPatch) -> Touched:
    """(function, path) for every stat, lstat, readlink, listing and open from now on."""
    calls: Touched = []

    def recording(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if args and isinstance(args[0], str | bytes | os.PathLike):
                calls.append((name, os.fsdecode(args[0])))
            return function(*args, **kwargs)

        return wrapper

    for name in ("stat", "lstat", "readlink", "scandir", "listdir", "open"):
        monkeypatch.setattr(os, name, recording(name, getattr(os, name)))
    monkeypatch.setattr(builtins, "open", recording("open", builtins.open))
    return calls


def reached(calls: Touched, place: Path) -> list[str]:
    """The calls that looked at something under `place`, symlinks taken into account.

    lstat and readlink look at a link itself (which may sit inside a root and
    point out); the other calls look at what a path finally leads to.
    """
    hits = []
    for name, path in list(calls):
        absolute = os.path.abspath(path)
        if name in ("lstat", "readlink"):
            real = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(path))
        else:
            real = os.path.realpath(absolute)
        if confine.within(real, str(place)):
            hits.append(f"{name}({path})")
    return hits


def refusal(resolver: SourceResolver, reference: str) -> ServiceError:
    """The error resolving `reference` raises (it must raise one)."""
    with pytest.raises(ServiceError) as caught:
        resolver.resolve(reference)
    return caught.value


def shape(message: str) -> str:
    """A message with the client's quoted text masked: what is left must not vary."""
    return re.sub(r"'[^']*'(\.\.\. \(\d+ characters\))?", "<quoted>", message)


# --- what the issue reported ---------------------------------------------------------


def test_an_absolute_file_after_the_colon_is_refused_alike_whether_it_exists(
    resolver: SourceResolver, tree: Path, touched: Touched
) -> None:
    outside = tree / "outside"
    errors = [
        refusal(resolver, f"acme/tiny-gguf:{outside}/{name}.gguf") for name in ("secret", "absent")
    ]
    assert all(isinstance(error, AccessDenied) for error in errors)
    assert shape(errors[0].message) == shape(errors[1].message)
    assert "magic" not in errors[0].message
    assert reached(touched, outside) == []


def test_a_symlinked_gguf_in_a_model_directory_is_refused(
    resolver: SourceResolver, tree: Path, touched: Touched
) -> None:
    for reference in ("sub", "sub/x.gguf", str(tree / "models" / "sub")):
        error = refusal(resolver, reference)
        assert isinstance(error, AccessDenied), error
        assert "outside" not in error.message.replace("leads outside", "")
    assert "x.gguf" in refusal(resolver, "sub").message
    assert reached(touched, tree / "outside") == []


def test_a_symlinked_safetensors_in_a_checkpoint_is_refused(
    resolver: SourceResolver, tree: Path
) -> None:
    error = refusal(resolver, "ckpt")
    assert isinstance(error, AccessDenied)
    assert "model.safetensors" in error.message
    assert "weights" not in error.message  # the outside target is never named


def test_an_entry_deep_in_a_pipeline_may_not_lead_outside(
    resolver: SourceResolver, tree: Path
) -> None:
    pipeline = tree / "models" / "pipeline"
    (pipeline / "unet").mkdir(parents=True)
    (pipeline / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    (pipeline / "unet" / "model.safetensors").symlink_to(tree / "outside" / "weights.safetensors")
    error = refusal(resolver, "pipeline")
    assert isinstance(error, AccessDenied)
    assert "unet/model.safetensors" in error.message


def test_a_symlinked_directory_component_is_refused_without_looking_outside(
    resolver: SourceResolver, tree: Path, touched: Touched
) -> None:
    errors = [refusal(resolver, f"linkdir/{name}.gguf") for name in ("secret", "absent")]
    assert [type(error) for error in errors] == [AccessDenied, AccessDenied]
    assert shape(errors[0].message) == shape(errors[1].message)
    assert reached(touched, tree / "outside") == []


@pytest.mark.parametrize(
    ("reference", "refused_as"),
    [
        ("../outside/secret.gguf", AccessDenied),
        ("sub/../../outside/secret.gguf", AccessDenied),
        ("./../outside/secret.gguf", AccessDenied),
        ("nested//../../outside/secret.gguf", AccessDenied),
        ("..", AccessDenied),
        ("nested/..", AccessDenied),
        ("{models}/../outside/secret.gguf", AccessDenied),
        ("{outside}/secret.gguf", AccessDenied),
        ("/etc/passwd", AccessDenied),
        ("acme/tiny-gguf:../../../../outside/secret.gguf", AccessDenied),
        ("acme/tiny-gguf:/etc/passwd", AccessDenied),
        ("acme/tiny-gguf@../../../../outside/ref", AccessDenied),
        ("acme/tiny-gguf@/{outside}/ref", AccessDenied),
        ("acme/tiny-gguf@main/../../../../../outside/ref:secret.gguf", AccessDenied),
        # Encoded and look-alike spellings are names like any other: nothing is decoded.
        ("%2e%2e/outside/secret.gguf", ModelNotFound),
        ("..%2foutside%2fsecret.gguf", ModelNotFound),
        ("..\\outside\\secret.gguf", ModelNotFound),
        ("\uff0e\uff0e/outside/secret.gguf", ModelNotFound),
    ],
)
def test_parent_steps_and_their_spellings_never_leave(
    resolver: SourceResolver,
    tree: Path,
    touched: Touched,
    reference: str,
    refused_as: type[ServiceError],
) -> None:
    reference = reference.format(models=tree / "models", outside=tree / "outside")
    error = refusal(resolver, reference)
    assert isinstance(error, refused_as), error
    assert reached(touched, tree / "outside") == []


def test_a_revision_cannot_read_a_ref_outside_the_cache(
    resolver: SourceResolver, tree: Path, touched: Touched
) -> None:
    refs = tree / "hub" / "models--acme--tiny-gguf" / "refs"
    (refs / "evil").symlink_to(tree / "outside" / "ref")
    for revision in ("evil", "../../../outside/ref"):
        error = refusal(resolver, f"acme/tiny-gguf@{revision}:Q8_0")
        assert isinstance(error, AccessDenied), error
    assert reached(touched, tree / "outside") == []


@pytest.mark.parametrize("length", [100_000, 15 << 20])
def test_names_past_the_limit_are_invalid_and_not_echoed(
    resolver: SourceResolver, touched: Touched, length: int
) -> None:
    name = "a" * length
    error = refusal(resolver, name)
    assert isinstance(error, InvalidRequest)
    assert str(MAX_MODEL_NAME_LENGTH) in error.message
    assert len(error.message) < 300
    assert touched == []  # refused before any file system call
    with pytest.raises(InvalidRequest):
        check_model_name(name)


def test_the_limit_admits_a_name_of_exactly_its_length(resolver: SourceResolver) -> None:
    fits = "/".join(["d"] * (MAX_MODEL_NAME_LENGTH // 2))[: MAX_MODEL_NAME_LENGTH - 1] + "x"
    assert len(fits) == MAX_MODEL_NAME_LENGTH
    assert isinstance(refusal(resolver, fits), ModelNotFound)
    assert isinstance(refusal(resolver, fits + "x"), InvalidRequest)


@pytest.mark.parametrize("name", ["tiny\0.gguf", "tiny.gguf\0", "\0", "a\nb.gguf", "x\x7f"])
def test_control_characters_are_invalid(resolver: SourceResolver, name: str) -> None:
    error = refusal(resolver, name)
    assert isinstance(error, InvalidRequest)
    assert "\0" not in error.message


def test_file_system_refusals_become_clear_statuses(resolver: SourceResolver, tree: Path) -> None:
    too_long = refusal(resolver, "n" * 300 + ".gguf")  # ENAMETOOLONG
    assert isinstance(too_long, InvalidRequest)
    assert "longer than the file system allows" in too_long.message
    (tree / "models" / "loop").symlink_to("loop")
    loop = refusal(resolver, "loop/x.gguf")  # ELOOP
    assert isinstance(loop, InvalidRequest)
    assert "symbolic links" in loop.message


def test_a_fifo_is_refused_before_anyone_opens_it(resolver: SourceResolver, tree: Path) -> None:
    os.mkfifo(tree / "models" / "pipe.gguf")  # opening it would block until a writer came
    assert isinstance(refusal(resolver, "pipe.gguf"), InvalidRequest)
    os.mkfifo(tree / "models" / "good-ckpt" / "tokenizer.json")
    error = refusal(resolver, "good-ckpt")
    assert isinstance(error, InvalidRequest)
    assert "tokenizer.json" in error.message


def test_split_gguf_parts_must_stay_inside(resolver: SourceResolver, tree: Path) -> None:
    split = tree / "models" / "split"
    gguf_file(split / "big-00001-of-00002.gguf")
    (split / "big-00002-of-00002.gguf").symlink_to(tree / "outside" / "secret.gguf")
    error = refusal(resolver, "split/big-00001-of-00002.gguf")
    assert isinstance(error, AccessDenied)
    assert "big-00002-of-00002.gguf" in error.message


# --- bounded walks ---------------------------------------------------------------------


def test_a_huge_directory_is_refused_after_a_bounded_walk(
    resolver: SourceResolver, tree: Path, touched: Touched
) -> None:
    crowd = tree / "models" / "crowd"
    crowd.mkdir()
    for index in range(confine.MAX_ENTRIES + 500):
        (crowd / f"f{index}").touch()
    error = refusal(resolver, "crowd")
    assert isinstance(error, InvalidRequest)
    assert str(confine.MAX_ENTRIES) in error.message
    assert len(error.message) < 400
    assert sum(name == "lstat" for name, _ in touched) < 50  # refused before looking at each


def test_a_deep_directory_is_refused(resolver: SourceResolver, tree: Path) -> None:
    deep = tree / "models" / "deep"
    gguf_file(deep.joinpath(*["d"] * (confine.MAX_DEPTH + 1), "model.gguf"))
    error = refusal(resolver, "deep")
    assert isinstance(error, InvalidRequest)
    assert str(confine.MAX_DEPTH) in error.message


def test_several_ggufs_are_listed_only_in_part(resolver: SourceResolver, tree: Path) -> None:
    many = tree / "models" / "many"
    for index in range(20):
        gguf_file(many / f"m{index:02d}-{'x' * 200}.gguf")
    error = refusal(resolver, "many")
    assert isinstance(error, InvalidRequest)
    assert "and 15 more" in error.message
    assert len(error.message) < 1000


# --- legitimate layouts keep working ----------------------------------------------------


def test_a_hub_snapshot_of_blob_symlinks_resolves(resolver: SourceResolver, tree: Path) -> None:
    snapshot = tree / "hub" / "models--acme--tiny-gguf" / "snapshots" / COMMIT
    by_tag = resolver.resolve("acme/tiny-gguf:Q4_K_M")
    assert (by_tag.kind, by_tag.path) == ("gguf", snapshot / "tiny-Q4_K_M.gguf")
    by_name = resolver.resolve(f"acme/tiny-gguf@{COMMIT}:tiny-Q8_0.gguf")
    assert by_name.path == snapshot / "tiny-Q8_0.gguf"
    checkpoint = resolver.resolve("acme/tiny-llama@main")
    assert checkpoint.kind == "checkpoint"
    assert checkpoint.hub is not None
    assert checkpoint.hub.repo_id == "acme/tiny-llama"
    assert resolver.resolve("acme/not-downloaded").path is None


def test_paths_inside_the_models_dir_resolve(resolver: SourceResolver, tree: Path) -> None:
    models = tree / "models"
    inner = models / "nested" / "deeper" / "inner.gguf"
    expected = {
        "tiny.gguf": ("gguf", models / "tiny.gguf"),
        "nested": ("gguf", inner),  # the one GGUF in a subfolder
        "nested/deeper/inner.gguf": ("gguf", inner),
        "alias.gguf": ("gguf", inner),  # a symlink to elsewhere inside
        "good-ckpt": ("checkpoint", models / "good-ckpt"),
        "ckpt-link": ("checkpoint", models / "good-ckpt"),
        str(models / "tiny.gguf"): ("gguf", models / "tiny.gguf"),
    }
    for reference, (kind, path) in expected.items():
        source = resolver.resolve(reference)
        assert (source.kind, source.path) == (kind, path), reference


def test_a_models_dir_named_through_a_symlink_still_serves(tree: Path) -> None:
    (tree / "models-alias").symlink_to(tree / "models")
    resolver = SourceResolver([tree / "models-alias"], tree / "hub")
    absolute = resolver.resolve(str(tree / "models-alias" / "tiny.gguf"))
    assert absolute.path == tree / "models" / "tiny.gguf"
    assert resolver.resolve("alias.gguf").kind == "gguf"


def test_trusted_sources_may_name_any_path(resolver: SourceResolver, tree: Path) -> None:
    secret = tree / "outside" / "secret.gguf"
    assert resolver.resolve(str(secret), trusted=True).path == secret
    assert resolver.resolve("sub", trusted=True).path == secret  # through a symlink out
    # A configured name stays a configured name: only requests are confined.
    with pytest.raises(AccessDenied):
        resolver.resolve(str(secret))


def test_the_recorder_sees_what_the_old_resolver_did(tree: Path, touched: Touched) -> None:
    """`touched` can fail: Path.exists() under a symlinked directory stats the outside."""
    assert (tree / "models" / "linkdir" / "secret.gguf").exists()
    assert reached(touched, tree / "outside") != []
