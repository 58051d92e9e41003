"""The KV pool process (`kvtransit kvpool`): `agent.py` serves fetches and write-backs, `store.py` holds the blocks."""
