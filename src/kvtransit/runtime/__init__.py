"""The process plumbing the agents stand on: transport/ (framed connections over TCP or memory), clock, tasks,
signals, the event loop, the user-space egress shaper, metrics, and HTTP (server and client)."""
