"""What ``run_code`` keeps of a cell's answer, gathered while it streams, in bounded memory.

The answer is the sandboxed code's word: it may display results without end, give each a
hundred thousand formats, print for ever or raise an exception megabytes long. So at most
``MAX_RESULTS`` results are kept (the main one always), every text is clipped, and once the
cell has sent more than ``MAX_CELL_RESULTS`` results or ``MAX_CELL_OUTPUT`` characters the
collector raises ``CellOverflow`` from the SDK's callback: the SDK stops reading and drops the
answer, and the sandbox interrupts a cell whose reader went away.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mcp_types import ImageContent

from ringfence.client import ExecutionError, OutputMessage, Result
from ringfence.mcp._bounds import OutputCap, clip
from ringfence.mcp._schemas import CodeError, CodeResult

__all__ = [
    "MAX_CELL_OUTPUT", "MAX_CELL_RESULTS", "MAX_FORMATS", "MAX_IMAGES", "MAX_IMAGE_CHARS",
    "MAX_RESULTS", "CellCollector", "CellOverflow",
]  # fmt: skip

MAX_RESULTS = 50  # results a run_code answer lists
MAX_FORMATS = 20  # format names listed per result, each at most _FORMAT_NAME characters
MAX_IMAGES = 4  # images a cell's answer carries, each at most MAX_IMAGE_CHARS of base64
MAX_IMAGE_CHARS = 2_000_000
# What a cell may send before it is stopped: results, and characters in all.
MAX_CELL_RESULTS = 10_000
MAX_CELL_OUTPUT = 16 << 20
_FORMAT_NAME = 64
_ERROR_NAME = 200
_TEXT_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "latex", "javascript")


class CellOverflow(Exception):
    """The cell sent more than run_code reads; raised from a callback to stop reading."""


@dataclass
class _Kept:
    result: CodeResult
    image: ImageContent | None


class CellCollector:
    """The SDK's callbacks for one cell, and what they kept."""

    def __init__(self, max_output_chars: int) -> None:
        self._limit = max_output_chars
        self.stdout, self.stderr = OutputCap(max_output_chars), OutputCap(max_output_chars)
        self._kept: list[_Kept] = []
        self._text_budget = max_output_chars  # shared by the results that are not the main one
        self.dropped = 0
        self._seen = 0
        self._size = 0
        self.error: CodeError | None = None
        self.stopped: str | None = None

    @property
    def results(self) -> list[CodeResult]:
        return [kept.result for kept in self._kept]

    @property
    def images(self) -> list[ImageContent]:
        return [kept.image for kept in self._kept if kept.image is not None]

    def on_stdout(self, message: OutputMessage) -> None:
        self.stdout.add(message.line)
        self._count(len(message.line))

    def on_stderr(self, message: OutputMessage) -> None:
        self.stderr.add(message.line)
        self._count(len(message.line))

    def on_result(self, result: Result) -> None:
        self._seen += 1
        self._keep(result)
        self._count(_weight(result))
        if self._seen > MAX_CELL_RESULTS:
            self.stopped = f"stopped: the cell sent more than {MAX_CELL_RESULTS} results"
            raise CellOverflow(self.stopped)

    def on_error(self, error: ExecutionError) -> None:
        name, name_cut = clip(error.name, _ERROR_NAME)
        value, value_cut = clip(error.value, self._limit)
        traceback, traceback_cut = clip(error.traceback, self._limit)
        truncated = name_cut or value_cut or traceback_cut
        self.error = CodeError(name=name, value=value, traceback=traceback, truncated=truncated)
        self._count(len(error.name) + len(error.value) + len(error.traceback))

    def _count(self, size: int) -> None:
        self._size += size
        if self._size > MAX_CELL_OUTPUT:
            self.stopped = f"stopped: the cell sent more than {MAX_CELL_OUTPUT >> 20} MiB"
            raise CellOverflow(self.stopped)

    def _keep(self, result: Result) -> None:
        main = result.is_main_result and not any(k.result.is_main_result for k in self._kept)
        if len(self._kept) >= MAX_RESULTS:
            if not main:
                self.dropped += 1
                return
            last = max(i for i, k in enumerate(self._kept) if not k.result.is_main_result)
            del self._kept[last]
            self.dropped += 1
        limit = self._limit if main else self._text_budget
        text, cut = clip(result.text, limit) if result.text is not None else (None, False)
        if not main and result.text is not None:
            self._text_budget -= min(len(result.text), limit)
        names = result.formats()
        formats = [clip(name, _FORMAT_NAME)[0] for name in names[:MAX_FORMATS]]
        image = _image(result) if len(self.images) < MAX_IMAGES else None
        self._kept.append(
            _Kept(
                CodeResult(
                    text=text, text_truncated=cut, formats=formats,
                    formats_truncated=len(names) > MAX_FORMATS, is_main_result=main,
                    image_attached=image is not None,
                ),
                image,
            )
        )  # fmt: skip


def _weight(result: Result) -> int:
    """About how many characters the result took in the answer."""
    size = sum(len(getattr(result, name) or "") for name in _TEXT_FORMATS)
    if result.json is not None:
        size += _json_size(result.json)
    return size + sum(len(key) + _json_size(value) for key, value in result.extra.items())


def _json_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, default=str))


def _image(result: Result) -> ImageContent | None:
    """The result as an image for the model to see, if it is one of a bounded size."""
    for data, mime in ((result.png, "image/png"), (result.jpeg, "image/jpeg")):
        if data and len(data) <= MAX_IMAGE_CHARS:
            return ImageContent(type="image", data=data, mime_type=mime)
    return None
