"""One event loop in a daemon thread: how the blocking SDK runs the async one.

The sync ``Sandbox`` is a thin wrapper: each method runs the ``AsyncSandbox`` method on this
loop and waits for it, so there is one implementation. Callbacks given to sync methods
(``on_stdout``...) run in the loop's thread. Ctrl-C while waiting cancels the call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["iterate", "run"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _the_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ringfence-sdk", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Coroutine[Any, Any, T]) -> T:
    """The result of ``coro``, run on the SDK's loop; its exception, raised here."""
    future = asyncio.run_coroutine_threadsafe(coro, _the_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()  # Ctrl-C (or anything else) here: stop the call there
        raise


def iterate(source: AsyncIterator[T]) -> Iterator[T]:
    """A blocking iterator over an async one (closed with it)."""
    try:
        while True:
            item = run(_anext(source))
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        closer = getattr(source, "aclose", None)
        if closer is not None:
            run(closer())


_DONE = object()


async def _anext(source: AsyncIterator[T]) -> T | object:
    try:
        return await source.__anext__()
    except StopAsyncIteration:  # an exception a future cannot carry across cleanly
        return _DONE
