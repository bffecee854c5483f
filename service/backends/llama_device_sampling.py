"""Greedy sampling inside llama.cpp's forward pass, one sampler chain per sequence slot.

With dozens of sequences on a GPU, copying every output's logits to the host
(128k floats each) and taking the argmax there is what limits a step.
llama.cpp's backend sampling (experimental in the pinned release) runs an
attached chain inside the pass and hands back only the token, and when every
output in the batch is sampled that way it copies no logits at all.

Attaching or detaching a chain makes llama.cpp re-reserve its compute graph
(15-20 ms on an H200), so chains stay attached to their slots: a greedy request
finds one ready, and only a slot that served a request sampling on the host
(temperature, a grammar, logprobs) pays to get its chain back.
"""

from __future__ import annotations

from typing import cast

import llama_cpp


def _greedy_chain() -> llama_cpp.llama_sampler_p:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return cast("llama_cpp.llama_sampler_p", chain)


class DeviceGreedy:
    """The slots' attached greedy chains; not thread-safe, like the context it serves."""

    def __init__(self, context: llama_cpp.llama_context_p, slots: int) -> None:
        self._context = context
        self._chains = {seq_id: _greedy_chain() for seq_id in range(slots)}
        self._attached: set[int] = set()
        for seq_id in self._chains:
            self._set(seq_id, attached=True)

    def prepare(self, seq_id: int, on_device: bool) -> bool:
        """Set slot `seq_id` up for its next sequence; whether it samples on the device."""
        attached = self._set(seq_id, attached=on_device)
        return on_device and attached

    def token(self, output_index: int) -> int:
        return int(llama_cpp.llama_get_sampled_token_ith(self._context, output_index))

    def close(self) -> None:
        """Free the chains; call after the context is freed."""
        for chain in self._chains.values():
            llama_cpp.llama_sampler_free(chain)
        self._chains.clear()

    def _set(self, seq_id: int, attached: bool) -> bool:
        if (seq_id in self._attached) == attached:
            return attached
        if not attached:
            llama_cpp.llama_set_sampler(self._context, seq_id, None)
            self._attached.discard(seq_id)
            # A chain is set up for the device once; attaching it again aborts.
            llama_cpp.llama_sampler_free(self._chains[seq_id])
            self._chains[seq_id] = _greedy_chain()
            return False
        taken = bool(llama_cpp.llama_set_sampler(self._context, seq_id, self._chains[seq_id]))
        if taken:
            self._attached.add(seq_id)
        return taken
