"""A run's report from what was measured: built from the client's records and every peer's /stats, its text, its
figures. Imports no agent."""
