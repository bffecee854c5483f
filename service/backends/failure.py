"""Library failures: caught where the service calls into a model library, nowhere else.

A model library can fail inside any call the service makes into it (a forward
pass, a tokenizer, a chat template, a diffusion pipeline). Such a call site
catches what the library raised, logs it with its traceback and raises
`BackendFailure` (INTERNAL) with a message saying what failed. Whether the model
is then discarded is the call site's choice: after a failed forward pass its
state is unknown, after a failed tokenizer call it is not.

Everything raised outside those call sites is a bug of ours: it is not caught
here, and reaches the RPC layer, which answers INTERNAL with a generic message
and logs the traceback. The backend modules count as the library's side of the
boundary: a bug in one looks like a library failure.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from service.errors import BackendFailure, NotSupported, excerpt

log = structlog.get_logger("backend")

# The library's own words in the client's message are cut to this many characters:
# they can quote the prompt, and a status message must stay small.
LIBRARY_TEXT_LIMIT = 200
# What a client is told happens to a model its library failed inside.
RELOADING = "it was unloaded, and the next request loads it afresh"


def library_failure(what: str, exc: Exception, consequence: str = "") -> BackendFailure:
    """`BackendFailure` for `exc`, raised by a library while doing `what`; logs it.

    `consequence` tells the client what happens next (the model is reloaded).
    """
    log.warning("model library failed", what=what, exc_info=exc)
    detail = f"{type(exc).__name__}: {excerpt(str(exc), LIBRARY_TEXT_LIMIT)}"
    then = f"; {consequence}" if consequence else ""
    return BackendFailure(f"{what} ({detail}){then}")


def load_refused(library: str, path: Path, reason: str) -> NotSupported:
    """What a client is told when `library` will not load the model at `path`.

    The files are the caller's model, so this is FAILED_PRECONDITION, like an
    admission refusal; the model is named by its file or folder name, never the
    server's full path, and the library's words are cut short.
    """
    reason = reason.replace(str(path), path.name)
    if len(reason) > LIBRARY_TEXT_LIMIT:
        reason = reason[:LIBRARY_TEXT_LIMIT] + "..."
    return NotSupported(f"{library} cannot load {path.name}: {reason}")
