"""The tuner's moves, one module per phase; each move is a small function over a plan (or the
plan's layout) that returns a new one, or None when it does not apply."""
