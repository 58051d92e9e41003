"""Link specs -> tc/ip argv lists; apply, verify, clean up exactly what was made. Imports nothing from kvtransit.

Modules, one job each:
  spec        LinkSpec (+ GilbertElliott): what a link should do, validated on construction
  units       "200mbit" / "5ms" / "64kb" -> bytes/s, seconds, bytes
  commands    spec -> exact tc / ip argv lists (tbf or htb for rate, netem for delay/jitter/loss)
  backend     probe the kernel's qdiscs; plan which back-end realises each property, or refuse
  runner      run_command (subprocess, loud failures) and RecordingRunner (tests, dry runs)
  topology    build_testbed(agents, links) -> Testbed: namespaces, veths, addresses, shaping, live changes
  manifest    what a run created, on disk; cleanup / rollback by exact name
  schedule    piecewise [t, rate, latency, loss] schedules and Mahimahi traces; play() on absolute deadlines
  userspace   TokenBucket and DelayLine: the user-space shaper's pure arithmetic (no clock, no sockets)
  relay       asyncio TCP relay delaying one direction with a DelayLine (where netem is missing)
  measure     goodput and RTT endpoints run inside namespaces
  linktest    one spec on a throw-away namespace pair: configured vs achieved
"""
