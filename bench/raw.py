"""The raw library side of the benchmark: llama-cpp-python called directly.

Nothing here uses the service's code, so the comparison measures what the
service adds (or saves) against what a user would write by hand.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

from bench.server import Run, rate
from service.memory import cells_per_sequence


@llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet(level: int, text: bytes, user_data: object) -> None:
    """llama.cpp's notes about each context it creates would bury the report."""


llama_cpp.llama_log_set(_quiet, None)


def open_llama(path: Path, context_size: int, threads: int, gpu_layers: int) -> Llama:
    return Llama(
        str(path),
        n_ctx=context_size,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=gpu_layers,
        # The service leaves flash attention to llama.cpp ("auto"), which turns it
        # on for these models on the CPU and on CUDA; the raw side does the same.
        flash_attn=True,
        verbose=False,
    )


def is_end(llama: Llama, token: int) -> bool:
    return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llama.model), token))


def single_run(llama: Llama, prompt: str, max_tokens: int) -> Run:
    """One greedy generation from a cold cache, timed like a client times the service."""
    start = time.perf_counter()
    ids = llama.tokenize(prompt.encode(), add_bos=True, special=True)
    llama.reset()
    first = last = start
    count = 0
    for token in llama.generate(ids, temp=0.0, reset=False):
        last = time.perf_counter()
        if count == 0:
            first = last
        count += 1
        if count >= max_tokens or is_end(llama, token):
            break
    return Run((first - start) * 1000, rate(count, first, last), count)


def suffix_ttft_ms(llama: Llama, cached: Sequence[int], suffix: Sequence[int]) -> float:
    """Time to the first token when `cached` is already evaluated: the suffix alone."""
    llama.reset()
    llama.eval(list(cached))
    start = time.perf_counter()
    llama.eval(list(suffix))
    llama.sample(temp=0.0)
    return (time.perf_counter() - start) * 1000


def batched_tps(
    llama: Llama,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    threads: int,
    unified: bool = True,
    sample: bool = True,
) -> float:
    """Aggregate tokens/s of greedy decoding of every prompt in one llama.cpp batch.

    The hand-written loop a user would write with the low-level API: each
    prompt evaluated in turn, then one llama_decode per step for all of them,
    and the step's tokens taken with one numpy argmax over all its logits
    (a sampler call per sequence copies the whole vocabulary each time).
    Timed from start to the last token, prefill included, as the service is.
    `unified`: one KV cache for all the sequences, else one each. Without `sample`
    the logits are never read and each step decodes the last tokens again, as
    llama-batched-bench does: the loop that need not wait for a step to end
    before queueing the next, which no server that samples can be.
    """
    count = len(prompts)
    params = llama_cpp.llama_context_default_params()
    if unified:
        params.n_ctx = sum(len(p) for p in prompts) + count * max_tokens + 16
    else:  # llama.cpp splits n_ctx evenly, 256 cells at a time
        longest = max(len(p) for p in prompts) + max_tokens
        params.n_ctx = count * cells_per_sequence(longest)
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = count
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = unified
    context = llama_cpp.llama_init_from_model(llama.model, params)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    sampler = llama_cpp.llama_sampler_init_greedy()
    try:
        start = time.perf_counter()
        last = [
            _prefill(context, batch, sampler, seq, list(ids)) for seq, ids in enumerate(prompts)
        ]
        positions = [len(ids) for ids in prompts]
        vocab = llama.n_vocab()
        for _ in range(max_tokens - 1):
            _fill(batch, [(last[s], positions[s], s, True) for s in range(count)])
            if llama_cpp.llama_decode(context, batch) != 0:
                raise RuntimeError("llama_decode failed")
            if sample:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(context), (count, vocab))
                last = np.argmax(logits, axis=1).tolist()
            positions = [p + 1 for p in positions]
        llama_cpp.llama_synchronize(context)
        return count * max_tokens / (time.perf_counter() - start)
    finally:
        llama_cpp.llama_sampler_free(sampler)
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(context)


def _prefill(
    context: llama_cpp.llama_context_p,
    batch: llama_cpp.llama_batch,
    sampler: llama_cpp.llama_sampler_p,
    seq: int,
    ids: list[int],
) -> int:
    for begin in range(0, len(ids), 512):
        chunk = ids[begin : begin + 512]
        last = begin + len(chunk) == len(ids)
        _fill(
            batch, [(t, begin + i, seq, last and i == len(chunk) - 1) for i, t in enumerate(chunk)]
        )
        if llama_cpp.llama_decode(context, batch) != 0:
            raise RuntimeError("llama_decode failed")
    return int(llama_cpp.llama_sampler_sample(sampler, context, batch.n_tokens - 1))


def _fill(batch: llama_cpp.llama_batch, entries: list[tuple[int, int, int, bool]]) -> None:
    batch.n_tokens = len(entries)
    for index, (token, position, seq, logits) in enumerate(entries):
        batch.token[index] = token
        batch.pos[index] = position  # type: ignore[call-overload]
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = seq
        batch.logits[index] = logits
