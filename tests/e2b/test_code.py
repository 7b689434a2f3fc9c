"""``e2b_code_interpreter.Sandbox`` unmodified: stateful ``run_code``, contexts, errors as
data, logs, PNG charts, and the data-analysis scenario of the design."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox

from tests.e2b.conftest import E2bServer, audit_records


@pytest.fixture(scope="module")
def sbx(e2b_server: E2bServer) -> Iterator[Sandbox]:
    with Sandbox.create(timeout=600) as sandbox:
        yield sandbox


def test_run_code_keeps_state_between_calls(sbx: Sandbox) -> None:
    sbx.run_code("x = 41")
    execution = sbx.run_code("x + 1")
    assert execution.text == "42" and execution.error is None
    assert execution.execution_count is not None


def test_logs_and_callbacks(sbx: Sandbox) -> None:
    out: list[str] = []
    execution = sbx.run_code(
        "import sys; print('to out'); print('to err', file=sys.stderr)",
        on_stdout=lambda message: out.append(message.line),
    )
    assert execution.logs.stdout == ["to out\n"] and execution.logs.stderr == ["to err\n"]
    assert out == ["to out\n"]


def test_errors_are_data_not_exceptions(sbx: Sandbox) -> None:
    execution = sbx.run_code("1 / 0")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError" and "division" in execution.error.value
    assert "ZeroDivisionError" in execution.error.traceback


def test_a_matplotlib_chart_comes_back_as_png(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [3, 1, 2]); plt.title('t'); plt.show()"
    )
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1, execution
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_contexts_are_separate_and_can_be_listed_restarted_removed(sbx: Sandbox) -> None:
    first = sbx.create_code_context()
    second = sbx.create_code_context(cwd="/tmp")
    assert first.language == "python" and second.cwd == "/tmp"
    sbx.run_code("y = 'first'", context=first)
    sbx.run_code("y = 'second'", context=second)
    assert sbx.run_code("y", context=first).text == "first"
    assert sbx.run_code("import os; os.getcwd()", context=second).text == "/tmp"
    assert {first.id, second.id} <= {c.id for c in sbx.list_code_contexts()}
    sbx.restart_code_context(first)
    assert sbx.run_code("y", context=first).error.name == "NameError"  # type: ignore[union-attr]
    sbx.remove_code_context(second)
    assert second.id not in {c.id for c in sbx.list_code_contexts()}


def test_bash_runs_by_language(sbx: Sandbox) -> None:
    execution = sbx.run_code("echo from-bash", language="bash")
    assert "".join(execution.logs.stdout) == "from-bash\n"


def test_data_analysis_scenario(e2b_server: E2bServer) -> None:
    """The design's scenario: a DataFrame written to CSV and described, read back."""
    with Sandbox.create(timeout=120) as sbx:
        execution = sbx.run_code(
            "import pandas as pd\n"
            "df = pd.DataFrame({'a': [1, 2, 3], 'b': [4.0, 5.0, 6.0]})\n"
            "df.to_csv('/home/user/report.csv', index=False)\n"
            "print(df.describe())"
        )
        assert execution.error is None and "mean" in "".join(execution.logs.stdout)
        assert sbx.files.read("/home/user/report.csv").splitlines()[0] == "a,b"
    assert not sbx.is_running()


def test_run_code_is_on_the_audit_record(e2b_server: E2bServer, sbx: Sandbox) -> None:
    sbx.run_code("'audited-e2b-code'")
    records = audit_records(
        e2b_server, f"sandbox:{sbx.sandbox_id}", "sandbox.run_code", "audited-e2b-code"
    )
    assert "audited-e2b-code" in str(records)


def test_javascript_runs_when_the_template_has_node(sbx: Sandbox) -> None:
    execution = sbx.run_code("const a = 40; a + 2", language="javascript")
    assert execution.error is None and execution.text == "42"
    assert sbx.run_code("a * 1", language="javascript").text == "40", "stateful too"


