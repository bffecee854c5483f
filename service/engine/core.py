"""One loaded model and everything that serves it, wherever it runs.

An `EngineCore` owns a backend, the worker thread the backend lives on and,
for a text model, its decode scheduler. Requests come in with the sink their
results go to, and everything here runs on the worker thread: the same code
serves a model in an engine process (sinks write frames to the front) and in
the front itself with `--engine-mode in-process` (sinks are channels to a
coroutine).

For text it prepares the prompt (chat template, tokenizer, length budget),
sends the `started` event and hands the plan to the scheduler; events leave
as `inference.v1.GenerateResponse` messages, tool calls parsed into the last.
For images it runs the pipeline, reporting each denoising step. For an
embedding model it tokenizes each request's inputs (within the request token
budget), then evaluates the requests waiting, one batch of their inputs per worker
step (service.engine.embedding_queue).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import structlog

from inference.v1 import inference_pb2 as pb
from service.backends.base import SequenceRequest, TextBackend
from service.backends.failure import RELOADING, library_failure
from service.backends.names import DIFFUSERS
from service.decode.scheduler import DecodeScheduler, nothing_to_publish
from service.decode.sequence import DecodeEvent, DecodePlan, fit_max_tokens
from service.decode.sink import Cancellation, EventSink
from service.embeddings.backend import EmbeddingBackend
from service.embeddings.requests import EmbedRequest
from service.engine.base import EngineInfo
from service.engine.embedding_queue import (
    EmbedJob,
    EmbedQueue,
    EmbedSink,
    over_budget,
    tokenized,
)
from service.engine.options import EngineOptions
from service.engine.worker import ModelWorker
from service.errors import NotSupported, ServiceError, Unavailable
from service.images.backend import GenerationCancelled, ImageBackend
from service.images.requests import ImageRequest, ImageStep, RenderedImage
from service.request_id import in_this_context
from service.text.chat_template import render_chat
from service.text.plain_content import prompt_ids
from service.text.requests import (
    ChatMessage,
    Finished,
    GenerationRequest,
    Grammar,
    Started,
    Tool,
    ToolChoice,
    check_token_ids,
)
from service.tools.base import ToolCallParser
from service.tools.conventions import convention_for_template, with_tool_calls

TextSink = EventSink[pb.GenerateResponse]
TokensSink = EventSink[pb.TokenizeResponse | pb.DetokenizeResponse]
ImageSink = EventSink[ImageStep | RenderedImage]

log = structlog.get_logger("engine")


class EngineCore:
    def __init__(
        self,
        options: EngineOptions,
        backend: TextBackend | ImageBackend | EmbeddingBackend,
        worker: ModelWorker,
        *,
        on_failure: Callable[[str], None],
        publish: Callable[[], None] = nothing_to_publish,
    ) -> None:
        """`on_failure` is told, from the worker thread, that the library failed and
        left the model in an unknown state; `publish` sends what sinks batched."""
        self.options = options
        self.backend = backend
        self.worker = worker
        self._on_failure = on_failure
        self._publish = publish
        self._broken: str | None = None
        # Images sent to the worker that it has not begun (see cancel_queued_image).
        self._queued_images: set[ImageSink] = set()
        self._images_lock = threading.Lock()
        self._preparer = ThreadPoolExecutor(1, thread_name_prefix=f"prepare:{options.name}")
        self.scheduler: DecodeScheduler | None = None
        self.embeddings: EmbedQueue | None = None
        if options.embeddings:
            self.embeddings = EmbedQueue(
                cast(EmbeddingBackend, backend), self._failed, publish, options.embed_batch_tokens
            )
            worker.attach(self.embeddings.step)
        elif options.backend != DIFFUSERS:
            self.scheduler = DecodeScheduler(
                cast(TextBackend, backend),
                options.max_waiting_sequences,
                options.model.stream_interval,
                name=options.name,
                on_failure=self._failed,
                publish=publish,
            )
            worker.attach(self.scheduler.step)

    @property
    def info(self) -> EngineInfo:
        scheduler = self.scheduler
        if self.embeddings is not None:
            window = cast(EmbeddingBackend, self.backend).context_length
            return EngineInfo(self.backend.name, window)
        if scheduler is None:
            return EngineInfo(self.backend.name, 0)
        return EngineInfo(self.backend.name, self._text.context_length, scheduler.computes_off_cpu)

    @property
    def running(self) -> int:
        return 0 if self.scheduler is None else self.scheduler.running

    @property
    def waiting(self) -> int:
        if self.embeddings is not None:
            return self.embeddings.waiting
        return 0 if self.scheduler is None else self.scheduler.waiting

    @property
    def _text(self) -> TextBackend:
        return cast(TextBackend, self.backend)

    # --- on the worker thread -----------------------------------------------------------

    def submit_text(self, request: GenerationRequest, received_at: float, sink: TextSink) -> None:
        """Prepare one generation on the preparation thread, then queue it on the worker;
        its events go to `sink`. Called from any thread.

        Rendering the chat template and tokenizing take time in proportion to the
        prompt (a megabyte takes seconds): on the worker thread they held up every
        stream of the model between two steps. The preparation thread is one, so
        requests are queued in the order they came.

        The caller's context holds the request id (bound by the engine process, or
        the RPC's own in-process): preparing and queueing run in copies of it, so
        what they log names the request."""
        prepare = in_this_context(lambda: self._prepare_then_queue(request, received_at, sink))
        self._preparer.submit(prepare)

    def _prepare_then_queue(
        self, request: GenerationRequest, received_at: float, sink: TextSink
    ) -> None:
        try:
            scheduler = self._scheduler()
            started, plan, parser = self._prepare(request)
        except Exception as exc:  # this request's alone: a ServiceError, or a bug of ours
            sink.close(exc)
            self._publish()
            return
        log.debug(
            "request prepared", prompt_tokens=started.prompt_tokens, max_tokens=plan.max_tokens
        )
        responses = _Responses(sink, parser if request.tools else None)

        def queue() -> None:
            sink.send(started.to_pb())
            scheduler.enqueue(plan, received_at, responses)

        try:
            self.worker.submit(in_this_context(queue))
        except ServiceError as exc:  # the model is being unloaded
            sink.close(exc)
            self._publish()

    def submit_embed(self, request: EmbedRequest, sink: EmbedSink) -> None:
        """Tokenize one request's inputs on the preparation thread (refused there past the
        request token budget), then queue them for the worker, which evaluates them batch
        by batch with whatever else is waiting. Called from any thread, in the request's
        context, as submit_text."""
        self._preparer.submit(in_this_context(lambda: self._tokenize_then_queue(request, sink)))

    def _tokenize_then_queue(self, request: EmbedRequest, sink: EmbedSink) -> None:
        try:
            if self.embeddings is None:
                raise NotSupported(f"model {self.options.name!r} does not embed; call Generate")
            backend = cast(EmbeddingBackend, self.backend)
            budget = self.options.request_token_budget
            ids, truncated = tokenized(
                backend, request.inputs, request.truncate, budget, sink.cancelled
            )
            if sink.cancelled.is_set():  # the client left while its inputs were read
                sink.close()
                self._publish()
                return
            queue = self.embeddings
            job = EmbedJob(ids, truncated, request.normalize, sink)
            self.worker.submit(in_this_context(lambda: queue.add(job)))
        except Exception as exc:  # this request's alone (a ServiceError, or a bug of ours)
            sink.close(exc)
            self._publish()

    def submit_tokenize(self, request: GenerationRequest, sink: TokensSink) -> None:
        """The ids `request`'s prompt or messages become, as `_prepare` makes them, to
        `sink`; on the preparation thread (which owns the tokenizer's work), in the
        caller's context. Called from any thread."""

        def tokenize() -> pb.TokenizeResponse:
            ids = self._prompt_ids(request)
            budget = self.options.request_token_budget
            if len(ids) > budget:
                held = f"the prompt is {len(ids):,} tokens"
                raise over_budget(held, budget, "tokenize it in parts")
            name, window = self.options.name, self._text.context_length
            return pb.TokenizeResponse(token_ids=ids, model=name, context_length=window)

        self._preparer.submit(in_this_context(lambda: self._answer(tokenize, sink)))

    def submit_detokenize(self, token_ids: Sequence[int], sink: TokensSink) -> None:
        """The text `token_ids` write, to `sink`; as submit_tokenize."""

        def detokenize() -> pb.DetokenizeResponse:
            backend = self._text
            check_token_ids(token_ids, backend.vocab_size, "tokens")
            return pb.DetokenizeResponse(
                text=backend.detokenize(token_ids), model=self.options.name
            )

        self._preparer.submit(in_this_context(lambda: self._answer(detokenize, sink)))

    def _answer(
        self,
        work: Callable[[], pb.TokenizeResponse | pb.DetokenizeResponse],
        sink: TokensSink,
    ) -> None:
        """One answer of the tokenizer, or its error, to `sink`."""
        try:
            self._scheduler()  # a text model's
            sink.send(work())
        except ServiceError as exc:
            sink.close(exc)
        except Exception as exc:  # the library's failure is this request's (no state)
            sink.close(library_failure(f"the tokenizer of model {self.options.name!r} failed", exc))
        else:
            sink.close()
        self._publish()

    def submit_image(self, request: ImageRequest, received_at: float, sink: ImageSink) -> None:
        """Queue one image on the worker thread, in the caller's context (as submit_text:
        what the pipeline logs names the request)."""
        with self._images_lock:
            self._queued_images.add(sink)
        try:
            self.worker.submit(
                in_this_context(lambda: self._start_queued_image(request, received_at, sink))
            )
        except BaseException:
            with self._images_lock:
                self._queued_images.discard(sink)
            raise

    def cancel_queued_image(self, sink: ImageSink) -> bool:
        """End an image cancelled before the worker began it, at once; whether it was one.
        Called from any thread.

        The worker renders one image at a time: one cancelled behind a long image would
        otherwise end only once that one has, and the front stops an engine whose
        cancelled image does not end soon (service.engine.liveness), the long image with it.
        """
        with self._images_lock:
            if sink not in self._queued_images:
                return False  # begun, or ended already: the pipeline sees the cancel
            self._queued_images.discard(sink)
        sink.close()
        self._publish()
        return True

    def _start_queued_image(
        self, request: ImageRequest, received_at: float, sink: ImageSink
    ) -> None:
        with self._images_lock:
            if sink not in self._queued_images:
                return  # cancelled while it waited, and ended then
            self._queued_images.discard(sink)
        self.start_image(request, received_at, sink)

    def start_image(self, request: ImageRequest, received_at: float, sink: ImageSink) -> None:
        """Render one image, reporting each step to `sink`, then the image."""
        try:
            sink.send(self._render(request, received_at, sink))
        except GenerationCancelled:
            sink.close()  # the client went away; nobody is listening
        except Exception as exc:
            sink.close(exc)
        else:
            sink.close()
        self._publish()

    def close(self, reason: str) -> None:
        """End every request with UNAVAILABLE and `reason`, then free the model (once no
        preparation uses its tokenizer)."""
        self._preparer.shutdown(wait=True, cancel_futures=True)
        if self.scheduler is not None:  # nothing may step a closed backend
            self.scheduler.abort(reason)
        if self.embeddings is not None:
            self.embeddings.abort(reason)
        self._broken = self._broken or reason
        self.backend.close()

    def _scheduler(self) -> DecodeScheduler:
        if self.embeddings is not None:
            raise NotSupported(f"model {self.options.name!r} gives embeddings; call Embed")
        if self.scheduler is None:
            raise NotSupported(f"model {self.options.name!r} generates images; call GenerateImage")
        return self.scheduler

    def _prepare(self, request: GenerationRequest) -> tuple[Started, DecodePlan, ToolCallParser]:
        backend = self._text
        parser = convention_for_template(self._template()).parser
        grammar = request.grammar
        if request.tool_choice is not None:
            grammar = self._forced_call(request.tools, request.tool_choice, parser)
        biased = (token for token, _ in request.sampling.logit_bias)
        check_token_ids(biased, backend.vocab_size, "logit_bias")
        prompt_ids = self._prompt_ids(request)
        max_tokens = fit_max_tokens(
            prompt_tokens=len(prompt_ids),
            requested=request.max_tokens,
            default=self.options.default_max_tokens,
            context_length=backend.context_length,
        )
        sequence = SequenceRequest(
            prompt_ids=tuple(prompt_ids),
            sampling=request.sampling.resolve(backend.sampling_defaults()),
            max_tokens=max_tokens,
            grammar=grammar,
            top_logprobs=request.top_logprobs if request.logprobs else None,
        )
        plan = DecodePlan(sequence, request.stop, self.options.max_decode_seconds)
        started = Started(
            model=self.options.name,
            backend=backend.name,
            prompt_tokens=len(prompt_ids),
            context_length=backend.context_length,
        )
        return started, plan, parser

    def _forced_call(
        self, tools: tuple[Tool, ...], choice: ToolChoice, parser: ToolCallParser
    ) -> Grammar:
        """The grammar of `choice`'s calls, in the convention of this model's template."""
        if parser.shape is None:
            why = (
                "it has no chat template"
                if self._template() is None
                else "its chat template shows tools in a tool-call convention this server "
                "does not read (it reads Hermes <tool_call>, FunctionGemma and Gemma 3 calls)"
            )
            raise NotSupported(
                f"model {self.options.name!r} cannot be made to call a tool: {why}; leave "
                "tool_choice unset, or configure a chat template that teaches a convention "
                "this server reads, or none (the server's default then applies)"
            )
        # Imported when needed: it loads llama.cpp, which an image engine does not use.
        from service.grammar.forced_call import forced_call_grammar

        return forced_call_grammar(parser.shape, tools, choice)

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        backend = self._text
        if request.prompt_token_ids:
            check_token_ids(request.prompt_token_ids, backend.vocab_size, "prompt")
            return list(request.prompt_token_ids)
        if request.prompt is not None:
            return self._tokenize(request.prompt, add_bos=backend.adds_bos)
        tokens = backend.template_tokens
        text = self._render_chat(request.messages, request.tools, tokens)
        # Templates that write the BOS token themselves must not get a second one.
        bos = tokens.get("bos_token", "")
        add_bos = backend.adds_bos and not (bos and text.startswith(bos))
        # What clients wrote stays text: a marker in a message cannot forge a turn.
        return prompt_ids(
            text,
            request.messages,
            lambda messages: self._render_chat(messages, request.tools, tokens),
            backend.control_texts(),
            self._tokenize,
            add_bos=add_bos,
        )

    def _tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        """The library's tokenizer; its failure is this request's (a tokenizer keeps no
        state)."""
        try:
            return self._text.tokenize(text, add_bos=add_bos, special=special)
        except ServiceError:
            raise
        except Exception as exc:
            raise library_failure(
                f"the tokenizer of model {self.options.name!r} failed", exc
            ) from exc

    def _render_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Tool], tokens: dict[str, str]
    ) -> str:
        """The chat template rendered; a template that fails otherwise than by refusing
        (see render_chat) is the model file's fault, and this request's alone.

        A template that teaches no tool convention is given the tools, calls and
        results written into the turns (service.tools.default_convention)."""
        name, template = self.options.name, self._template()
        messages, tools = convention_for_template(template).turns(messages, tools)
        try:
            return render_chat(template, messages, tokens, name, tools)
        except ServiceError:
            raise
        except Exception as exc:
            raise library_failure(f"the chat template of model {name!r} failed", exc) from exc

    def _template(self) -> str | None:
        """The chat template: the operator's for this model, else the model's own."""
        return self.options.chat_template or self._text.chat_template

    def _render(self, request: ImageRequest, received_at: float, sink: ImageSink) -> RenderedImage:
        """The backend's image. The library failing mid-pipeline leaves the model in an
        unknown state: it is discarded."""
        if self._broken is not None:  # a request ahead of this one broke it
            raise Unavailable(f"model {self.options.name!r} is being reloaded; retry")
        if self.scheduler is not None:
            raise NotSupported(f"model {self.options.name!r} generates text; call Generate")
        backend = cast(ImageBackend, self.backend)

        def on_step(step: int, total: int) -> None:
            sink.send(ImageStep(step, total, (time.monotonic() - received_at) * 1000))
            self._publish()

        try:
            return backend.generate(request, on_step, sink.cancelled)
        except (ServiceError, GenerationCancelled):
            raise
        except Exception as exc:
            name = self.options.name
            failure = library_failure(f"model {name!r} failed while generating", exc, RELOADING)
            self._failed(failure.message)
            raise failure from exc

    def _failed(self, why: str) -> None:
        self._broken = why
        self._on_failure(why)


class _Responses:
    """A request's decode events as protobuf messages, tool calls parsed into the last.

    The text itself streams as the model writes it, call blocks included: a call
    is only known to be one once its block is complete.
    """

    def __init__(self, sink: TextSink, tool_parser: ToolCallParser | None) -> None:
        self._sink = sink
        self._parser = tool_parser
        self._text: list[str] = []

    @property
    def cancelled(self) -> Cancellation:
        return self._sink.cancelled

    def send(self, event: DecodeEvent) -> None:
        if self._parser is not None:
            if isinstance(event, Finished):
                event = with_tool_calls(event, self._parser.parse("".join(self._text)))
            else:
                self._text.append(event.text)
        self._sink.send(event.to_pb())

    def close(self, error: BaseException | None = None) -> None:
        self._sink.close(error)
