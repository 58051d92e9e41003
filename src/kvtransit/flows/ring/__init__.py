"""Ring attention's ranks: each holds a block of a long prompt's real KV and passes it round a
shaped ring, a codec on every hop if one is declared, while its blockwise attention is held on the clock."""
