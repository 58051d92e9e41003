"""`kvtransit up`: start a run's processes where they belong, supervise them, stop them, annotate the report."""