def test_result_and_error_callbacks_envs_and_rich_results(sbx: Sandbox) -> None:
    results: list[object] = []
    errors: list[object] = []
    execution = sbx.run_code(
        "import os, pandas as pd\npd.DataFrame({'who': [os.environ['WHO']]})",
        envs={"WHO": "ringfence"},
        on_result=results.append,
        on_error=errors.append,
    )
    assert execution.error is None and len(results) == 1 and not errors
    main = execution.results[0]
    assert (
        main.is_main_result and "ringfence" in (main.html or "") and "<table" in (main.html or "")
    )
    failing = sbx.run_code("raise ValueError('nope')", on_error=errors.append)
    assert failing.error is not None and [e.name for e in errors] == ["ValueError"]  # type: ignore[attr-defined]


def test_run_code_timeout_stops_the_wait_and_keeps_the_context(sbx: Sandbox) -> None:
    """The SDK's timeout is its own (it sends none): it stops waiting and closes its
    connection; the cell is interrupted then (not left running for 60 s), and the context
    keeps its state."""
    from e2b import TimeoutException

    sbx.run_code("kept = 'still here'")
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(60); kept = 'overwritten'", timeout=1)
    started = time.monotonic()
    assert sbx.run_code("kept").text == "still here"
    assert time.monotonic() - started < 30, "the context was free: the cell had been stopped"


def test_output_comes_in_whole_lines_from_the_first_cell_on(e2b_server: E2bServer) -> None:
    """``print(1)`` writes ``1`` and the newline apart; as from E2B's kernel, ``on_stdout``
    gets ``'1\\n'``, never ``'1'`` then ``'\\n'``: in a sandbox's first cell, in a new
    context's, and over many lines."""
    with Sandbox.create(timeout=120) as fresh:
        first: list[str] = []
        fresh.run_code("print(1)", on_stdout=lambda m: first.append(m.line))
        assert first == ["1\n"]
        for _ in range(3):
            context = fresh.create_code_context()
            execution = fresh.run_code("print(1)", context=context)
            assert execution.logs.stdout == ["1\n"]
        many = fresh.run_code(
            "import sys\nfor i in range(300): print(i); print(i, file=sys.stderr)"
        )
        for stream in (many.logs.stdout, many.logs.stderr):
            assert all(chunk.endswith("\n") for chunk in stream), stream
            assert "".join(stream) == "".join(f"{i}\n" for i in range(300))


def test_a_partial_line_still_arrives_while_the_cell_runs(sbx: Sandbox) -> None:
    """A line without its end (a progress bar) is not held until the cell ends."""
    seen: list[tuple[float, str]] = []
    sbx.run_code(
        "import time\nprint('working', end='', flush=True)\ntime.sleep(1.5)\nprint(' done')",
        on_stdout=lambda m: seen.append((time.monotonic(), m.line)),
    )
    assert [line for _, line in seen] == ["working", " done\n"]
    assert seen[1][0] - seen[0][0] > 1, "the partial line came before the cell ended"


def test_a_cell_with_a_common_indent_runs(sbx: Sandbox) -> None:
    """IPython strips the first line's indent (and leading blank lines) before running."""
    execution = sbx.run_code("\n    a = 20\n    if a:\n        a += 1\n    a * 2")
    assert execution.error is None and execution.text == "42"


def test_a_bash_cells_envs_hold_for_that_cell_only(sbx: Sandbox) -> None:
    assert sbx.run_code("export KEPT=mine", language="bash").error is None
    run = sbx.run_code('echo "$WHO $KEPT"', language="bash", envs={"WHO": "a", "KEPT": "b"})
    assert run.logs.stdout == ["a b\n"]
    after = sbx.run_code('echo "${WHO-unset} $KEPT"', language="bash")
    assert after.logs.stdout == ["unset mine\n"]
    python = sbx.run_code("import os; os.environ.get('WHO', 'unset')", envs={"WHO": "p"})
    assert python.text == "p" and sbx.run_code("os.environ.get('WHO', 'unset')").text == "unset"


