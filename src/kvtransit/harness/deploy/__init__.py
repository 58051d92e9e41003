"""The testbed beyond one host: Kubernetes manifests (k8s/) and a Docker Swarm stack (swarm/)."""
