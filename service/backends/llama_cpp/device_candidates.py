"""Each sequence's best logits found on the GPU, so that only they cross to the host.

Without this, every step copies every output's whole row of logits from the
device (128 streams of a 128k-token model: 64 MB a step) and the host then
searches each row for its best few (service.backends.batch_sampling). llama.cpp
can instead run a sampler inside the step's own graph ("backend sampling"):
here a top-k of width `width` per sequence, after which llama.cpp copies back
only those candidates, ids and logits, and skips the full rows altogether.
The batched sampler then draws from the candidates as it would have from the
host's own search: the same `width` best logits, so the same distribution.

Backend samplers are attached per sequence id, once, when the context is made:
attaching or removing one later makes llama.cpp rebuild its compute graphs.
A request that needs its whole row (a grammar, logprobs, a wider top-k than
`width`) has its sequence's sampler removed while it runs; llama.cpp then
copies every output's full row for those steps, as it did before.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float32]


class DeviceCandidates:
    """A top-`width` backend sampler for each of a context's sequence ids."""

    def __init__(self, width: int, sequences: int) -> None:
        self.width = width
        self._chains = [_top_k_chain(width) for _ in range(sequences)]
        self._configs = (llama_cpp.llama_sampler_seq_config * sequences)(
            *(
                llama_cpp.llama_sampler_seq_config(seq_id, ctypes.cast(chain, ctypes.c_void_p))
                for seq_id, chain in enumerate(self._chains)
            )
        )
        self._detached: set[int] = set()
        self._retired: list[llama_cpp.llama_sampler_p] = []

    def attach_at_creation(self, params: llama_cpp.llama_context_params) -> None:
        """Name the samplers in a context's parameters (the chains outlive the context)."""
        config = llama_cpp.llama_sampler_seq_config
        params.samplers = ctypes.cast(self._configs, ctypes.POINTER(config))
        params.n_samplers = len(self._chains)
        params.n_outputs_max_per_seq = 1  # one token sampled per sequence and step

    def need_full_rows(self, context: llama_cpp.llama_context_p, seq_id: int) -> None:
        """Have llama.cpp copy this sequence's whole rows until `restore`."""
        if seq_id not in self._detached:
            llama_cpp.llama_set_sampler(context, seq_id, None)
            self._detached.add(seq_id)

    def restore(self, context: llama_cpp.llama_context_p, seq_id: int) -> None:
        if seq_id in self._detached:
            # A chain is set up for the device once in its life: a new one. The
            # old one goes once a decode has rebuilt the graph that named it.
            self._retired.append(self._chains[seq_id])
            self._chains[seq_id] = _top_k_chain(self.width)
            llama_cpp.llama_set_sampler(context, seq_id, self._chains[seq_id])
            self._detached.discard(seq_id)

    def decoded(self) -> None:
        """A decode ran: no graph of llama.cpp's names a retired chain any more."""
        for chain in self._retired:
            llama_cpp.llama_sampler_free(chain)
        self._retired.clear()

    def on_device(self, seq_id: int) -> bool:
        return seq_id not in self._detached

    def read(self, context: llama_cpp.llama_context_p, outputs: list[int]) -> tuple[Ints, Floats]:
        """The candidates (ids, logits; a row per output, in no order) of these
        outputs, whose sequences all have their sampler attached."""
        ids = np.empty((len(outputs), self.width), dtype=np.int64)
        values = np.empty((len(outputs), self.width), dtype=np.float32)
        for row, output in enumerate(outputs):
            count = llama_cpp.llama_get_sampled_candidates_count_ith(context, output)
            if count != self.width:
                raise RuntimeError(f"llama.cpp sampled {count} candidates, not {self.width}")
            ids[row] = np.ctypeslib.as_array(
                llama_cpp.llama_get_sampled_candidates_ith(context, output), shape=(count,)
            )
            values[row] = np.ctypeslib.as_array(
                llama_cpp.llama_get_sampled_logits_ith(context, output), shape=(count,)
            )
        return ids, values

    def close(self) -> None:
        """Free the chains: only once the context that used them is gone."""
        for chain in self._chains + self._retired:
            llama_cpp.llama_sampler_free(chain)
        self._chains.clear()
        self._retired.clear()


def _top_k_chain(width: int) -> llama_cpp.llama_sampler_p:
    chain: llama_cpp.llama_sampler_p = llama_cpp.llama_sampler_chain_init(
        llama_cpp.llama_sampler_chain_default_params()
    )
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(width))
    return chain
