"""The `kvobs` command line: one entry point, one module per command under `kvobs.commands`.

    kvobs generate "The capital of France is" --max-tokens 32
    kvobs serve --num-blocks 512 --kv-events-endpoint 'tcp://*:5557'
    kvobs collect --vllm-url http://localhost:8000 --kv-events tcp://localhost:5557 --otlp-http 0.0.0.0:4318

Commands import their heavy modules lazily, so a collector-only install (no torch) runs what it has.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kvobs.commands import agents, alerts, collect, dashboard, demo, generate, serve, whatif

QUIET_LOGGERS = ("httpx", "alembic")
COMMANDS = (demo, generate, serve, collect, agents, alerts, whatif, dashboard)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvobs", description="KV-cache observability for LLM agents",
                                     allow_abbrev=False)  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        # Whole flag names only: a prefix that parses today (--round-pause) breaks silently when a flag is added.
        command_parser.allow_abbrev = False
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # a line per HTTP request or per migration step is noise unless asked for
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
