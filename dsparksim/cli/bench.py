"""``dsparksim bench``: measured serving-benchmark runs as input (``replay``; ``import`` lands with the importer).

Wire with ``register(subparsers)``; each subcommand sets ``func(args) -> exit code``.
"""
from __future__ import annotations


def register(subparsers) -> None:
    """Add ``bench`` and its subcommands to an argparse subparsers object."""
    from dsparksim.cli.bench_replay import register_replay

    p = subparsers.add_parser("bench", help="measured serving-benchmark runs: replay them")
    sub = p.add_subparsers(dest="bench_cmd", metavar="{replay}")
    sub.required = True
    register_replay(sub)
