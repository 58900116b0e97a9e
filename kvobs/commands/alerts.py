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

from kvobs.commands.common import add_store_flag, start_or_report


def add_parser(sub) -> None:
    p = sub.add_parser("alerts", help="evaluate alert rules over the store")
    add_store_flag(p)
    p.add_argument("--rules", help="YAML rule file: adds rules, replaces built-in ones of the same name")
    p.add_argument("--no-builtin", action="store_true", help="only the rules of --rules")
    p.add_argument("--webhook", action="append", default=[], metavar="URL", help="POST transitions here (repeatable)")
    p.add_argument("--watch", type=float, metavar="S", help="evaluate every S seconds until Ctrl-C")
    p.add_argument("--at", type=float, metavar="EPOCH_S", help="evaluate as of this time (default: now)")
    p.add_argument("--list-rules", action="store_true", help="print the rules and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvobs.alerts.evaluator import Evaluator
    from kvobs.alerts.rules import RuleError, load_rules
    from kvobs.alerts.sinks import WebhookSink
    from kvobs.store import open_store

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
    try:
        while True:
            now = args.at if args.at is not None else time.time()
            for t in evaluator.evaluate(now):
                print(f"{t['state']:8} {t['severity']:8} {t['rule']}: {t['summary']}")
            if not args.watch or stop.wait(args.watch):
                return 0
    finally:
        store.close()
