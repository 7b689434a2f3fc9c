"""Helpers shared by the CLI commands."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ringfence.config import Config

__all__ = ["fail", "settings", "validation_message"]


def fail(message: str, code: int) -> NoReturn:
    """Print ``ringfence: message`` on stderr and exit with ``code``."""
    click.echo(f"ringfence: {message}", err=True)
    sys.exit(code)


def validation_message(exc: ValidationError | ValueError) -> str:
    """One line per problem, naming the field: what a user needs to fix their input."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "input"
        lines.append(f"{where}: {error['msg']}")
    return "; ".join(lines)


def settings(**overrides: Any) -> Config:
    """The configuration, with the options given on the command line taking precedence."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return Config(**given)
