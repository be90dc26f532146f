"""Input reading primitives shared by every reader (one-line errors, never tracebacks)."""
