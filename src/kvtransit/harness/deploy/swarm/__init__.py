"""The compose testbed as a Docker Swarm stack (docker-stack.yml): `kvtransit swarm run` deploys it on a swarm, runs
the load generator once the other services are healthy, gathers the report and the ledger, and removes the stack.

- `stack.py`: what the helper knows of docker-stack.yml (services, placement labels, networks, the variables its
  commands read); pure, held to the file by tests/unit/test_stack_files.py.
- `docker_cli.py`: one `docker ...` command, its output, or one line saying why it failed.
- `preflight.py`: whether this engine can run the stack (a swarm manager, cap_add for the middlebox, the labels).
- `stack_run.py`: deploy, wait, run, gather, remove.
"""
