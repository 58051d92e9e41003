"""The twin: a scenario run on a virtual clock in one process, by the same decisions the agents make.

`kvtransit twin` (cli/twin.py) runs any scenario `kvtransit up` accepts whose flows have a model, without processes,
sockets or a wall clock: arrivals, prefill batching and step holds, the hand-off link's lanes and the module, decode
admission and steps, each planned by the pure functions the agents call (model/serving/, model/judge/fidelity.py's
prescribed link terms, the kernels' real encoders for the wire bytes). Its report has the live report's shape and
says `source: twin`; `twin/diff.py` sets a live run's requests beside the twin's, one by one.

- `events.py`: the virtual clock and its event queue;
- `link.py`: the hand-off link's lanes and what a hand-off crosses it as;
- `serving.py`: the run (prefill instances, the link, decode instances) and what it recorded;
- `report.py`: the twin's report;
- `diff.py`: a live run against its twin, request by request.

Pure of I/O: no sockets, no event loop, no clock but its own.
"""
