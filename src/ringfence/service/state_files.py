"""Where sandbox state lives on the server's disk, under ``<data_dir>/state`` (0700, the
server's only; nothing of it is ever mounted into a sandbox):

- ``paused/<sandbox id>/files``: the export a sandbox paused to disk resumes from (written
  by the runtime, sealed by it, checked by it before a restore);
- ``paused/<sandbox id>/launch``: what else its resume needs (template root, limits,
  environment and egress policy, values included), sealed under the credentials key for
  that tenant's sandbox only (``CredentialKey.seal_state``): never in clear;
- ``snapshots/<snapshot id>``: a snapshot's export, for new sandboxes to start from;
- ``forks/<random>``: a fork's one export of its parent, removed once its children run.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from pathlib import Path

from ringfence.backends import LaunchSpec
from ringfence.errors import SandboxError
from ringfence.models import NetworkPolicy, ResourceLimits
from ringfence.service.credentials import CredentialKey

__all__ = ["StateFiles"]

_ID = re.compile(r"^[a-z]{2}[0-9a-f]{8,64}$")  # sandbox and snapshot ids: safe path parts


class StateFiles:
    """The directories of paused sandboxes, snapshots and forks (see the module docstring)."""

    def __init__(self, data_dir: Path, key: CredentialKey) -> None:
        self._root = data_dir / "state"
        self._key = key

    def paused_export(self, sandbox_id: str) -> Path:
        """Where a paused sandbox's export goes (its directory made; the export not)."""
        directory = self._dir("paused", sandbox_id)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return directory / "files"

    def save_launch(self, tenant: str, sandbox_id: str, launch: LaunchSpec) -> None:
        """Keep what the paused sandbox's resume needs besides its files, sealed."""
        kept = {
            "image": launch.image,
            "env": launch.env,
            "limits": launch.limits.model_dump(mode="json"),
            "network": None if launch.network is None else launch.network.model_dump(mode="json"),
        }
        sealed = self._key.seal_state(
            json.dumps(kept).encode(), tenant=tenant, sandbox_id=sandbox_id
        )
        path = self._dir("paused", sandbox_id) / "launch"
        path.write_bytes(sealed)
        path.chmod(0o600)

    def load_launch(self, tenant: str, sandbox_id: str, timeout: float) -> LaunchSpec:
        """The launch of a paused sandbox's resume, on its export, for ``timeout`` seconds.

        Raises:
            SandboxError: nothing of it is on this server's disk (another replica paused
                it, or its directory was removed).
            Conflict: its sealed part cannot be opened (another key, altered).
        """
        directory = self._dir("paused", sandbox_id)
        try:
            sealed = (directory / "launch").read_bytes()
        except OSError as exc:
            raise SandboxError(
                f"sandbox {sandbox_id} was paused, but its saved state is not on this "
                f"server's disk ({exc.strerror}): it cannot be resumed here"
            ) from exc
        kept = json.loads(self._key.open_state(sealed, tenant=tenant, sandbox_id=sandbox_id))
        network = kept["network"]
        return LaunchSpec(
            image=kept["image"],
            env=kept["env"],
            limits=ResourceLimits.model_validate(kept["limits"]),
            timeout=timeout,
            network=None if network is None else NetworkPolicy.model_validate(network),
            restore=directory / "files",
        )

    def forget_paused(self, sandbox_id: str) -> None:
        """Remove a paused sandbox's directory (resumed, or killed)."""
        shutil.rmtree(self._dir("paused", sandbox_id), ignore_errors=True)

    def snapshot(self, snapshot_id: str) -> Path:
        """Where a snapshot's export is (its parent made)."""
        return self._dir("snapshots", snapshot_id)

    def new_fork(self) -> Path:
        """A fresh place for a fork's export (its parent made)."""
        return self._dir("forks", "fk" + secrets.token_hex(10))

    def remove(self, path: Path) -> None:
        """Remove an export (a snapshot deleted, a fork's once its children run)."""
        shutil.rmtree(path, ignore_errors=True)

    def _dir(self, kind: str, name: str) -> Path:
        if not _ID.fullmatch(name):
            raise ValueError(f"not an id of ours: {name!r}")
        parent = self._root / kind
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._root.chmod(0o700)
        return parent / name
