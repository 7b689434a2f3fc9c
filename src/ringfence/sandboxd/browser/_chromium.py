"""Starting and ending Chromium: its flags (``argv``, pure), its process group, its pipes.

Chromium runs headless with its own sandbox off (it cannot start under Ringfence's
layers, which are the boundary), driven over ``--remote-debugging-pipe`` and listening for
relayed CDP clients on ``127.0.0.1:cdp_port``. Its profile is a fresh directory under
``/tmp``, removed when it ends. Its stderr is drained by a thread into a bounded tail (for
error messages), so a chatty Chromium never blocks on a full pipe. It leads its own process
group: ending it kills the renderers and helpers with it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import IO

from ._cdp import Connection, Deadline

_QUIET_FEATURES = (
    "NetworkTimeServiceQuerying",
    "OptimizationHints",
    "OptimizationGuideModelDownloading",
    "Translate",
    "MediaRouter",
    "AutofillServerCommunication",
    "CertificateTransparencyComponentUpdater",
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    # Chromium's calls home, which the flags above leave (measured against a logging proxy):
    # the network time service, the updater, sign-in, optimization hints.
    "--disable-extensions",
    "--disable-component-extensions-with-background-pages",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--password-store=basic",
    "--no-pings",
    "--disable-features=" + ",".join(_QUIET_FEATURES),
    # What has no switch is sent to a closed port of the sandbox's own loopback (direct,
    # never through the proxy): sign-in's accounts service and the updater.
    "--gaia-url=http://127.0.0.1:9",
    "--lso-url=http://127.0.0.1:9",
    "--component-updater=url-source=http://127.0.0.1:9",
    "--remote-debugging-pipe",
    "--remote-debugging-address=127.0.0.1",
)
VIEWPORT = (1280, 800)
_TAIL_BYTES = 8192
_TRAMPOLINE = (
    "import os, sys; a, b = int(sys.argv[1]), int(sys.argv[2]); os.dup2(a, 3); os.dup2(b, 4);"
    " os.close(a); os.close(b); os.execv(sys.argv[3], sys.argv[3:])"
)


def proxy_from(env: Mapping[str, str]) -> str | None:
    """The egress proxy Chromium should use: ``$HTTPS_PROXY`` or ``$HTTP_PROXY`` (either
    case), or ``None`` for direct. Chromium sends loopback direct by itself."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def argv(chromium: str, profile: str, cdp_port: int, proxy: str | None) -> list[str]:
    """Chromium's command line: ``FLAGS``, the CDP port, the profile, the proxy."""
    args = [chromium, *FLAGS, f"--remote-debugging-port={cdp_port}"]
    args.append(f"--user-data-dir={profile}")
    args.append(f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}")
    if proxy:
        args.append(f"--proxy-server={proxy}")
    args.append("about:blank")
    return args


