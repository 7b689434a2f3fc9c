"""The egress options shared by ``ringfence exec`` and ``ringfence sandbox create``:
``--allow-domain``, ``--deny-domain`` and ``--network FILE.json`` (docs/network.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from ringfence.models import NetworkPolicy

__all__ = ["network_options", "policy_from_options", "read_policy"]

F = TypeVar("F", bound=Callable[..., Any])


def network_options(function: F) -> F:
    """The three options, passed on as ``allow_domains``, ``deny_domains``, ``network_file``."""
    function = click.option(
        "--network",
        "network_file",
        type=click.File("r"),
        metavar="FILE.json",
        help="The whole egress policy, as JSON ('-': stdin); not with --allow/--deny-domain.",
    )(function)
    function = click.option(
        "--deny-domain",
        "deny_domains",
        multiple=True,
        metavar="DOMAIN[:PORTS]",
        help="Refuse this destination even where an allow rule matches (repeatable).",
    )(function)
    return click.option(
        "--allow-domain",
        "allow_domains",
        multiple=True,
        metavar="DOMAIN[:PORTS]",
        help="Let the sandbox reach DOMAIN (or '*.suffix') through Ringfence's proxy, on "
        "PORTS (comma-separated) [default: 80,443] (repeatable). Without any: no network, "
        "or the tenant's default.",
    )(function)


def policy_from_options(
    allow_domains: tuple[str, ...], deny_domains: tuple[str, ...], network_file: IO[str] | None
) -> NetworkPolicy | None:
    """The policy the options give; ``None`` when none was given.

    Raises:
        click.UsageError: both a file and domains, a bad port, an invalid policy.
    """
    if network_file is not None:
        if allow_domains or deny_domains:
            raise click.UsageError("--network FILE is the whole policy: no --allow/--deny-domain")
        return read_policy(network_file)
    if not allow_domains and not deny_domains:
        return None
    rules = [_rule("allow", item) for item in allow_domains]
    rules += [_rule("deny", item) for item in deny_domains]
    return _validated({"mode": "rules", "rules": rules}, "--allow-domain/--deny-domain")


def read_policy(source: IO[str]) -> NetworkPolicy:
    """A policy from a JSON file. Raises ``click.UsageError`` naming what is wrong."""
    name = getattr(source, "name", "-")
    try:
        data = json.loads(source.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"{name}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise click.UsageError(f'{name}: a policy is a JSON object, like {{"rules": [...]}}')
    return _validated(data, name)


def _rule(action: str, item: str) -> dict[str, Any]:
    option = f"--{action}-domain"
    domain, sep, ports = item.partition(":")
    rule: dict[str, Any] = {"action": action, "domain": domain}
    if sep:
        try:
            rule["ports"] = [int(port) for port in ports.split(",")]
        except ValueError:
            example = f"{domain}:443,8443"
            raise click.UsageError(
                f"{option} {item!r}: ports are numbers, e.g. {example}"
            ) from None
    return rule


def _validated(data: dict[str, Any], where: str) -> NetworkPolicy:
    from pydantic import ValidationError

    from ringfence.cli._common import validation_message
    from ringfence.models import NetworkPolicy

    try:
        return NetworkPolicy.model_validate(data)
    except ValidationError as exc:
        raise click.UsageError(f"{where}: {validation_message(exc)}") from None
