"""The CLI's promise, walked over every command and every ``RINGFENCE_*`` setting: a bad
value is one line on stderr (``ringfence: ...``) naming what is wrong, and exit 2; never a
usage dump, a multi-line pydantic report or a traceback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner, Result

from ringfence.cli import main
from ringfence.config import Config

# Types click checks itself, and a value each refuses.
_REFUSED_BY_TYPE = {
    "integer": "many",
    "integer range": "-99999999",
    "float": "soon",
    "float range": "-1e300",
    "choice": "no-such-choice",
    "directory": "/etc/hostname",  # a file (a missing directory may be created)
    "path": "/no/such/\0path",
}


def _leaves(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name)


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _filled(command: click.Command) -> list[str]:
    """Placeholders for the command's required arguments and options."""
    filled = []
    for param in command.params:
        if isinstance(param, click.Option) and param.required:
            filled += [param.opts[0], "/no/such/placeholder"]
    for param in command.params:
        if isinstance(param, click.Argument) and param.required:
            filled.append("1" if param.type.name == "float" else "x")
    return filled


def _bad_options() -> Iterator[object]:
    for path in _leaves(main):
        command = _command(path)
        for param in command.params:
            bad = _REFUSED_BY_TYPE.get(param.type.name)
            if isinstance(param, click.Option) and bad is not None and not param.is_flag:
                yield pytest.param(
                    [*path, param.opts[0], bad, *_filled(command)],
                    param.opts[0],
                    # A path click cannot judge reaches the command, which refuses it.
                    1 if param.type.name == "path" else 2,
                    id=" ".join((*path, param.opts[0])),
                )


def _assert_one_line(result: Result, *named: str, code: int = 2) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ringfence: "), result.stderr
    for name in named:
        assert name in lines[0], lines[0]


@pytest.mark.parametrize(("args", "option", "code"), list(_bad_options()))
def test_every_option_given_a_bad_value_fails_in_one_line(
    args: list[str], option: str, code: int
) -> None:
    result = CliRunner().invoke(main, args)
    _assert_one_line(result, *([option] if code == 2 else []), code=code)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["exec", "--memory", "1K", "--", "true"], "memory"),
        (["exec", "--pids", "1", "--", "true"], "pids"),
        (["exec", "--cpus", "5e-324", "--", "true"], "cpus"),
        (["exec", "--env", "1A=b", "--", "true"], "env"),
        (["exec", "--timeout", "-1", "--", "true"], "timeout"),
        (["exec", "--mount", "relative:/x", "--", "true"], "absolute"),
        (["exec", "--bogus"], "--bogus"),
        (["exec"], "COMMAND"),
        (["sandbox", "create", "--pids", "4", "--api-key", "k"], "pids"),
        (["sandbox", "create", "--memory", "4M", "--api-key", "k"], "memory"),
        (["sandbox", "create", "--metadata", "novalue", "--api-key", "k"], "--metadata"),
        (["sandbox", "create", "--env", "1A=b", "--api-key", "k"], "env"),
        (["propose", "--rationale", "r", "--env", "x", "--api-key", "k", "--", "true"], "--env"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_bad_values_the_commands_check_fail_in_one_line(args: list[str], named: str) -> None:
    _assert_one_line(CliRunner().invoke(main, args), named)


def _refused(field: str) -> str | None:
    """A value of ``RINGFENCE_<FIELD>`` that the configuration refuses, if there is one."""
    variable = f"RINGFENCE_{field.upper()}"
    for value in ("{not json", "-1", "soon", "[]", '{"x": {"y": 1}}', "0"):
        os.environ[variable] = value
        try:
            Config()
        except ValueError:
            return value
        finally:
            del os.environ[variable]
    return None  # every text is a valid value (a name, a URL)


_SETTINGS = [(name, bad) for name in Config.model_fields if (bad := _refused(name)) is not None]


def test_most_settings_have_a_value_to_refuse() -> None:
    assert len(_SETTINGS) >= len(Config.model_fields) // 2, _SETTINGS


@pytest.mark.parametrize(("field", "bad"), _SETTINGS, ids=[name for name, _ in _SETTINGS])
def test_every_bad_setting_fails_in_one_line_naming_it(field: str, bad: str) -> None:
    variable = f"RINGFENCE_{field.upper()}"
    for args in (["exec", "--", "true"], ["serve", "--port", "1"]):
        _assert_one_line(CliRunner().invoke(main, args, env={variable: bad}), variable)


@pytest.mark.parametrize("defaults", ['{"pids": 4}', '{"memory": "8M"}'])
def test_defaults_too_small_for_a_sandboxs_daemon_are_refused_at_start(defaults: str) -> None:
    # Every sandbox created with defaults, and the warm pool, would fail to start.
    result = CliRunner().invoke(
        main, ["serve", "--port", "1"], env={"RINGFENCE_DEFAULT_LIMITS": defaults}
    )
    _assert_one_line(result, "RINGFENCE_DEFAULT_LIMITS", "interactive sandbox")
