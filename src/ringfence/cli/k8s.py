"""``ringfence k8s``: what an operator applies to run Ringfence on Kubernetes."""

from __future__ import annotations

import dataclasses
import ipaddress
import json

import click
from pydantic import ValidationError

from ringfence.cli._common import fail, settings, validation_message

__all__ = ["k8s"]

_EXIT_USAGE = 2


@click.group()
def k8s() -> None:
    """Manifests for running Ringfence on Kubernetes."""


@k8s.command()
@click.option(
    "--runtime-class",
    help="Run sandboxes under this RuntimeClass (gvisor: handler runsc; kata: handler kata), "
    "and render it.",
)
@click.option(
    "--target-namespace",
    default="default",
    show_default=True,
    help="Namespace remediations act on (the sandbox account's Role is there).",
)
@click.option(
    "--api-server-cidr",
    "api_server_cidrs",
    multiple=True,
    help="Address of an API server endpoint (repeatable; see kubectl get endpoints kubernetes) "
    "[default: $RINGFENCE_KUBERNETES_API_SERVER_CIDRS, 10.96.0.1/32].",
)
@click.option(
    "--database-url",
    help="PostgreSQL URL the control plane's replicas share (goes into a Secret).",
)
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 100))
def render(
    runtime_class: str | None,
    target_namespace: str,
    api_server_cidrs: tuple[str, ...],
    database_url: str | None,
    replicas: int,
) -> None:
    """Print the manifests (a YAML stream; each document is JSON) for kubectl apply -f -.

    The sandbox namespace with its ServiceAccount, least-privilege Roles, NetworkPolicy
    (DNS and the API server only), ResourceQuota and LimitRange; the optional RuntimeClass;
    and the control plane: Deployment, Service, ConfigMap and a Secret with the database URL.
    """
    from ringfence.backends.kubernetes.cluster import ClusterSettings, cluster_manifests

    for cidr in api_server_cidrs:
        try:
            ipaddress.ip_network(cidr)
        except ValueError:
            fail(f"--api-server-cidr: {cidr!r} is not an address or CIDR block", _EXIT_USAGE)
    try:
        config = settings(
            runtime_class_name=runtime_class,
            kubernetes_api_server_cidrs=list(api_server_cidrs) or None,
        )
    except ValidationError as exc:
        fail(validation_message(exc), _EXIT_USAGE)
    options = ClusterSettings(
        config=config,
        runtime_class=runtime_class,
        target_namespace=target_namespace,
        replicas=replicas,
    )
    if database_url:
        options = dataclasses.replace(options, database_url=database_url)
    for manifest in cluster_manifests(options):
        click.echo("---")
        click.echo(json.dumps(manifest, indent=2))
