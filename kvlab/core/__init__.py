"""Lowest room: immutable snapshots and events, block hashing, seeded workloads, the chat format."""
