"""Reaching hosts and servers: SSH connections, the run lock, and rank 0's HTTP API."""