def test_a_fresh_sandbox_lists_its_default_contexts(e2b_server: E2bServer) -> None:
    """As E2B's code interpreter: a python and a javascript context from the start, the
    defaults that ``run_code`` without a context (or with only a language) runs in."""
    with Sandbox.create(timeout=120) as fresh:
        listed = fresh.list_code_contexts()
        assert sorted(c.language for c in listed) == ["javascript", "python"]
        assert {c.cwd for c in listed} == {"/home/user"}
        python = next(c for c in listed if c.language == "python")
        javascript = next(c for c in listed if c.language == "javascript")
        fresh.run_code("shared = 'default'")
        assert fresh.run_code("shared", context=python).text == "default"
        fresh.run_code("const n = 7", language="javascript")
        assert fresh.run_code("n * 6", context=javascript).text == "42"
        assert len(fresh.list_code_contexts()) == 2, "running them made no others"


def test_javascript_takes_esm_imports_and_top_level_await(sbx: Sandbox) -> None:
    """E2B's JavaScript kernel runs ES module ``import`` and top-level ``await``; what a
    cell declares or imports stays for the next, and re-running an import cell is fine."""
    js = sbx.create_code_context(language="javascript")
    imports = (
        "import path from 'node:path'\n"
        "import { join as j, sep } from 'node:path'\n"
        "import * as os from 'node:os'\n"
        "typeof path.join"
    )
    for _ in range(2):
        execution = sbx.run_code(imports, context=js)
        assert execution.error is None and execution.text == "function", execution
    awaited = sbx.run_code("const answer = await Promise.resolve(41)\nanswer + 1", context=js)
    assert awaited.error is None and awaited.text == "42", awaited
    joined = sbx.run_code("[path.join('a', 'b'), j('c', 'd'), sep, typeof os.cpus]", context=js)
    assert joined.text == "[ 'a/b', 'c/d', '/', 'function' ]"
    printed = sbx.run_code("console.log(await Promise.resolve('awaited'))", context=js)
    assert printed.logs.stdout == ["awaited\n"] and printed.error is None
    failed = sbx.run_code("await Promise.reject(new RangeError('no'))", context=js)
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("RangeError", "no")
    thrown = sbx.run_code("null.x", context=js)
    assert thrown.error is not None and thrown.error.name == "TypeError"
    late = sbx.run_code("setTimeout(() => { throw new Error('later') }, 10); 'set'", context=js)
    assert late.text == "set"
    assert sbx.run_code("answer", context=js).text == "41", "a timer's error ends no context"


def test_a_javascript_cell_past_its_timeout_is_interrupted(sbx: Sandbox) -> None:
    from e2b import TimeoutException

    js = sbx.create_code_context(language="javascript")
    sbx.run_code("const kept = 'still here'", context=js)
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", context=js, timeout=1)
    started = time.monotonic()
    assert sbx.run_code("kept", context=js).text == "still here"
    assert time.monotonic() - started < 10, "the loop was interrupted, the context kept"


_PLOT = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"


