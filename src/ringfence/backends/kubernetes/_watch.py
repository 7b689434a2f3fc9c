"""Watches and log streams of the blocking client, as async iterators.

Each runs in a thread of the cluster's pool and hands what it reads to the event loop. A
watch is bounded (``timeout_seconds``) so its thread always ends; leaving the iterator early
stops it at its next event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from ringfence.backends.kubernetes._client import Cluster, translated

__all__ = ["stream_log", "watch"]

_END = object()


async def watch(
    cluster: Cluster,
    doing: str,
    list_function: Callable[..., Any],
    *args: Any,
    timeout_seconds: int,
    **kwargs: Any,
) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
    """``(event type, object as JSON)`` for each event: first ADDED for every object that
    exists, then changes, until ``timeout_seconds`` pass (then it simply ends).

    Raises:
        RingfenceError: the watch failed (translated at the boundary).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    watcher = cluster.watch_class()

    def run() -> None:
        try:
            with translated(doing):
                for event in watcher.stream(
                    list_function, *args, timeout_seconds=timeout_seconds, **kwargs
                ):
                    item = (event["type"], cluster.plain(event["object"]))
                    loop.call_soon_threadsafe(queue.put_nowait, item)
        except BaseException as exc:  # handed to the loop, raised there
            loop.call_soon_threadsafe(queue.put_nowait, exc)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, _END)

    thread = loop.run_in_executor(cluster.threads, run)
    try:
        while (item := await queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield cast(tuple[str, dict[str, Any]], item)
    finally:
        watcher.stop()
        with contextlib.suppress(BaseException):
            thread.cancel()


async def stream_log(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str,
    on_chunk: Callable[[bytes], None],
    *,
    follow: bool,
) -> None:
    """Pass the container's output to ``on_chunk`` as it comes (``follow``: until the
    container ends), on the loop's thread.

    Raises:
        RingfenceError: the log could not be read.
    """
    loop = asyncio.get_running_loop()

    def run() -> None:
        with translated(f"reading the log of pod {pod}"):
            response = cluster.core.read_namespaced_pod_log(
                pod, namespace, container=container, follow=follow, _preload_content=False
            )
            try:
                for chunk in response.stream(64 * 1024):
                    loop.call_soon_threadsafe(on_chunk, bytes(chunk))
            finally:
                response.release_conn()

    await loop.run_in_executor(cluster.threads, run)
