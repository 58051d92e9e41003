"""The processes of the testbed: prefill, middlebox, decode, loadgen, and the launcher."""
