"""asyncio/uvloop plumbing, clock and metrics registry: the only layer with sockets."""
