"""Weight streaming live: a store and an instance over a shaped link; the instance is unavailable
until its weights have streamed in (a cold start), then pages LoRA adapters in on demand while it serves."""
