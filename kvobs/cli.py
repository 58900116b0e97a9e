"""The `kvobs` command line: one entry point; each package registers its own commands.

    kvobs generate "The capital of France is" --max-tokens 32
    kvobs serve --num-blocks 512 --max-model-len 2048 --kv-events-endpoint 'tcp://127.0.0.1:5557'
    kvobs collect --vllm-url http://localhost:8000 --kv-events tcp://localhost:5557 --otlp-http 0.0.0.0:4318

A command is a module with `add_parser(subparsers)` (its flags; `set_defaults(func=run)`) and `run(args)`,
declared in pyproject.toml under `[project.entry-points."kvobs.commands"]`: `kvobs.commands.*` (demo, agents,
alerts, doctor), `instrumented_engine.commands.*` (serve, generate, whatif), `collectors.command` (collect),
`collectors.capture_command` (import) and `dashboard.command` (dashboard). This module only discovers them, so
kvobs imports nothing above it; each command imports its heavy modules inside `run`, so a collector-only install
(no torch) lists every command, runs the ones it has, and names the extra to install for the others.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from importlib.metadata import entry_points
from types import ModuleType

ENTRY_POINT_GROUP = "kvobs.commands"
QUIET_LOGGERS = ("httpx", "alembic")

log = logging.getLogger(__name__)


def command_modules() -> dict[str, ModuleType]:
    """name -> module of every registered command, by name; one that fails to import is reported and left out."""
    modules = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        try:
            modules[ep.name] = ep.load()
        except Exception as exc:  # a broken plug-in must not take every other command down
            print(f"kvobs: command {ep.name!r} ({ep.value}) cannot be loaded: {exc}", file=sys.stderr)
    return modules


class OneLineParser(argparse.ArgumentParser):
    """A bad flag costs one line on stderr that names it, and exit status 2: `kvobs whatif: argument --block-size:
    must be at least 1; got 0`; a misspelt flag says which it may have meant. The usage is a `--help` away."""

    def error(self, message: str):
        hint = ""
        unknown = message.removeprefix("unrecognized arguments: ")
        if unknown != message:
            flags = [f for action in self._actions for f in action.option_strings]
            close = [difflib.get_close_matches(word, flags, n=1) for word in unknown.split() if word.startswith("-")]
            guesses = [match[0] for match in close if match]
            hint = f"; did you mean {', '.join(guesses)}?" if guesses else ""
        self.exit(2, f"{self.prog}: {message}{hint} ({self.prog} --help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="kvobs", description="KV-cache observability for LLM agents", allow_abbrev=False)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in command_modules().values():
        module.add_parser(sub)
    for command_parser in sub.choices.values():
        # Whole flag names only: a prefix that parses today (--round-pause) breaks silently when a flag is added.
        command_parser.allow_abbrev = False
        show_defaults(command_parser)
    parser.set_defaults(_commands=sub.choices)
    return parser


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every flag's `--help` line ends with its default (`default: 8000`), unless the flag has none (None, off) or its
    help already says what it is."""
    for action in parser._actions:
        default = action.default
        if not action.option_strings or default is None or default is False or default == argparse.SUPPRESS:
            continue
        if action.help == argparse.SUPPRESS or "default" in (action.help or ""):
            continue
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        if not shown:
            continue
        text = f"default: {shown}".replace("%", "%%")
        action.help = f"{action.help}; {text}" if action.help else text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's list of commands
        args._commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # a line per HTTP request or per migration step is noise unless asked for
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return args.func(args)
    except BrokenPipeError:  # `kvobs whatif ... | head`: the reader left; nothing more to say (Python's own advice)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
