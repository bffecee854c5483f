"""Models on the Hugging Face Hub before they are on disk: what to fetch and what it is.

`files` decides which of a repo's files a backend needs (one GGUF of a
multi-quant repo; safetensors, tokenizer and configs for mlx-lm; a diffusers
pipeline's component folders). `remote` reads a repo's metadata over HTTP
through huggingface_hub (the file list with sizes, the small JSON configs, a
GGUF's header or a safetensors header by ranged reads), never the weights, so
that admission can answer before a download.
"""
