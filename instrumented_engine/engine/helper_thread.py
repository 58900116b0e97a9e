"""Build the engine on a short-lived thread, so that the server's main thread never starts an OpenMP team.

libgomp keeps a pool of worker threads for every thread that has run a parallel region, until that thread ends.
When it manages more threads than the machine has CPUs, its workers stop spinning between regions (a throttled
spin) and each small region waits for them to wake up. A server that loads the model on its main thread (HTTP)
and steps it on the engine thread therefore pays that wake-up in every small matmul of a decode step (the figures:
the commit that added this module). A thread's pool ends with the thread, so
loading on a helper thread that exits leaves the engine thread the only OpenMP team in the process.

    engine = on_helper_thread(lambda: LLMEngine(config), name="kvobs-load")
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_helper_thread(fn: Callable[[], T], *, name: str) -> T:
    """fn() run on a new thread that ends before this returns; its exception is raised here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller, raised there
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
