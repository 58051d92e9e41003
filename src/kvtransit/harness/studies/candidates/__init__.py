"""`kvtransit candidates`: the candidate table, one live scenario per row, judged by one rule."""
