"""The cache models: state and rules only (no lesson constants, no display text)."""
