"""OpenAI's own schemas of its API (tests/schemas/openai), to validate answers against.

`validate(body, "CreateChatCompletionResponse")` checks a body against a schema of
the document's `components/schemas`, with every `$ref` resolved inside the
document (OpenAPI 3.1's schemas are JSON Schema 2020-12; the few `nullable: true`
left from OpenAPI 3.0 are read as allowing null). The document is read once
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
    _nullable_as_null(document)
    registry: Registry[Any] = Registry().with_resource(_URI, DRAFT202012.create_resource(document))
    return registry


def _nullable_as_null(document: Any) -> None:
    """OpenAPI 3.0's `nullable: true`, which parts of the document still use (the chunks'
    logprobs), as JSON Schema says it: null is one more value allowed."""
    pending = [document]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        pending.extend(node.values())
        if node.pop("nullable", False) is not True:
            continue
        if isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
            if "enum" in node:
                node["enum"] = [*node["enum"], None]
        elif "type" not in node:
            alternative = dict(node)
            node.clear()
            node["anyOf"] = [alternative, {"type": "null"}]


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


def optional_fields(name: str) -> list[str]:
    """The optional fields of one of the document's request schemas (`allOf` parts too)."""
    found: dict[str, Any] = {}
    required: set[str] = set()
    for part in schema(name).get("allOf", [schema(name)]):
        if "$ref" in part:
            part = schema(part["$ref"].rsplit("/", 1)[1])
        found.update(part.get("properties", {}))
        required.update(part.get("required", []))
    return sorted(set(found) - required)
