"""A Python code context: a persistent interpreter, one process per context.

Run by the daemon as ``python3 -u -c "...; from sandboxd._kernel import main; main(3)"`` with
fd 3 a socket to the daemon (its control channel) and fds 1 and 2 pipes the daemon reads as
the cell's stdout and stderr (so output of subprocesses and C code is caught too). Requests
and answers on fd 3 are JSON lines:

    -> {"code": "...", "env": {"A": "1"}}
    <- {"type": "result", "text": "2", "html": ..., "png": ..., "is_main_result": true}
    <- {"type": "error", "name": "ZeroDivisionError", "value": "...", "traceback": "..."}
    <- {"type": "done", "execution_count": 3}

The last expression's value is the main result, as a MIME bundle built from its
``_repr_*_`` methods (pandas gives HTML, and a DataFrame its ``data`` as E2B's
``e2b/data``: ``to_dict(orient="list")``); matplotlib figures left open are sent as PNG
results with E2B's ``chart`` (``_charts``) and closed, as Jupyter's inline backend does.
``!shell`` lines and the common ``%`` magics run as IPython's do (``_magics``).
SIGINT interrupts the running cell (KeyboardInterrupt) and keeps the context. This runs the
sandbox's own code, inside the sandbox: it is not a security boundary, only an interpreter.
"""

from __future__ import annotations

import ast
import base64
import builtins
import json
import linecache
import os
import re
import signal
import socket
import sys
import traceback
from typing import Any

_CELL = "<cell>"
_ESCAPED = re.compile(r"^\s*[!%]", re.MULTILINE)
_REPRS = (
    ("_repr_html_", "html"),
    ("_repr_markdown_", "markdown"),
    ("_repr_svg_", "svg"),
    ("_repr_png_", "png"),
    ("_repr_jpeg_", "jpeg"),
    ("_repr_latex_", "latex"),
    ("_repr_json_", "json"),
    ("_repr_javascript_", "javascript"),
)


class Kernel:
    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.count = 0
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.namespace["display"] = self.display

    def send(self, message: dict[str, Any]) -> None:
        self.channel.sendall(json.dumps(message, default=_jsonable).encode() + b"\n")

    def display(self, *values: Any) -> None:
        """``display(x)`` in a cell: a result that is not the cell's main one."""
        for value in values:
            self.send({"type": "result", **bundle(value), "is_main_result": False})

    def run(self, code: str, env: dict[str, str]) -> None:
        self.count += 1
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self._execute(code)
        except BaseException as exc:
            self.send({"type": "error", **describe(exc)})
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            sys.stdout.flush()
            sys.stderr.flush()
        self._figures()
        self.send({"type": "done", "execution_count": self.count})

    def _execute(self, code: str) -> None:
        code = dedent_cell(code)
        if _ESCAPED.search(code):  # a !shell line or a %magic: IPython's, rewritten
            from ._magics import rewrite, runtime

            self.namespace.update(runtime())
            code = rewrite(code)
        name = f"{_CELL[:-1]}-{self.count}>"  # <cell-3>: tracebacks show its lines
        linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            tree.body.pop()
        exec(compile(tree, name, "exec"), self.namespace)
        if last is not None:
            value = eval(compile(last, name, "eval"), self.namespace)
            if value is not None:
                self.namespace["_"] = value
                self.send({"type": "result", **bundle(value), "is_main_result": True})

    def _figures(self) -> None:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        try:
            for number in pyplot.get_fignums():
                figure = pyplot.figure(number)
                self.send({"type": "result", **bundle(figure), "is_main_result": False})
            pyplot.close("all")
        except Exception as exc:
            self.send({"type": "error", **describe(exc)})


def dedent_cell(code: str) -> str:
    """The cell as IPython runs it: leading blank lines dropped, and the first line's indent
    taken off every line that starts with it (code pasted from inside a function, or
    written as an indented string, runs)."""
    lines = code.splitlines(keepends=True)
    while lines and not lines[0].strip():
        del lines[0]
    if not lines:
        return code
    first = lines[0]
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return "".join(lines)
    return "".join(line.removeprefix(indent) for line in lines)


def bundle(value: Any) -> dict[str, Any]:
    """The MIME bundle of ``value``: ``text`` always, the rest when it offers them."""
    data: dict[str, Any] = {"text": _text(value)}
    if isinstance(value, type):
        return data  # a class: its _repr_*_ are unbound functions
    for method, key in _REPRS:
        render = getattr(value, method, None)
        if not callable(render):
            continue
        try:
            out = render()
        except Exception:
            continue
        if isinstance(out, tuple):  # (data, metadata)
            out = out[0]
        if out is None:
            continue
        if isinstance(out, bytes):
            out = base64.b64encode(out).decode()
        data[key] = out
    if "png" not in data and hasattr(value, "savefig"):  # a matplotlib figure
        import io

        buffer = io.BytesIO()
        try:
            value.savefig(buffer, format="png", bbox_inches="tight")
            data["png"] = base64.b64encode(buffer.getvalue()).decode()
        except Exception:
            pass
        else:
            chart = _chart(value)  # drawn now: its tick labels are laid out
            if chart is not None:
                data["chart"] = chart
    if type(value).__name__ == "DataFrame" and callable(getattr(value, "to_dict", None)):
        try:
            columns = value.to_dict(orient="list")  # E2B's e2b/data of a DataFrame
            data["data"] = {str(k): [_finite(v) for v in vs] for k, vs in columns.items()}
        except Exception:
            pass
    return data


def _chart(figure: Any) -> dict[str, Any] | None:
    """E2B's ``chart`` of a figure (``_charts``); None when it has none or cannot be read."""
    try:
        from ._charts import chart_of

        return chart_of(figure)
    except Exception:
        return None


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no word for them (JavaScript's parser refuses)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    return value


def _jsonable(value: Any) -> Any:
    """What ``json`` cannot encode of a result (numpy scalars, timestamps, NaN-free)."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _text(value: Any) -> str:
    text = repr(value)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # as E2B's code interpreter shows strings: 'a' -> a
    return text


def describe(exc: BaseException) -> dict[str, str]:
    """Name, value and the traceback from the cell's own frames down."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next(
        (i for i, f in enumerate(frames) if f.filename.startswith(_CELL[:-1])), len(frames)
    )
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames[first:])
    lines += traceback.format_exception_only(type(exc), exc)
    if isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    return {"name": type(exc).__name__, "value": str(exc), "traceback": "".join(lines)}


def main(fd: int) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = socket.socket(fileno=fd)
    kernel = Kernel(channel)
    requests = channel.makefile("rb")
    for line in requests:
        try:
            request = json.loads(line)
            code, env = str(request["code"]), dict(request.get("env") or {})
        except (ValueError, KeyError, TypeError) as exc:
            kernel.send(
                {"type": "error", "name": "RequestError", "value": str(exc), "traceback": ""}
            )
            kernel.send({"type": "done", "execution_count": kernel.count})
            continue
        kernel.run(code, {str(k): str(v) for k, v in env.items()})
