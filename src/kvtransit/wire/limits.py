"""Every limit the wire enforces, with the reason for its value.

A frame whose header announces more than these is refused before a byte of its body is buffered, so a
peer cannot make a connection hold more than one frame (plus one read) of memory.
"""

MAGIC = b"KVT1"
"""First four bytes of every frame: a stray HTTP client (b'GET ') or a desynchronised stream fails at once."""

WIRE_VERSION = 1
"""Framing version in every header and in Hello; a peer speaking another version is refused."""

MAX_PAYLOAD = 64 * 1024 * 1024
"""64 MiB. The K (or the V) half of one llama3-70b layer at 32,768 tokens: 8 kv heads × 128 head_dim × 2 B
(BF16) × 32,768 = 64 MiB (docs/reference.md §1; the whole layer, K and V, is 128 MiB, so senders split a layer into
≥ 2 chunks at that length). Bounds the receive buffer of every connection."""

MAX_CODEC_HEADER = 256
"""A codec's per-chunk parameters (block size, kept band, scales): a few dozen bytes; 256 leaves room."""

MAX_META = 64 * 1024
"""64 KiB of small structured fields. The largest is a Tokens frame: 20 B per entry, and one decode step of a
full batch is 256 entries (docs/reference.md §4: at most 256 running) = 5 KiB, so 64 KiB holds ~12 steps."""

MAX_NDIM = 5
"""Tensor rank in a KvChunk header: (layers, K/V, tokens, heads, head_dim) is the largest layout in use."""

MAX_NAME = 64
"""Hello.name (e.g. 'prefill-0'), UTF-8 bytes: a process label, not free text."""

MAX_CODEC_NAME = 32
"""KvBegin.codec (e.g. 'freq-keep-k'), UTF-8 bytes: a registry key (docs/reference.md §5 codec presets)."""

MAX_MESSAGE = 1024
"""Error.message, UTF-8 bytes: one line naming what was wrong, never a traceback."""

MAX_REASON = 256
"""Bye.reason and Ack.detail, UTF-8 bytes: one short phrase."""

MAX_TOKENS_PER_REQUEST = 1 << 20
"""prompt_tokens / output_tokens: the workload caps lengths at 32,768 (docs/reference.md §4); 2^20 allows 32× that."""

MAX_HASH_IDS = 4096
"""Block ids in a Request, PoolFetch or PoolPut (8 B each, 32 KiB of meta): at 512-token blocks (the Mooncake
traces' block size) that is 2M tokens, twice MAX_TOKENS_PER_REQUEST."""

MAX_OPEN_KV_STREAMS = 4096
"""KV streams begun and not yet ended on one connection. A prefill holds at most a batch of 8,192 tokens
(docs/reference.md §4), i.e. ≤ 8,192 requests in the degenerate 1-token case; 4,096 in flight bounds the
per-connection bookkeeping a hostile peer can make us hold."""

DEFAULT_READ_SIZE = 256 * 1024
"""What get_buffer() offers when the caller gives no size hint: a few socket buffers' worth."""


def clip_utf8(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, never inside a character: what a frame's text field accepts.

    The limits above count UTF-8 bytes, not characters: a 200-character reason in a non-Latin script is
    400-800 bytes, so a character slice (`reason[:200]`) can still overflow MAX_REASON and fail the send."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def clip_message(text: str) -> str:
    """An Error.message that fits (MAX_MESSAGE)."""
    return clip_utf8(text, MAX_MESSAGE)


def clip_reason(text: str) -> str:
    """A Bye.reason or Ack.detail that fits (MAX_REASON)."""
    return clip_utf8(text, MAX_REASON)
