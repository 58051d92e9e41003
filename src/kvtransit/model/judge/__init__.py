"""How a run is judged: SLO figures, the fidelity guard, the five tests, the request ledger, task accuracy (pure)."""
