"""The decode process (`kvtransit decode`): `agent.py` reassembles hand-offs and runs the continuous batch."""
