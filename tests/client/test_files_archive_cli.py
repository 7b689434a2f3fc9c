"""A sandbox's directory as a tar archive from the SDK (``read_archive``,
``download_dir``) and ``ringfence files archive``, against a real server."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from ringfence.client import Sandbox
from tests.client.conftest import LiveServer
from tests.server.test_serve_process import RINGFENCE


def _cli(live: LiveServer, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "RINGFENCE_URL": live.url, "RINGFENCE_API_KEY": live.key}
    return subprocess.run([RINGFENCE, *args], env=env, capture_output=True, timeout=60)


def test_a_directory_comes_out_as_a_tar_from_the_sdk_and_the_cli(
    live: LiveServer, tmp_path: Path
) -> None:
    with Sandbox.create(url=live.url, api_key=live.key) as sbx:
        sbx.files.write("out/report.txt", "done")
        sbx.files.write("out/sub/data.bin", b"\x00\x01" * 1000)
        sbx.commands.run("ln -s /etc/passwd /home/user/out/passwd-link")
        sbx.commands.run("ln -s sub/data.bin /home/user/out/data-link")

        streamed = b"".join(sbx.files.read_archive("out"))
        with tarfile.open(fileobj=io.BytesIO(streamed), mode="r:") as tar:
            names = {"report.txt", "sub", "sub/data.bin", "passwd-link", "data-link"}
            assert names == set(tar.getnames())

        copied = sbx.files.download_dir("out", tmp_path / "copy")
        assert (copied / "report.txt").read_text() == "done"
        assert (copied / "sub" / "data.bin").read_bytes() == b"\x00\x01" * 1000
        assert os.readlink(copied / "data-link") == "sub/data.bin"  # a link inside stays one
        assert not os.path.lexists(copied / "passwd-link"), "it points outside: left out"

        saved = tmp_path / "out.tar"
        done = _cli(live, "files", "archive", sbx.sandbox_id, "out", "-o", str(saved))
        assert done.returncode == 0, done.stderr
        with tarfile.open(saved) as tar:
            assert "sub/data.bin" in tar.getnames()
        piped = _cli(live, "files", "archive", sbx.sandbox_id, "out")
        assert piped.returncode == 0 and piped.stdout == saved.read_bytes()
        extracted = _cli(live, "files", "archive", sbx.sandbox_id, "out", "-x", str(tmp_path / "x"))
        assert extracted.returncode == 0, extracted.stderr
        assert (tmp_path / "x" / "report.txt").read_text() == "done"
        missing = _cli(live, "files", "archive", sbx.sandbox_id, "nope")
        assert missing.returncode == 1 and b"Traceback" not in missing.stderr
