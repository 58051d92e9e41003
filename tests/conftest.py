"""Test-suite settings shared by every layer: hypothesis profiles.

- "default": a few hundred examples per property, for local runs.
- "ci": loaded when CI=true (CI sets it): more examples for every property, no deadline (a shared CI box
  stalls now and then).
- "fuzz" / "fuzz-ci": what the fuzz tests of untrusted input use (tests/unit/_fuzz.py picks one by CI): under
  CI the wire parser and the control API each see at least 10,000 inputs, in well under 3 minutes in all.

`pytest --hypothesis-profile NAME` still picks one explicitly; KVTRANSIT_FUZZ_EXAMPLES overrides the count of
the fuzz tests alone.
"""

import os

from hypothesis import HealthCheck, settings

ON_CI = os.environ.get("CI", "").lower() == "true"

settings.register_profile("default", max_examples=300, deadline=None)
# 1,000, not 10,000, for the ordinary properties: at 10,000 the model's pure properties alone took a minute.
settings.register_profile("ci", max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("fuzz-ci", max_examples=10_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if ON_CI else "default")
