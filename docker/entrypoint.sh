#!/bin/sh
# Every agent container starts here: shape this container's link if asked, then run the command as given.
#
# KVTRANSIT_SHAPE_TO=HOST  shape the egress of the interface that routes to HOST with the scenario's
#                          scaled link (rate from the command's own scenario flags, so it cannot disagree
#                          with what the agent was told). Needs cap_add NET_ADMIN.
set -eu
if [ -n "${KVTRANSIT_SHAPE_TO:-}" ]; then
    python3 /usr/local/lib/kvtransit/shape_egress.py --to "$KVTRANSIT_SHAPE_TO" -- "$@"
fi
exec "$@"
