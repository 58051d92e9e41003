"""The OpenAI-compatible front end (`kvtransit frontend`, `kvtransit up --frontend`): real clients drive the testbed.

One module per job: `openai_protocol.py` is the API sans I/O (request bodies → a job or an OpenAI-shaped error;
response bodies and stream chunks), `prompt_tokens.py` counts a prompt's tokens (the real-model extra's
tokenizer, or a byte estimate), `serving.py` is the HTTP/SSE side on the house HTTP server, `bridge.py` the
load generator whose requests come from those clients (same router, ledger and run report), and
`vllm_result.py` writes a run report with `vllm bench serve`'s result keys.
"""
