"""The command-line tools behind ``python -m kvlab``."""
