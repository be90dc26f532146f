"""Command-line interface: every ``dsparksim`` command."""
