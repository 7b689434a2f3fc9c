"""``ringfence k8s``: what an operator applies to run Ringfence on Kubernetes."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import shutil
import tempfile
from pathlib import Path

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
@click.option(
    "--seal-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The audit seal key every replica signs with (a data directory's audit-seal-key); "
    "without it a new key is made: keep it, or the next render replaces it.",
)
@click.option(
    "--credentials-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The key every replica seals and opens proposals' credentials with (a data "
    "directory's credentials-key); without it a new key is made: keep it, or proposals "
    "pending at the next render cannot run.",
)
@click.option("--replicas", default=2, show_default=True, type=click.IntRange(1, 100))
def render(
    runtime_class: str | None,
    target_namespace: str,
    api_server_cidrs: tuple[str, ...],
    database_url: str | None,
    seal_key_file: Path | None,
    credentials_key_file: Path | None,
    replicas: int,
) -> None:
    """Print the manifests (a YAML stream; each document is JSON) for kubectl apply -f -.

    The sandbox namespace with its ServiceAccount, least-privilege Roles, NetworkPolicies
    (DNS and the API server only; for Pods with an egress policy, the control plane's egress
    proxy only), ResourceQuota and LimitRange; the optional RuntimeClass; and the control
    plane: Deployment, Service, ConfigMap and a Secret with the database URL.
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
    options = dataclasses.replace(
        options,
        seal_key=_seal_key(seal_key_file),
        credentials_key=_credentials_key(credentials_key_file),
    )
    for manifest in cluster_manifests(options):
        click.echo("---")
        click.echo(json.dumps(manifest, indent=2))


def _seal_key(path: Path | None) -> str:
    """The seal key's file text: read from ``path`` (checked), or a new key's."""
    from ringfence.audit.signing import KEY_FILE, SealKey

    if path is None:
        directory = Path(tempfile.mkdtemp())
        try:
            SealKey.load_or_create(directory)
            text = (directory / KEY_FILE).read_text()
        finally:
            shutil.rmtree(directory)
        click.echo(
            "ringfence: a new audit seal key is in the Secret ringfence-audit-seal-key; "
            "render again with --seal-key-file to keep it",
            err=True,
        )
        return text
    try:
        text = path.read_text()
        _check_seal_key(text)
    except (OSError, ValueError) as exc:
        fail(f"--seal-key-file: {path} holds no seal key: {exc}", _EXIT_USAGE)
    return text


def _credentials_key(path: Path | None) -> str:
    """The credentials key's file text: read from ``path`` (checked), or a new key's."""
    from ringfence.service.credentials import KEY_FILE, CredentialKey

    if path is None:
        directory = Path(tempfile.mkdtemp())
        try:
            CredentialKey.load_or_create(directory)
            text = (directory / KEY_FILE).read_text()
        finally:
            shutil.rmtree(directory)
        click.echo(
            "ringfence: a new credentials key is in the Secret ringfence-credentials-key; "
            "render again with --credentials-key-file to keep it",
            err=True,
        )
        return text
    try:
        text = path.read_text()
        CredentialKey.from_text(text)
    except (OSError, ValueError) as exc:
        fail(f"--credentials-key-file: {path} holds no credentials key: {exc}", _EXIT_USAGE)
    return text


def _check_seal_key(text: str) -> None:
    """Raises ``ValueError`` unless ``text`` is a seal key's file."""
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    Ed25519PrivateKey.from_private_bytes(base64.b64decode(text.strip(), validate=True))
