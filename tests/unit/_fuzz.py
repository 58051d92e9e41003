"""The settings of the fuzz tests (untrusted input: the wire parser, the control API): tests/conftest.py's
"fuzz-ci" profile (10,000 examples) when CI=true, its "fuzz" profile (a few hundred) otherwise;
KVTRANSIT_FUZZ_EXAMPLES=N overrides the count either way."""

import os

from hypothesis import settings


def fuzz_settings() -> settings:
    profile = settings.get_profile("fuzz-ci" if os.environ.get("CI", "").lower() == "true" else "fuzz")
    override = os.environ.get("KVTRANSIT_FUZZ_EXAMPLES")
    return settings(profile, max_examples=int(override)) if override else profile
