"""`kvtransit sweep`: grids and presets as data (plan.py, baselines.py: pure), run live point by point (runner.py),
drawn (report.py)."""
