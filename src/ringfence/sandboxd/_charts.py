"""A matplotlib figure's data, in the shape of E2B's ``Result.chart``.

Run inside a Python code context (``_kernel``), only for a figure it sends, after the figure
was drawn (its PNG), so tick labels are laid out. The types are E2B's: ``line``,
``scatter``, ``bar``, ``pie``, ``superchart`` (a figure of several axes, one chart each) and
``unknown`` (anything else, box plots included: ``title`` and no elements). 2-D charts carry
their labels, units (``"Distance (km)"`` -> ``km``), scales and ticks; values are plain
floats, dates ISO strings, categories their names. Whatever cannot be read makes the chart
``unknown`` rather than the cell fail.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

__all__ = ["chart_of"]

_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def chart_of(figure: Any) -> dict[str, Any] | None:
    """The figure's chart, or None when it has no axes."""
    axes = list(figure.get_axes())
    if not axes:
        return None
    if len(axes) == 1:
        return _chart(axes[0])
    title = figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else None
    return {"type": "superchart", "title": title or None, "elements": [_chart(a) for a in axes]}


def _chart(ax: Any) -> dict[str, Any]:
    kind = _kind(ax)
    try:
        if kind in ("line", "scatter"):
            return {**_axes_2d(ax, kind), "elements": _points(ax, kind)}
        if kind == "bar":
            return _bars(ax)
        if kind == "pie":
            return {"type": "pie", "title": _text(ax.get_title()), "elements": _wedges(ax)}
    except Exception:  # a chart we cannot read is "unknown", not an error
        pass
    return {"type": "unknown", "title": _text(ax.get_title()), "elements": []}


def _kind(ax: Any) -> str:
    Line2D = _loaded("matplotlib.lines").Line2D
    PathCollection = _loaded("matplotlib.collections").PathCollection
    Rectangle, Wedge = _loaded("matplotlib.patches").Rectangle, _loaded("matplotlib.patches").Wedge
    Text = _loaded("matplotlib.text").Text

    drawn = [child for child in ax.get_children() if _drawn(ax, child)]
    drawn = [child for child in drawn if not isinstance(child, Text)]
    for kind, types in (
        ("line", Line2D),
        ("scatter", PathCollection),
        ("pie", Wedge),
        ("bar", Rectangle),
    ):
        if drawn and all(isinstance(child, types) for child in drawn):
            return kind
    return "unknown"


def _drawn(ax: Any, child: Any) -> bool:
    """What the cell plotted: not the axes' own frame, spines, axis or legend."""
    own = [ax.patch, *ax.spines.values(), ax.xaxis, ax.yaxis, ax.title, ax._left_title,
           ax._right_title, ax.get_legend()]  # fmt: skip
    return child not in own and child in (*ax.lines, *ax.collections, *ax.patches, *ax.texts)


def _axes_2d(ax: Any, kind: str) -> dict[str, Any]:
    chart: dict[str, Any] = {"type": kind, "title": _text(ax.get_title())}
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        label = _text(axis.get_label_text())
        ticks = [float(t) for t in axis.get_ticklocs()]
        chart[f"{name}_label"] = label
        chart[f"{name}_unit"] = _unit(label)
        chart[f"{name}_scale"] = _scale(axis)
        chart[f"{name}_ticks"] = [_value(axis, t) for t in ticks]
        chart[f"{name}_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]
    return chart


def _points(ax: Any, kind: str) -> list[dict[str, Any]]:
    series: list[tuple[Any, list[tuple[Any, Any]]]]
    if kind == "line":
        series = [
            (line.get_label(), list(zip(line.get_xdata(), line.get_ydata(), strict=False)))
            for line in ax.lines
        ]
    else:
        series = [(c.get_label(), [tuple(o) for o in c.get_offsets()]) for c in ax.collections]
    return [
        {"label": str(label),
         "points": [(_value(ax.xaxis, x), _value(ax.yaxis, y)) for x, y in points]}
        for label, points in series
    ]  # fmt: skip


def _bars(ax: Any) -> dict[str, Any]:
    BarContainer = _loaded("matplotlib.container").BarContainer

    chart = _axes_2d(ax, "bar")
    elements = []
    for container in ax.containers:
        if not isinstance(container, BarContainer):
            continue
        group = container.get_label()
        group = "" if not group or group.startswith("_") else group
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        ticks = zip(axis.get_ticklocs(), axis.get_ticklabels(), strict=False)
        names = {round(float(t), 6): label.get_text() for t, label in ticks}
        for bar in container:
            where = (
                bar.get_y() + bar.get_height() / 2
                if horizontal
                else bar.get_x() + bar.get_width() / 2
            )
            value = bar.get_width() if horizontal else bar.get_height()
            label = names.get(round(where, 6), str(_value(axis, where)))
            elements.append({"label": label, "value": float(value), "group": group})
    if any(getattr(c, "orientation", "") == "horizontal" for c in ax.containers):
        for a, b in (("label", "label"), ("unit", "unit"), ("scale", "scale"), ("ticks", "ticks"),
                     ("tick_labels", "tick_labels")):  # fmt: skip
            chart[f"x_{a}"], chart[f"y_{b}"] = chart[f"y_{b}"], chart[f"x_{a}"]
    chart["elements"] = elements
    return chart


def _wedges(ax: Any) -> list[dict[str, Any]]:
    return [
        {"label": str(wedge.get_label()), "angle": abs(round(wedge.theta2 - wedge.theta1, 4)),
         "radius": float(wedge.r)}
        for wedge in ax.patches
    ]  # fmt: skip


def _scale(axis: Any) -> str:
    units = getattr(axis, "units", None)
    if units is not None and hasattr(units, "_mapping"):  # matplotlib.category.UnitData
        return "categorical"
    converter = getattr(axis, "converter", None) or getattr(axis, "get_converter", lambda: None)()
    if converter is not None and "date" in type(converter).__name__.lower():
        return "datetime"
    return str(axis.get_scale())


def _value(axis: Any, raw: Any) -> Any:
    """A coordinate as the chart reads it: a category's name, a date, a float."""
    if hasattr(raw, "isoformat"):  # a date plotted as one
        return raw.isoformat()
    scale = _scale(axis)
    try:
        number = float(raw)
    except (TypeError, ValueError):
        return str(raw)  # a category given by name
    if scale == "categorical":
        names = {index: name for name, index in axis.units._mapping.items()}
        return str(names.get(round(number), number))
    if scale == "datetime":
        return _loaded("matplotlib.dates").num2date(number).isoformat()
    return number if math.isfinite(number) else None


def _loaded(name: str) -> Any:
    """A matplotlib module the cell's figure already loaded (``matplotlib.axes`` loads all
    of these): this package imports nothing beyond the standard library itself.

    Raises:
        KeyError: it is not loaded (the chart is then not sent).
    """
    return sys.modules[name]


def _unit(label: str | None) -> str | None:
    if not label:
        return None
    found = _UNIT.search(label)
    return (found.group(1) or found.group(2)) if found else None


def _text(text: str | None) -> str | None:
    return text or None
