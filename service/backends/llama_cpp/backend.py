"""The llama.cpp backend (llama-cpp-python) for GGUF files.

Concurrent requests to one model decode together: every scheduler step
evaluates one batch holding the next token of each running sequence and
chunks of the prompts still being read. On the CPU the context's KV cache is
unified by default: its cells are shared by all sequences, each under its own
sequence id, and a finished sequence's tokens stay cached for the next request
that extends them (see `kv_slots`). On a GPU (or with `kv_layout="per-sequence"`)
each sequence has a cache of its own instead: more memory, and attention that no
longer spans every other sequence's cells, which is what keeps throughput rising
with the number of streams.

llama-cpp-python's low-level names change between releases; pyproject pins
the version and tests/test_llama_batching.py exercises each name used here.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp._internals import LlamaContext, LlamaModel

from service.backends.base import ActiveSequence, Sampled, SequenceRequest
from service.backends.batch_sampling import PENALTY_WINDOW, Row
from service.backends.failure import load_refused
from service.backends.llama_cpp import graph_sampling
from service.backends.llama_cpp import log as llama_log  # also routes llama.cpp's log, on import
from service.backends.llama_cpp.batch import Batch, Chunk, StepInterrupted
from service.backends.llama_cpp.graph_sampling import GraphSampling, PlannedRow, RowPath
from service.backends.llama_cpp.kv_slots import Placement, Slot, SlotTable
from service.backends.llama_cpp.logprobs import token_logprob
from service.backends.llama_cpp.own_draws import OwnDraws
from service.backends.llama_cpp.sampling import Logits, SamplerChain, SamplingRefused
from service.backends.llama_cpp.speculation import draft_room, verified_run
from service.backends.names import (
    LLAMA_CPP,
    FlashAttention,
    KvLayout,
    SampleInGraph,
    batch_size_on,
    kv_layout_on,
    sample_in_graph_on,
    top_candidates_in_graph,
)
from service.backends.native.interrupt import StepInterrupt
from service.backends.prompt_lookup import PromptLookup
from service.backends.row_threads import RowThreads
from service.backends.step_plan import Seat, plan_step
from service.errors import BackendFailure
from service.memory import cells_per_sequence
from service.text.plain_content import ControlTexts
from service.text.requests import SamplingDefaults

BACKEND_NAME = LLAMA_CPP

# GGUF keys where a model may state its own sampling defaults, and the
# SamplingDefaults fields they fill.
_SAMPLING_KEYS = {
    "general.sampling.temp": ("temperature", float),
    "general.sampling.top_p": ("top_p", float),
    "general.sampling.top_k": ("top_k", int),
    "general.sampling.min_p": ("min_p", float),
    "general.sampling.penalty_repeat": ("repeat_penalty", float),
}


_FLASH_ATTENTION = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


@dataclass(frozen=True)
class LlamaCppOptions:
    context_size: int
    threads: int
    gpu_layers: int = -1
    main_gpu: int = 0
    flash_attention: FlashAttention = "auto"
    # "unified": one pool of cells shared by every sequence, `context_size` in all;
    # "per-sequence": `context_size` cells for each sequence, running or cached;
    # "auto": per-sequence on a GPU, unified on the CPU (see `kv_layout_on`).
    kv_layout: KvLayout = "auto"
    # The most tokens one step evaluates (llama.cpp's n_batch and n_ubatch). None:
    # chosen by where the model computes (see `batch_size_on`).
    batch_size: int | None = None
    # Sequences decoded together in one step.
    max_sequences: int = 8
    # Finished conversations kept in the cache beside the running ones.
    cached_sequences: int = 4
    # While other sequences decode, the most prompt tokens a step evaluates, so
    # that a long newcomer prompt does not stall their streams. None: chosen by
    # where the model computes (see `prefill_chunk_for`).
    prefill_chunk: int | None = None
    # Draws inside llama.cpp's graph (see graph_sampling); "auto": on a GPU.
    sample_in_graph: SampleInGraph = "auto"
    # Prompt-lookup guesses a greedy sequence verifies per step (see speculation); 0: off.
    # Host-drawn rows only: not with in-graph sampling, logprobs or a grammar.
    draft_tokens: int = 0


# On a CPU a step's time grows with every token in it: 128 prompt tokens add a few
# decode steps' worth to each stream's next token, and a 150-token prompt still
# goes in over two steps.
CPU_PREFILL_CHUNK = 128


def prefill_chunk_for(options: LlamaCppOptions, computes_off_cpu: bool) -> int:
    """The prompt tokens a step may hold beside decoding streams.

    On a GPU a step of a few hundred tokens costs little more than one of a few:
    the whole batch goes to waiting prompts, so a burst of 128 requests is read
    in as few steps as llama.cpp's own batched loop takes, rather than 128 tokens
    a step while the first ones decode (TTFT of seconds at the back of the queue).
    """
    if options.prefill_chunk is not None:
        return options.prefill_chunk
    if not computes_off_cpu:
        return CPU_PREFILL_CHUNK
    return batch_size_on(options.batch_size, on_gpu=True)


def _computes_off_cpu(options: LlamaCppOptions) -> bool:
    return options.gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload())


def _load_model(path: Path, options: LlamaCppOptions) -> LlamaModel:
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = options.gpu_layers
    params.main_gpu = options.main_gpu
    with llama_log.recorded_native_errors() as errors:
        try:
            return LlamaModel(path_model=str(path), params=params, verbose=False)
        except ValueError as exc:  # llama-cpp-python's way of saying "load failed"
            # The file is what llama.cpp refused (admission checks what it can
            # beforehand): the caller's model, so FAILED_PRECONDITION, in llama.cpp's
            # own words ("key ... has wrong type f64 but expected type u32"), not
            # llama-cpp-python's, which only repeat the server's path.
            # The first error line, less the name of the function that logged it.
            reason = re.sub(r"^\w+: ", "", errors[0]) if errors else "it refused the file"
            raise load_refused("llama.cpp", path, reason) from exc


def _new_context(
    model: LlamaModel,
    options: LlamaCppOptions,
    size: int,
    batch_size: int,
    graph: GraphSampling | None = None,
) -> LlamaContext:
    params = llama_cpp.llama_context_default_params()
    params.n_seq_max = options.max_sequences + options.cached_sequences
    # Unified: one pool of cells for every sequence, whose prefixes share cells.
    # Per-sequence: llama.cpp splits n_ctx evenly, in multiples of 256 cells.
    params.kv_unified = options.kv_layout == "unified"
    params.n_ctx = size if params.kv_unified else cells_per_sequence(size) * params.n_seq_max
    params.n_batch = params.n_ubatch = batch_size
    params.n_threads = params.n_threads_batch = options.threads
    params.flash_attn_type = _FLASH_ATTENTION[options.flash_attention]
    # Keep sliding-window layers' full history, so a cached prefix can be trimmed.
    params.swa_full = True
    if graph is not None:  # a sampler per sequence id, given once, here
        graph.attach(params)
    # A unified pool may hold more cells than the model's trained window, which
    # llama.cpp warns about; no one sequence may (see LlamaCppBackend.context_length).
    try:
        with llama_log.expected_native_warnings("possible training context overflow"):
            return LlamaContext(model=model, params=params, verbose=False)
    except ValueError as exc:
        raise BackendFailure(f"llama.cpp could not create a context: {exc}") from exc


@dataclass(eq=False)
class LlamaSequence:
    slot: Slot
    sampler: SamplerChain
    cached_prompt_tokens: int
    # Tokens to evaluate next: what is left of the prompt, then the last sample.
    pending: list[int]
    top_logprobs: int | None = None
    decoding: bool = False
    # With in-graph sampling, where its draws happen (see graph_sampling).
    mode: int = graph_sampling.HOST
    # Its history, for drafting guesses (see speculation); None: it does not speculate.
    lookup: PromptLookup | None = None
    # This step's guesses, evaluated after its pending token.
    drafts: list[int] = field(default_factory=list)


def _graph_sampling(options: LlamaCppOptions, off_cpu: bool) -> GraphSampling | None:
    """The in-graph samplers, when the setting and the build allow them."""
    if not sample_in_graph_on(options.sample_in_graph, off_cpu):
        return None
    if not GraphSampling.available():
        if options.sample_in_graph == "on":
            raise BackendFailure(
                "--sample-in-graph on, but service/backends/native/graph_sampler.c was not "
                "built: run `python -m service.backends.native.build_graph_sampler`"
            )
        return None
    return GraphSampling(
        options.max_sequences + options.cached_sequences,
        top_candidates=top_candidates_in_graph(options.sample_in_graph),
    )


class LlamaCppBackend:
    """One GGUF model loaded with llama.cpp. Not thread-safe: one worker owns it."""

    def __init__(self, path: Path, options: LlamaCppOptions) -> None:
        off_cpu = _computes_off_cpu(options)
        options = replace(options, kv_layout=kv_layout_on(options.kv_layout, off_cpu))
        self._options = options
        self._model = _load_model(path, options)
        # A sequence longer than the model was trained for gives garbage, so each
        # sequence's window is capped by it. A unified cache's pool is not: it is
        # shared, and many streams of a small-window model need more cells in all.
        self._trained = max(self._model.n_ctx_train(), 0)
        size = options.context_size
        if options.kv_layout == "per-sequence":
            size = self._within_training(size)
        batch_size = batch_size_on(options.batch_size, off_cpu)
        self._graph = _graph_sampling(options, off_cpu)
        self._context = _new_context(self._model, options, size, batch_size, self._graph)
        self._memory = llama_cpp.llama_get_memory(self._context.ctx)
        # Stops a step on the CPU mid-pass when the scheduler no longer wants it.
        self._interrupt = StepInterrupt()
        self._interrupt.install(self._context.ctx)
        self._vocab = self._model.vocab
        self._n_vocab = self._model.n_vocab()
        self._control_texts: ControlTexts | None = None
        self._metadata: dict[str, str] = self._model.metadata()
        self._slots = SlotTable(
            slots=llama_cpp.llama_n_seq_max(self._context.ctx),
            capacity=int(llama_cpp.llama_n_ctx_seq(self._context.ctx)),
            keep_idle=options.cached_sequences,
            shared=options.kv_layout == "unified",
            # Parking (see kv_slots) pays on the CPU, where each cached cell widens
            # every step's attention. On a GPU that costs little and a park costs
            # much: the state copy goes range by range, and a conversation decoded
            # beside others has its cells interleaved with theirs, so one park is
            # hundreds of small device-to-host copies on the model's thread.
            keep_live=options.cached_sequences if self.computes_off_cpu else 1,
        )
        # llama.cpp caps a step at the context's cells (never fewer than a step can hold).
        self._batch = Batch(int(llama_cpp.llama_n_batch(self._context.ctx)))
        self._prefill_chunk = prefill_chunk_for(options, self.computes_off_cpu)
        # Runs the scheduler's between-steps work during a GPU's forward pass.
        self._beside = ThreadPoolExecutor(1, thread_name_prefix="beside-forward")
        self._rows = RowThreads(options.threads)
        # Cells of parked finished sequences, by sequence id (see kv_slots).
        self._parked: dict[int, ctypes.Array[ctypes.c_uint8]] = {}
        # token_bytes runs on the own-draw threads too (for logprobs): a buffer each.
        self._pieces = threading.local()
        self._own_draws: OwnDraws[LlamaSequence] = OwnDraws()
        self._closed = threading.Event()
        # A recurrent state cannot drop rejected guesses; in-graph rows are planned
        # one output a sequence.
        model = self._model.model
        rolls_back = not (
            llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        )
        self._draft_tokens = options.draft_tokens if self._graph is None and rolls_back else 0
        # False for a step whose verified guesses put rows between the others' outputs.
        self._rows_in_batch_order = True

    @property
    def name(self) -> str:
        return BACKEND_NAME

    @property
    def context_length(self) -> int:
        """The most tokens one sequence may hold."""
        return self._within_training(int(llama_cpp.llama_n_ctx_seq(self._context.ctx)))

    def _within_training(self, tokens: int) -> int:
        return min(tokens, self._trained) if self._trained else tokens

    @property
    def max_sequences(self) -> int:
        return self._options.max_sequences

    @property
    def computes_off_cpu(self) -> bool:
        return _computes_off_cpu(self._options)

    @property
    def chat_template(self) -> str | None:
        return self._metadata.get("tokenizer.chat_template")

    @property
    def template_tokens(self) -> dict[str, str]:
        return {
            "bos_token": self._token_text(self._model.token_bos()),
            "eos_token": self._token_text(self._model.token_eos()),
        }

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    def sampling_defaults(self) -> SamplingDefaults:
        found: dict[str, Any] = {}
        for key, (field_name, convert) in _SAMPLING_KEYS.items():
            if key in self._metadata:
                found[field_name] = convert(self._metadata[key])
        return SamplingDefaults(**found)

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        ids = self._model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        return [int(token) for token in ids]

    def control_texts(self) -> ControlTexts:
        """The texts llama.cpp parses as tokens only with `special`: control and unknown
        tokens (user-defined ones, such as Gemma's HTML tags, are matched in plain text
        too), read from the vocabulary once."""
        if self._control_texts is None:
            special = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
            self._control_texts = ControlTexts(
                self._token_text(token)
                for token in range(self._n_vocab)
                if llama_cpp.llama_vocab_get_attr(self._vocab, token) & special
            )
        return self._control_texts

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    def detokenize(self, token_ids: Sequence[int]) -> str:
        tokens = (llama_cpp.llama_token * len(token_ids))(*token_ids)
        size = 4 * len(token_ids) + 16
        for _ in range(2):  # a second time with the size llama.cpp asked for
            text = ctypes.create_string_buffer(size)
            written = llama_cpp.llama_detokenize(
                self._vocab, tokens, len(token_ids), text, size, False, True
            )
            if written >= 0:
                return text.raw[:written].decode("utf-8", errors="replace")
            size = -written
        raise RuntimeError("llama_detokenize wanted more room than it said")

    def token_bytes(self, token_id: int) -> bytes:
        buffer = getattr(self._pieces, "buffer", None)
        if buffer is None:
            buffer = self._pieces.buffer = ctypes.create_string_buffer(256)
        size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, len(buffer), 0, False)
        if size < 0:  # the buffer is too small for this piece
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, -size, 0, False)
        return buffer.raw[:size]

    # --- batched decoding -----------------------------------------------------------

    def start(self, request: SequenceRequest) -> LlamaSequence | None:
        prompt = request.prompt_ids
        placement = self._slots.place(prompt, request.max_tokens)
        if placement is None:
            return None
        # Built first: a grammar this vocabulary cannot satisfy refuses the request.
        sampler = SamplerChain(request.sampling, prompt, self._vocab, request.grammar)
        placement = self._arrange_cache(placement)
        self._slots.occupy(placement, len(prompt), request.max_tokens)
        if placement.moves and placement.copy_from is not None:
            self._forget(placement.copy_from)
        logprobs = request.top_logprobs is not None
        path = RowPath(sampler.plain_greedy, sampler.batched, request.sampling, logprobs)
        speculates = self._draft_tokens and sampler.plain_greedy and not logprobs
        return LlamaSequence(
            slot=placement.slot,
            sampler=sampler,
            cached_prompt_tokens=placement.reuse,
            pending=list(prompt[placement.reuse :]),
            top_logprobs=request.top_logprobs,
            mode=self._graph.mode(path) if self._graph is not None else graph_sampling.HOST,
            lookup=PromptLookup(prompt) if speculates else None,
        )

    def step(
        self, sequences: Sequence[ActiveSequence], before_compute: Callable[[], None]
    ) -> list[Sampled | None]:
        if self._closed.is_set():
            raise RuntimeError("this llama.cpp model was closed")
        own = [_own(sequence) for sequence in sequences]
        sampled = self._collect_own_draws(own)
        # In sequence id order: with per-sequence caches llama.cpp evaluates each run
        # of consecutive ids in a forward pass of its own.
        chunks = sorted(self._plan_step(own).items(), key=lambda item: item[1].seq_id)
        if not chunks:  # every sequence waits for a draw of its own
            before_compute()  # what earlier steps made goes out meanwhile
            if not sampled:
                self._own_draws.wait_for_any(own)
                sampled = self._collect_own_draws(own)
            return [sampled.get(sequence) for sequence in own]
        self._batch.fill([chunk for _, chunk in chunks])
        if self._graph is not None:
            # A ROW row's draw is made in the graph: its numbers are counted now.
            row_draws = [
                (chunk.seq_id, _draw_of(sequence))
                for sequence, chunk in chunks
                if chunk.wants_logits and sequence.mode == graph_sampling.ROW
            ]
            self._graph.plan(
                self._context.ctx,
                [
                    PlannedRow(chunk.seq_id, len(chunk.tokens), chunk.wants_logits, sequence.mode)
                    for sequence, chunk in chunks
                ],
                row_draws,
            )
        started = time.perf_counter()
        try:
            outputs = self._decode_beside(before_compute)
        except StepInterrupted:
            self._undo_interrupted(chunks)
            return [sampled.get(sequence) for sequence in own]
        decoded = time.perf_counter()
        ready: list[tuple[LlamaSequence, int]] = []
        verifying: list[tuple[LlamaSequence, Chunk, int]] = []
        for (sequence, chunk), output in zip(chunks, outputs, strict=True):
            sequence.slot.tokens.extend(chunk.tokens)
            del sequence.pending[: len(chunk.tokens)]
            if chunk.every_output:
                verifying.append((sequence, chunk, output))
            elif output >= 0:
                ready.append((sequence, output))
        self._rows_in_batch_order = not verifying
        for sequence, chunk, last in verifying:
            sampled[sequence] = self._verified(sequence, chunk, last)
        drawing = self._start_own_draws(ready)
        chosen = self._greedy_tokens(ready) | self._batched_tokens(ready)
        for sequence, output in ready:
            if sequence in chosen:
                sampled[sequence] = self._sampled(sequence, chosen[sequence], output)
        # An own draw may hold the step up by its share of the forward pass, no more.
        share = (decoded - started) / len(chunks)
        self._own_draws.wait(drawing, decoded + share - time.perf_counter())
        # One token a step each: a sequence that got a late draw's token at the start of
        # this step (and evaluated it) has the draw it started since collected by the
        # next step. Collected now as well, it would replace that token, which the cache
        # holds and the caller would never see: a word missing from the text, and
        # a cache a cell fuller than the tokens counted, which overflows at the
        # window's end.
        sampled |= self._collect_own_draws([s for s in own if s not in sampled])
        return [sampled.get(sequence) for sequence in own]

    def interrupt_step(self, interrupted: bool) -> None:
        self._interrupt.set(interrupted)

    def _undo_interrupted(self, chunks: list[tuple[LlamaSequence, Chunk]]) -> None:
        """Drop what an interrupted step left in the cache (the micro-batches before the
        one it stopped in), so each slot's cells are again its tokens; a state that
        cannot drop part of a sequence (a recurrent one) is dropped whole."""
        for sequence, chunk in chunks:
            if not llama_cpp.llama_memory_seq_rm(self._memory, chunk.seq_id, chunk.start, -1):
                self._forget(sequence.slot)

    def _decode_beside(self, work: Callable[[], None]) -> list[int]:
        """The forward pass, with `work` done meanwhile: on another thread while a
        GPU computes (the decode call lets go of the GIL), else first, here, where
        it would take the CPU from the forward pass."""
        if not self.computes_off_cpu:
            work()
            return self._batch.decode(self._context.ctx)
        beside = self._beside.submit(work)
        try:
            return self._batch.decode(self._context.ctx)
        finally:
            beside.result()

    def _start_own_draws(self, ready: list[tuple[LlamaSequence, int]]) -> list[LlamaSequence]:
        """Start the draws of the sequences with a sampler of their own (see own_draws),
        on copies of their logits; those sequences."""
        started = []
        for sequence, output in ready:
            if sequence.sampler.plain_greedy or sequence.sampler.batched:
                continue
            logits = self._row_logits(output).copy()
            recent = sequence.slot.tokens[-PENALTY_WINDOW:]
            self._own_draws.start(sequence, partial(self._own_draw, sequence, logits, recent))
            started.append(sequence)
        return started

    def _own_draw(self, sequence: LlamaSequence, logits: Logits, recent: list[int]) -> Sampled:
        """One sequence's draw by its own sampler, on an own-draw thread."""
        try:
            token = sequence.sampler.sample(logits, recent)
        except SamplingRefused as refusal:
            return Sampled(-1, refused=refusal)
        if sequence.top_logprobs is None:
            return Sampled(token)
        return Sampled(token, token_logprob(logits, token, sequence.top_logprobs, self.token_bytes))

    def _collect_own_draws(self, own: list[LlamaSequence]) -> dict[LlamaSequence, Sampled]:
        """These sequences' own draws that are done; they decode the token next."""
        done = self._own_draws.collect(own)
        for sequence, sampled in done.items():
            if sampled.refused is None:
                sequence.pending, sequence.decoding = [sampled.token], True
        return done

    def _greedy_tokens(self, ready: list[tuple[LlamaSequence, int]]) -> dict[LlamaSequence, int]:
        """The argmax of every plain-greedy sequence's logits, in one numpy call.

        With dozens of sequences a step, one call per sequence is what limits a GPU.
        """
        rows = [row for row, (sequence, _) in enumerate(ready) if sequence.sampler.plain_greedy]
        if not rows:
            return {}
        if self._graph is not None:
            return {ready[row][0]: self._graph_greedy(*ready[row]) for row in rows}
        logits = self._ready_logits(ready)
        if len(rows) == len(ready):
            tokens = self._rows.argmax(logits)
        else:  # row views: indexing with the list would copy every row first
            tokens = [int(np.argmax(logits[row])) for row in rows]
        return {ready[row][0]: int(token) for row, token in zip(rows, tokens, strict=True)}

    def _batched_tokens(self, ready: list[tuple[LlamaSequence, int]]) -> dict[LlamaSequence, int]:
        """The draws of every sequence that samples with the common settings, for the
        whole step at once (service.backends.batch_sampling)."""
        rows = [row for row, (sequence, _) in enumerate(ready) if sequence.sampler.batched]
        if not rows:
            return {}
        if self._graph is not None:
            return self._graph_batched([ready[row] for row in rows])
        logits = self._ready_logits(ready)
        if len(rows) < len(ready):
            logits = logits[rows]
        draws = [_draw_of(ready[row][0]) for row in rows]
        tokens = self._rows.sample(logits, draws)
        return {ready[row][0]: token for row, token in zip(rows, tokens, strict=True)}

    def _graph_greedy(self, sequence: LlamaSequence, output: int) -> int:
        """A greedy row's token with in-graph sampling: the graph's argmax, or (a row
        that wants logprobs) the argmax of its logits."""
        if sequence.mode == graph_sampling.GREEDY:
            return graph_sampling.sampled_token(self._context.ctx, output)
        return int(np.argmax(self._row_logits(output)))

    def _graph_batched(self, ready: list[tuple[LlamaSequence, int]]) -> dict[LlamaSequence, int]:
        """The batched rows' draws with in-graph sampling: the graph's own (ROW rows,
        whose draws `step` counted before the decode), from the graph's candidates (TOP
        rows), else from each row's logits, all with the batched sampler's rules."""
        whole = [(sequence, out) for sequence, out in ready if sequence.mode == graph_sampling.ROW]
        top = [(sequence, out) for sequence, out in ready if sequence.mode == graph_sampling.TOP]
        rest = [(sequence, out) for sequence, out in ready if sequence.mode == graph_sampling.HOST]
        context = self._context.ctx
        chosen = {sequence: graph_sampling.sampled_token(context, out) for sequence, out in whole}
        if top:
            draws = [_draw_of(sequence) for sequence, _ in top]
            outputs = [output for _, output in top]
            tokens = graph_sampling.top_draws(self._context.ctx, outputs, draws)
            chosen |= {sequence: token for (sequence, _), token in zip(top, tokens, strict=True)}
        if rest:
            logits = np.stack([self._row_logits(output) for _, output in rest])
            tokens = self._rows.sample(logits, [_draw_of(sequence) for sequence, _ in rest])
            chosen |= {sequence: token for (sequence, _), token in zip(rest, tokens, strict=True)}
        return chosen

    def _row_logits(self, output: int) -> npt.NDArray[np.float32]:
        """One output's logits, viewed in llama.cpp's buffer: with in-graph sampling,
        where llama.cpp copies the rows the graph does not sample."""
        if self._graph is not None:
            return graph_sampling.row_logits(self._context.ctx, output, self._n_vocab)
        pointer = llama_cpp.llama_get_logits_ith(self._context.ctx, output)
        return np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))

    def _ready_logits(self, ready: list[tuple[LlamaSequence, int]]) -> npt.NDArray[np.float32]:
        """The logits of the `ready` rows, in their order: viewed in llama.cpp's buffer,
        not copied, when they are all of this step's outputs in batch order; copied
        together when verified guesses added rows between them."""
        if not self._rows_in_batch_order:
            return np.stack([self._row_logits(output) for _, output in ready])
        pointer = llama_cpp.llama_get_logits(self._context.ctx)
        return np.ctypeslib.as_array(pointer, shape=(len(ready), self._n_vocab))

    def _verified(self, sequence: LlamaSequence, chunk: Chunk, last: int) -> Sampled:
        """A speculating sequence's run: its guesses the model agreed with and the
        model's token after them (see speculation); the rejected guesses' cells go."""
        first = last - len(chunk.tokens) + 1
        model_tokens = [int(np.argmax(self._row_logits(row))) for row in range(first, last + 1)]
        run = verified_run(sequence.drafts, model_tokens)
        assert sequence.lookup is not None
        sequence.lookup.verified(len(sequence.drafts), len(run) - 1)
        kept = chunk.start + len(run)  # the pending token and the guesses that held
        if kept < chunk.start + len(chunk.tokens):
            llama_cpp.llama_memory_seq_rm(self._memory, chunk.seq_id, kept, -1)
            del sequence.slot.tokens[kept:]
        sequence.drafts = []
        sequence.pending, sequence.decoding = [run[-1]], True
        return Sampled(run[0], more=tuple(Sampled(token) for token in run[1:]))

    def _sampled(self, sequence: LlamaSequence, token: int, output: int) -> Sampled:
        """A token drawn for the whole step, with its logprobs when asked for (from the
        raw logits, which sampling leaves as they are)."""
        sequence.pending, sequence.decoding = [token], True
        if sequence.top_logprobs is None:
            return Sampled(token, in_graph=sequence.mode != graph_sampling.HOST)
        logits = self._row_logits(output)
        return Sampled(token, token_logprob(logits, token, sequence.top_logprobs, self.token_bytes))

    def finish(self, sequence: ActiveSequence) -> None:
        own = _own(sequence)
        self._own_draws.settle(own)
        own.sampler.close()
        if self._closed.is_set():
            return  # the cache went with the context
        retention = self._slots.release(own.slot)
        for slot in retention.drop:
            self._forget(slot)
        for slot in retention.park:
            self._park(slot)
        for source, target in retention.move:
            self._copy_whole(source, target)
            llama_cpp.llama_memory_seq_rm(self._memory, source.seq_id, -1, -1)
            self._slots.moved(source, target)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._own_draws.close()
            self._beside.shutdown(wait=False)
            self._rows.close()
            self._batch.close()
            self._context.close()
            if self._graph is not None:  # its samplers outlive the context, never the reverse
                self._graph.close()
            self._model.close()

    def _plan_step(self, sequences: list[LlamaSequence]) -> dict[LlamaSequence, Chunk]:
        """This step's chunk per sequence, as `service.decode.step_plan` decides it."""
        seats = [Seat(_evaluable(s), s.decoding, self._own_draws.running(s)) for s in sequences]
        takes = plan_step(seats, self._batch.capacity, self._prefill_chunk)
        room = self._batch.capacity - sum(takes)
        chunks = {}
        for sequence, take in zip(sequences, takes, strict=True):
            if not take:
                continue
            tokens = sequence.pending[:take]
            sequence.drafts = []  # an interrupted step's guesses were never verified
            if sequence.lookup is not None and sequence.decoding and room > 0:
                held = len(sequence.slot.tokens)
                _catch_up(sequence.lookup, sequence.slot.tokens, sequence.pending)
                wanted = min(self._draft_tokens, room)
                sequence.drafts = sequence.lookup.draft(
                    draft_room(held, sequence.slot.reserved, wanted)
                )
                room -= len(sequence.drafts)
                tokens = tokens + sequence.drafts
            chunks[sequence] = Chunk(
                seq_id=sequence.slot.seq_id,
                start=len(sequence.slot.tokens),
                tokens=tokens,
                wants_logits=take == len(sequence.pending),
                every_output=bool(sequence.drafts),
            )
        return chunks

    def _arrange_cache(self, placement: Placement) -> Placement:
        """Carry out a placement on the KV cache; the placement as it turned out."""
        slot = placement.slot
        for victim in placement.evict:
            self._forget(victim)
        if slot.parked and not (placement.keep and self._unpark(slot, slot)):
            self._forget(slot)
            placement = replace(placement, keep=0)
        if not llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, placement.keep, -1):
            # This cache cannot drop a partial sequence (a recurrent state): start over.
            llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
            return replace(placement, keep=0, copy_from=None, reuse=0)
        source = placement.copy_from
        if source is not None and not self._copy_prefix(source, slot, placement.reuse):
            return replace(placement, copy_from=None, reuse=0)
        return placement

    def _copy_prefix(self, source: Slot, target: Slot, length: int) -> bool:
        """Give the (empty) target the first `length` cached tokens of the source."""
        if self._slots.shared and not source.parked:  # shared cells, not a copy
            llama_cpp.llama_memory_seq_cp(self._memory, source.seq_id, target.seq_id, 0, length)
            return True
        if source.parked:
            if not self._unpark(source, target):
                return False
        else:
            self._copy_whole(source, target)
        llama_cpp.llama_memory_seq_rm(self._memory, target.seq_id, length, -1)
        return True

    def _copy_whole(self, source: Slot, target: Slot) -> None:
        """Copy a sequence's cache to an empty one; between per-sequence caches llama.cpp
        copies only whole ones (a part aborts the process), at its next decode."""
        llama_cpp.llama_memory_seq_cp(self._memory, source.seq_id, target.seq_id, -1, -1)

    def _park(self, slot: Slot) -> None:
        """Copy a finished sequence's cells to host memory and free them."""
        context, seq_id = self._context.ctx, slot.seq_id
        size = llama_cpp.llama_state_seq_get_size(context, seq_id)
        state = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(context, state, size, seq_id) != size:
            self._forget(slot)
            return
        self._parked[seq_id] = state
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        slot.parked = True

    def _unpark(self, source: Slot, target: Slot) -> bool:
        """Copy a parked sequence's cells back, under the target's sequence id."""
        state = self._parked[source.seq_id]
        context = self._context.ctx
        restored = llama_cpp.llama_state_seq_set_data(context, state, len(state), target.seq_id)
        if source is target:
            del self._parked[source.seq_id]
            source.parked = False
        return bool(restored)

    def _forget(self, slot: Slot) -> None:
        if slot.parked:
            self._parked.pop(slot.seq_id, None)
        else:
            llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
        slot.tokens.clear()
        slot.parked = False

    def _token_text(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        return bytes(llama_cpp.llama_vocab_get_text(self._vocab, token_id)).decode(
            "utf-8", errors="replace"
        )


def _evaluable(sequence: LlamaSequence) -> int:
    """Its pending tokens that fit the cells its slot reserved (prompt and max_tokens).

    A sequence may be stepped once more after its last token (with a GPU the scheduler
    learns that it is done during the next forward pass, see `service.decode.scheduler`),
    and a token drawn late is evaluated in the step that returns it: that extra token
    would need a cell past the reservation, which at the window's end does not exist
    (llama_decode fails, and the model is discarded). It was never needed: it sits out.
    """
    reserved = sequence.slot.reserved
    if reserved is None:
        return len(sequence.pending)
    return max(min(len(sequence.pending), reserved - len(sequence.slot.tokens)), 0)


def _catch_up(lookup: PromptLookup, held: list[int], pending: list[int]) -> None:
    """Give the lookup what its sequence added since: its history is the cache's tokens
    (position 0 on) and the one it evaluates now, so rejected guesses never enter it.
    Only the new tokens are read, not the whole history each step."""
    known = len(lookup)
    if known < len(held):
        lookup.extend(held[known:])
    lookup.extend(pending[max(known - len(held), 0) :])


def _draw_of(sequence: LlamaSequence) -> Row:
    """The batched sampler's view of a sequence's next draw (and counts it)."""
    return sequence.sampler.next_draw(sequence.slot.tokens)


def _own(sequence: ActiveSequence) -> LlamaSequence:
    assert isinstance(sequence, LlamaSequence), "a sequence started by another backend"
    return sequence
