"""Helpers shared by the CLI commands."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click
from pydantic import ValidationError
from pydantic_settings import SettingsError

from ringfence.config import Config
from ringfence.models import problems, said

__all__ = ["OneLineErrors", "fail", "settings", "validation_message"]


def fail(message: str, code: int) -> NoReturn:
    """Print ``ringfence: message`` on stderr and exit with ``code``."""
    click.echo(f"ringfence: {message}", err=True)
    sys.exit(code)


def validation_message(exc: ValidationError | ValueError) -> str:
    """One line naming each problem's field: what a user needs to fix their input. A bad
    setting is named by its environment variable (``RINGFENCE_POOL_SIZES``)."""
    if isinstance(exc, ValidationError) and exc.title == Config.__name__:
        found = []
        for error in exc.errors():
            name, *inner = [str(part) for part in error["loc"]] or ["input"]
            where = ".".join([_variable(name), *inner])
            found.append(f"{where}: {said(error)}")
        return " ".join("; ".join(found).split())
    if isinstance(exc, SettingsError):  # a value that is not even JSON
        match = re.search(r'field "(\w+)"', str(exc))
        name = _variable(match.group(1)) if match else "a RINGFENCE_* setting"
        return f"{name}: not valid JSON ({exc.__cause__ or exc})"
    return problems(exc)


def _variable(field: str) -> str:
    return f"RINGFENCE_{field.upper()}" if field in Config.model_fields else field


def settings(**overrides: Any) -> Config:
    """The configuration, with the options given on the command line taking precedence."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return Config(**given)


class OneLineErrors(click.Group):
    """The CLI's promise, for every command: an error is one line on stderr (``ringfence:
    ...``) and a non-zero exit, 2 for bad input (a bad option, a bad ``RINGFENCE_*``
    setting), never a usage dump or a traceback."""

    def main(  # type: ignore[override]
        self, args: Sequence[str] | None = None, standalone_mode: bool = True, **extra: Any
    ) -> Any:
        if not standalone_mode:
            return super().main(args, standalone_mode=False, **extra)
        try:
            code = super().main(args, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            fail("interrupted", 130)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            fail(" ".join(exc.format_message().split()) + hint, exc.exit_code)
        except click.ClickException as exc:
            fail(" ".join(exc.format_message().split()), exc.exit_code)
        except (ValidationError, SettingsError) as exc:  # reading the configuration
            fail(validation_message(exc), 2)
        except Exception as exc:  # the top-level boundary: still one line
            fail(f"{type(exc).__name__}: {problems(exc)}", 1)
        sys.exit(code if isinstance(code, int) else 0)
