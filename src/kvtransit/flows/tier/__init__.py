"""The KV tier: prefix reuse at the prefill (local, or through a pool behind the middlebox), the KV pool process, warm
starts from a trace."""
