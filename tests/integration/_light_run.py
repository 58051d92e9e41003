"""The serving loop's light workload (tests/integration/conftest.py runs it once a session: `light_loopback_run`)."""

# Light: one request every 0.5 s on average, short outputs; a hand-off of a 2,048-token prompt takes 86 ms
# on eth-25g and a lone decode of 32 tokens ~0.2 s, so requests rarely meet.
LIGHT = dict(rate=2.0, requests=10, output_mean=32.0, output_cv=0.5, prompt_mean=1024.0, prompt_cv=0.5)
LIGHT_ACCURACY_SAMPLE = 4  # requests whose KV decode checks against what the prefill made
