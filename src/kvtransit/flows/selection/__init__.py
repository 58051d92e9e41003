"""Query-aware KV selection live: a pool holding a long context's KV, a module on the link that
scores the pages' key summaries against each decode step's query, and a decode host that ranks and fetches only
the chosen pages, as three processes over a shaped link."""