class Chromium:
    """A running Chromium and the CDP connection to it (``connection``)."""

    def __init__(
        self, process: subprocess.Popen[bytes], connection: Connection, profile: str,
        cdp_port: int = 0,
    ) -> None:  # fmt: skip
        self.process = process
        self.connection = connection
        self.profile = profile
        self.cdp_port = cdp_port  # its --remote-debugging-port (0: none)
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._tail_lock = threading.Lock()
        assert process.stderr is not None
        threading.Thread(
            target=self._drain, args=(process.stderr,), name="chromium-stderr", daemon=True
        ).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None and self.connection.gone is None

    def stderr_tail(self) -> str:
        """The last few KiB Chromium wrote to stderr, for error messages."""
        with self._tail_lock:
            text = b"".join(self._tail).decode("utf-8", "replace")
        return text.strip()[-2000:]

    def devtools_path(self, deadline: Deadline) -> str | None:
        """The browser target's WebSocket path, from the profile's ``DevToolsActivePort``
        or, as Chromium writes none with ``--remote-debugging-pipe`` (Chromium 156), from
        its port's ``/json/version`` (``None`` if neither says before ``deadline``)."""
        path = os.path.join(self.profile, "DevToolsActivePort")
        while True:
            try:
                with open(path, encoding="utf-8") as file:
                    lines = file.read().splitlines()
                if len(lines) >= 2 and lines[1].startswith("/devtools/browser/"):
                    return lines[1]
            except OSError:
                pass
            target = self._target_from_port(max(0.1, min(2.0, deadline.left())))
            if target is not None:
                return target
            if deadline.left() <= 0 or not self.alive():
                return None
            threading.Event().wait(min(0.05, max(0.0, deadline.left())))

    def end(self, grace: float = 2.0) -> None:
        """Ask Chromium to exit (EOF on its pipe), kill its process group after ``grace``
        seconds, reap it and remove its profile."""
        self.connection.close("Chromium was closed")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _target_from_port(self, seconds: float) -> str | None:
        """The browser target's path as ``/json/version`` on its CDP port names it (straight
        to 127.0.0.1: never through ``$HTTP_PROXY``), or None."""
        if not self.cdp_port:
            return None
        import http.client  # only when a CDP client asks: the agent's start stays light
        import json

        connection = http.client.HTTPConnection("127.0.0.1", self.cdp_port, timeout=seconds)
        try:
            host = {"Host": f"127.0.0.1:{self.cdp_port}"}
            connection.request("GET", "/json/version", headers=host)
            response = connection.getresponse()
            body = response.read(65536) if response.status == 200 else b""
            url = json.loads(body).get("webSocketDebuggerUrl") if body else None
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return None
        finally:
            connection.close()
        parts = url.split("/", 3) if isinstance(url, str) else []
        path = "/" + parts[3] if len(parts) == 4 else ""
        return path if path.startswith("/devtools/browser/") else None

    def _drain(self, stream: IO[bytes]) -> None:
        try:
            for line in iter(lambda: stream.read1(4096), b""):  # type: ignore[attr-defined]
                with self._tail_lock:
                    self._tail.append(line)
                    self._tail_size += len(line)
                    while self._tail_size > _TAIL_BYTES and len(self._tail) > 1:
                        self._tail_size -= len(self._tail.popleft())
        except (OSError, ValueError):
            pass
        finally:
            stream.close()


def launch(chromium: str, cdp_port: int, env: Mapping[str, str]) -> Chromium:
    """Start Chromium with its CDP pipe on fds 3 and 4.

    Raises:
        FileNotFoundError: ``chromium`` is not an executable file.
        OSError: it could not be started.
    """
    if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
        raise FileNotFoundError(chromium)
    profile = tempfile.mkdtemp(prefix="rf-chromium-", dir="/tmp")
    home = env.get("HOME") or profile
    os.makedirs(os.path.join(home, "Downloads"), exist_ok=True)
    # Chromium wants its pipe at fds 3 and 4; subprocess keeps passed fds at their numbers,
    # so a tiny Python moves them there (both first lifted above 9, so the moves cannot
    # collide; dash's redirections take single-digit fds only).
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()
    child_in = fcntl.fcntl(commands_read, fcntl.F_DUPFD_CLOEXEC, 10)
    child_out = fcntl.fcntl(replies_write, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(commands_read)
    os.close(replies_write)
    for fd in (commands_write, replies_read):
        os.set_inheritable(fd, False)
    trampoline = [sys.executable, "-I", "-S", "-B", "-c", _TRAMPOLINE]
    trampoline += [str(child_in), str(child_out)]
    try:
        process = subprocess.Popen(
            [*trampoline, *argv(chromium, profile, cdp_port, proxy_from(env))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(child_in, child_out),
            env=dict(env),
            start_new_session=True,
        )
    except OSError:
        for fd in (commands_write, replies_read):
            os.close(fd)
        shutil.rmtree(profile, ignore_errors=True)
        raise
    finally:
        os.close(child_in)
        os.close(child_out)
    return Chromium(process, Connection(commands_write, replies_read), profile, cdp_port)