def test_charts_come_back_with_e2bs_chart_data(sbx: Sandbox) -> None:
    """``Result.chart`` as E2B's interpreter extracts it from matplotlib, parsed by the
    SDK's own chart classes: line, scatter, bar, pie, and a figure of several axes."""
    from e2b_code_interpreter.charts import BarChart, LineChart, PieChart, ScatterChart, SuperChart

    line = (
        sbx.run_code(
            _PLOT + "plt.plot([1, 2, 3], [3, 1, 2], label='s')\n"
            "plt.title('t'); plt.xlabel('Distance (km)'); plt.ylabel('y [s]'); plt.show()"
        )
        .results[0]
        .chart
    )
    assert isinstance(line, LineChart) and line.title == "t"
    assert (line.x_label, line.x_unit, line.y_unit) == ("Distance (km)", "km", "s")
    assert [(e.label, e.points) for e in line.elements] == [("s", [(1, 3), (2, 1), (3, 2)])]
    assert line.x_scale.value == "linear" and line.x_ticks and line.x_tick_labels

    scatter = sbx.run_code(_PLOT + "plt.scatter([1, 2], [5, 6]); plt.show()").results[0].chart
    assert isinstance(scatter, ScatterChart)
    assert scatter.elements[0].points == [(1, 5), (2, 6)]

    bars = sbx.run_code(_PLOT + "plt.bar(['a', 'b'], [3, 4], label='g'); plt.show()")
    bar = bars.results[0].chart
    assert isinstance(bar, BarChart)
    assert [(e.label, e.value, e.group) for e in bar.elements] == [("a", 3, "g"), ("b", 4, "g")]
    assert bar.to_dict()["x_scale"] == "categorical"
    sideways = sbx.run_code(_PLOT + "plt.barh(['a', 'b'], [3, 4]); plt.xlabel('n'); plt.show()")
    barh = sideways.results[0].chart
    assert isinstance(barh, BarChart) and barh.y_label == "n", "the value axis is y"
    assert [(e.label, e.value) for e in barh.elements] == [("a", 3), ("b", 4)]

    pie = sbx.run_code(_PLOT + "plt.pie([1, 3], labels=['x', 'y']); plt.show()")
    wedges = pie.results[0].chart
    assert isinstance(wedges, PieChart)
    assert [(e.label, round(e.angle)) for e in wedges.elements] == [("x", 90), ("y", 270)]

    both = (
        sbx.run_code(
            _PLOT + "fig, (a, b) = plt.subplots(1, 2); fig.suptitle('two')\n"
            "a.plot([1, 2], [1, 2]); b.scatter([1], [1]); plt.show()"
        )
        .results[0]
        .chart
    )
    assert isinstance(both, SuperChart) and both.title == "two"
    assert [type(c) for c in both.elements] == [LineChart, ScatterChart]


def test_a_dataframe_result_carries_its_data(sbx: Sandbox) -> None:
    """E2B's ``e2b/data``: a DataFrame as ``to_dict(orient="list")``, NaN as null."""
    main = sbx.run_code(
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [0.5, float('nan')], "
        "'when': pd.to_datetime(['2024-01-01', '2024-01-02'])})"
    ).results[0]
    assert main.data is not None and main.data["a"] == [1, 2] and main.data["b"] == [0.5, None]
    assert main.data["when"][0].startswith("2024-01-01")
    assert "<table" in (main.html or "")


def test_shell_lines_and_magics_run_as_in_ipython(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    shell = sbx.run_code("!echo from-shell\nfiles = !printf 'a\\nb\\n'\nfiles", context=ctx)
    assert shell.error is None and shell.logs.stdout == ["from-shell\n"]
    assert shell.text == "['a', 'b']"
    moved = sbx.run_code("%cd /tmp\nimport os\nos.getcwd()", context=ctx)
    assert moved.text == "/tmp" and sbx.run_code("%pwd", context=ctx).text == "/tmp"
    sbx.run_code("%env GREETING=hi", context=ctx)
    assert sbx.run_code("%env GREETING", context=ctx).text == "hi"
    assert sbx.run_code("%matplotlib inline\n1 + 1", context=ctx).text == "2"
    bash = sbx.run_code("%%bash\necho $((6 * 7))", context=ctx)
    assert bash.logs.stdout == ["42\n"]
    wrote = sbx.run_code("%%writefile /tmp/magic.txt\nwritten by a magic\n", context=ctx)
    assert wrote.error is None and sbx.files.read("/tmp/magic.txt") == "written by a magic\n"
    unknown = sbx.run_code("%nosuchmagic", context=ctx)
    assert unknown.error is not None and unknown.error.name == "UsageError"
    assert sbx.run_code("x = 7 % 4\nx", context=ctx).text == "3", "a modulo is no magic"
