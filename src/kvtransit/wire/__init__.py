"""Sans-IO framing of every hop (stdlib only: no sockets, no asyncio, no clock)."""
