"""Shared sample events for the wire tests: one valid stream per hop."""

from kvtransit.wire import AckStatus, DType, ErrorCode, Role, events

PAYLOAD = bytes(range(256)) * 4  # 1 KiB: 8 tokens × 64 channels of BF16


def kv_stream(request_id=7, n_chunks=2):
    chunks = [events.KvChunk(request_id, layer=i, chunk=i, dtype=DType.BF16, shape=(8, 64), codec_id=0,
                             codec_header=b"", payload=PAYLOAD, raw_bytes=len(PAYLOAD)) for i in range(n_chunks)]
    begin = events.KvBegin(request_id, prompt_tokens=8, output_tokens=4, n_layers=n_chunks, n_chunks=n_chunks,
                           raw_bytes=n_chunks * len(PAYLOAD), codec="none", first_token_ns=123)
    return [begin, *chunks]


# One example of every frame type a sender may send on each hop (after its Hello).
HOP_EVENTS = {
    (Role.LOADGEN, Role.PREFILL): [events.Request(1, prompt_tokens=2048, output_tokens=256, sent_ns=10**15),
                                   events.Request(2, prompt_tokens=1100, output_tokens=8, sent_ns=10**15 + 1,
                                                  hash_ids=(2**63 - 1, 0)),
                                   events.Error(ErrorCode.REQUEST_FAILED, "client gone", request_id=1)],
    (Role.PREFILL, Role.LOADGEN): [events.FirstToken(1, t_ns=10**15 + 5),
                                   events.Error(ErrorCode.REQUEST_FAILED, "queue full", request_id=1)],
    (Role.PREFILL, Role.MIDDLEBOX): kv_stream(),
    (Role.MIDDLEBOX, Role.PREFILL): [events.Ack(7, AckStatus.OK, t_ns=99, detail="admitted"),
                                     events.Ack(8, AckStatus.FAILED)],
    (Role.MIDDLEBOX, Role.DECODE): [*kv_stream(), events.Error(ErrorCode.INTERNAL, "kernel failed", None)],
    (Role.DECODE, Role.MIDDLEBOX): [events.Ack(7, AckStatus.OK)],
    (Role.DECODE, Role.LOADGEN): [events.Tokens((events.TokenEntry(1, 1, 50), events.TokenEntry(2, 5, 51)))],
    (Role.LOADGEN, Role.DECODE): [events.Error(ErrorCode.REQUEST_FAILED, "client gone", request_id=1)],
    (Role.PREFILL, Role.DECODE): kv_stream(3, 1),
    (Role.DECODE, Role.PREFILL): [events.Ack(3, AckStatus.OK)],
    # The pool path: fetch and write-back through the middlebox, and the pool's answers.
    (Role.MIDDLEBOX, Role.KVPOOL): [events.PoolFetch(5, (1, 2, 3)), events.PoolPut(7, (4, 5)), *kv_stream()],
    (Role.KVPOOL, Role.MIDDLEBOX): [events.PoolHit(5, 1, 512), *kv_stream(5, 1), events.Ack(7, AckStatus.OK)],
}


def valid_stream(sender=Role.PREFILL, receiver=Role.MIDDLEBOX):
    """The events of a complete, valid conversation in one direction (ending with Bye)."""
    from kvtransit.wire import Connection
    conn = Connection(sender, receiver)
    evs = [events.Hello(sender, 1, f"{sender.name.lower()}-0"), *HOP_EVENTS[(sender, receiver)]]
    if any(isinstance(e, events.KvChunk) for e in evs):
        evs.append(None)  # placeholder for the KvEnd built from the tally
    out, sent = [], []
    for e in evs:
        if e is None:
            e = conn.kv_end(next(s for s in sent if isinstance(s, events.KvBegin)).request_id)
        out.append(conn.send(e))
        sent.append(e)
    out.append(conn.send(events.Bye("done")))
    sent.append(events.Bye("done"))
    return sent, b"".join(out)
