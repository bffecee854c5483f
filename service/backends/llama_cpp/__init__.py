"""The llama.cpp backend for GGUF files, and the pieces only it uses.

`backend` is the backend; `batch` fills one llama_batch, `sampling` builds each
sequence's sampler chain, `kv_slots` keeps the prompt cache's bookkeeping,
`argmax` and `logprobs` read a step's logits, and `log` routes llama.cpp's log
into ours (through the C filter in `service/backends/native/` where built).
"""

from service.backends.llama_cpp.backend import LlamaCppBackend, LlamaCppOptions

__all__ = ["LlamaCppBackend", "LlamaCppOptions"]
