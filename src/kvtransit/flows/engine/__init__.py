"""A real serving engine on the KV link: two vLLM instances, prefill and decode, hand a real model's KV cache to
each other through the middlebox (docs/flows/engine.md).

- `vllm_connector.py`: kvtransit's connector for vLLM's v1 KV-connector API (imported only inside vLLM);
- `kv_link.py`: its two ends of the wire (sender to the middlebox, receiver from it), each on a thread of its own;
- `vllm_extra.py`: which interpreter runs vLLM and whether it is the version the connector follows;
- `instances.py`, `client.py`, `run.py`: the run (`kvtransit engine`): the instances, the middlebox, the prompts;
- `engine_report.py`: what the run measured, beside what the model prescribes (pure);
- `cli.py`: the command.
"""
