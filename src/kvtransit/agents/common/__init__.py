"""What more than one agent process uses: `process` (addresses, the readiness line, /metrics and /stats, the
run-until-stopped loop), `kv_frames` (a request's KV as wire frames, for every sender), `pool_stream` (the
write-back stream to the KV pool, read by the pool and by the middlebox's relay), `request_ids` (the wire's int
ids, back from the model's policies)."""
