"""Join a sans-IO wire Connection to a byte stream: TCP sockets or an in-memory pair.

One module per job:

    protocol.py     FramedProtocol: the asyncio.BufferedProtocol around one wire Connection (the transport
                    reads straight into the connection's buffer), its flow control and FlowLimits
    endpoint.py     Endpoint: what agents use (send, exclusive + write_parts, next_event, close, abort,
                    send_error; a subclass may wrap the send side), and the buffer-ownership rules (how
                    long a payload view stays valid, when a send may return)
    memory.py       the in-memory transport pair (memory_pair)
    tcp.py          TCP dial and listen (open_endpoint)
    tcp_options.py  keepalive and TCP_USER_TIMEOUT on every TCP connection
    server.py       Server: accept, one handler per connection, shutdown in order (serve, serve_memory)

The same Endpoint runs over TCP and over memory, so one conformance suite covers both
(tests/integration/test_transport_conformance.py). Signal handling is `kvtransit.runtime.signals`.
"""

from kvtransit.runtime.transport.endpoint import Endpoint
from kvtransit.runtime.transport.memory import memory_pair
from kvtransit.runtime.transport.protocol import FlowLimits, Part, is_borrowed
from kvtransit.runtime.transport.server import Server, serve, serve_memory
from kvtransit.runtime.transport.tcp import open_endpoint, open_greeted

__all__ = ["Endpoint", "FlowLimits", "Part", "Server", "is_borrowed", "memory_pair",
           "open_endpoint", "open_greeted", "serve", "serve_memory"]
