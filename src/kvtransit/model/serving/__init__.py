"""The serving decisions the agents make and a twin would replay: queues, batches, step plans, KV arrivals, workloads,
traces, offered load (pure)."""
