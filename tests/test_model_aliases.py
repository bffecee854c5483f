"""One file, one model: every spelling of a local model's path is the same model (issue 27).

Before, `x.gguf`, `./x.gguf`, `x.gguf/.` and the absolute path each loaded a
model of their own, with an engine each: five copies evicted the default
model under a small budget, and thirty spellings made thirty-one `model`
label sets in /metrics.
"""

from __future__ import annotations

import os
from pathlib import Path

from inference.v1 import inference_pb2 as pb
from service.models.embedded import EMBEDDED_MODELS
from tests.conftest import SMOLLM, collect, make_settings, serving


def test_every_spelling_of_one_file_is_one_model(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.link(EMBEDDED_MODELS[SMOLLM].locate(), models / "x.gguf")
    absolute = str(models / "x.gguf")
    spellings = ["x.gguf", "./x.gguf", "x.gguf/.", "./x.gguf/.", absolute, absolute + "/."]
    spellings.append(absolute.replace("/models/", "//models//"))
    with serving(make_settings(models_dir=[models])) as (_, stub):
        names = set()
        for spelling in spellings:
            request = pb.GenerateRequest(model=spelling, prompt="Hi", max_tokens=1)
            names.add(collect(stub.Generate(request))[0].started.model)
        assert names == {"x.gguf"}  # relative to its models dir: no server path shown
        reply: pb.ListModelsResponse = stub.ListModels(pb.ListModelsRequest())
        loaded = [model.name for model in reply.models if model.loaded and model.name != SMOLLM]
        assert loaded == ["x.gguf"]  # one engine for every spelling
