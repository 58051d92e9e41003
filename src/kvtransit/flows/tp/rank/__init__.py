"""A TP group's rank processes and their collectives over real sockets: payloads, the shaped
channel between two collective endpoints, the rank's step loop (ring or switch all-reduce)."""
