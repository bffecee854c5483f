"""OpenAI's own schemas of its API (tests/schemas/openai), to validate answers against.

`validate(body, "CreateChatCompletionResponse")` checks a body against a schema of
the document's `components/schemas`, with every `$ref` resolved inside the
document (OpenAPI 3.1's schemas are JSON Schema 2020-12). The document is read once
(about a second) and only by the tests that use it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry
from referencing.jsonschema import DRAFT202012

DOCUMENT = Path(__file__).parent / "schemas" / "openai" / "openapi.documented.yml"
_URI = "urn:openai:openapi"


@functools.cache
def _registry() -> Registry[Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with DOCUMENT.open() as file:
        document = yaml.load(file, Loader=loader)  # a safe loader, C or Python
    registry: Registry[Any] = Registry().with_resource(_URI, DRAFT202012.create_resource(document))
    return registry


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"{_URI}#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(schema, registry=_registry())


def validate(body: Any, name: str) -> None:
    """jsonschema.ValidationError (the deepest one, with its path) unless `body` is
    what the schema `name` allows."""
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(body))
    if error is not None:
        raise error


def schema(name: str) -> Any:
    """The document's schema `name`, its refs left as they are."""
    return _registry().contents(_URI)["components"]["schemas"][name]
