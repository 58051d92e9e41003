"""The prefill process (`kvtransit prefill`): `agent.py` is the serving loop, `prefix_cache.py` its side of the KV
tier."""
