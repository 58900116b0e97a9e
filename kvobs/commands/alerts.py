"""`kvobs alerts`: evaluate the alert rules over the store, write transitions, send them to sinks.

kvobs alerts --store sqlite:///kvobs.db                      # one round now, print what fired or resolved
kvobs alerts --rules my_rules.yaml --webhook http://hooks/kv --watch 15
kvobs alerts --list-rules
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from kvobs.commands.common import add_store_flag, number, start_or_report
from kvobs.times import local_time


def add_parser(sub) -> None:
    p = sub.add_parser("alerts", help="evaluate alert rules over the store")
    add_store_flag(p)
    p.add_argument("--rules", help="YAML rule file: adds rules, replaces built-in ones of the same name")
    p.add_argument("--no-builtin", action="store_true", help="only the rules of --rules")
    p.add_argument("--webhook", action="append", default=[], metavar="URL", help="POST transitions here (repeatable)")
    p.add_argument("--watch", type=number(float, above=0), metavar="S", help="evaluate every S seconds until Ctrl-C")
    p.add_argument("--at", type=float, metavar="EPOCH_S", help="evaluate as of this time (default: now)")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvobs.alerts.evaluator import Evaluator
    from kvobs.alerts.rules import RuleError, load_rules
    from kvobs.alerts.sinks import WebhookSink
    from kvobs.store import open_store
    from kvobs.store.db import redacted_url

    try:
        rules = load_rules(args.rules, include_builtin=not args.no_builtin)
    except RuleError as exc:
        print(f"kvobs alerts: {exc}", file=sys.stderr)
        return 2
    if args.list_rules:
        for rule in rules:
            hold = f" for {rule.for_s:g}s" if rule.for_s else ""
            print(f"{rule.name:32} {rule.severity:8} {rule.signal} {rule.op} {rule.threshold:g}{hold}")
        return 0
    store = start_or_report("alerts", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    # Each transition is printed once, below (a log sink beside it would tell it twice).
    evaluator = Evaluator(store, rules, sinks=[WebhookSink(url) for url in args.webhook])
    stop = threading.Event()
    if args.watch:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    if args.watch:
        shown = redacted_url(store.url)
        print(
            f"kvobs alerts: evaluating {len(rules)} rules every {args.watch:g} s over {shown}; Ctrl-C stops", flush=True
        )
    rounds = 0
    try:
        while True:
            now = args.at if args.at is not None else time.time()
            transitions = evaluator.evaluate(now)
            rounds += 1
            for t in transitions:
                print(f"{t['state']:8} {t['severity']:8} {t['rule']}: {t['summary']}", flush=True)
            if not args.watch:
                if not transitions:
                    print(
                        f"kvobs alerts: no change: {len(rules)} rules evaluated at {local_time(now)} over {store.url}",
                        flush=True,
                    )
                print(f"firing now: {_firing_now(evaluator)}")
                return 0
            if stop.wait(args.watch):
                print(f"kvobs alerts: stopped after {rounds} rounds; firing now: {_firing_now(evaluator)}")
                return 0
    finally:
        store.close()


def _firing_now(evaluator) -> str:
    """The alerts firing after this round, in one line: `Rule (instance)`, or `none`."""
    keys = sorted(evaluator.active(), key=lambda key: tuple(part or "" for part in key))
    names = [f"{rule} ({instance or session or 'fleet'})" for rule, instance, session in keys]
    return ", ".join(names) or "none"
