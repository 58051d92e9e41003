"""Where the repository's own files are, for the code that reads them: the Prometheus config, the dashboards, the
vendored CRDs, the test data's real-KV sample. The set-up is an editable install from a clone (README), so the
repository is two folders above this package; data the package itself needs ships inside it (`kvtransit/data/`)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parents[1]
DATA = PACKAGE / "data"
