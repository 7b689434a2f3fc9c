"""The blocking ``Sandbox`` through a whole scenario, configured from the environment."""

from __future__ import annotations

import threading

import pytest

from ringfence.client import (
    CommandTimeout,
    FileNotFound,
    OutputChunk,
    Sandbox,
    SandboxNotFound,
)
from ringfence.models import SandboxState
from tests.client.conftest import LiveServer


@pytest.mark.every_store
def test_a_whole_session_with_the_sync_sandbox(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RINGFENCE_URL", live.url)
    monkeypatch.setenv("RINGFENCE_API_KEY", live.key)
    with Sandbox.create(metadata={"suite": "sync"}, timeout=120) as sbx:
        assert [s.id for s in Sandbox.list(metadata={"suite": "sync"})] == [sbx.id]
        first = threading.Event()
        chunks: list[str] = []

        def on_stdout(text: str) -> None:
            chunks.append(text)
            first.set()

        handle = sbx.commands.run(
            "echo ready; cat; exit 2", background=True, stdin=True, on_stdout=on_stdout
        )
        assert first.wait(30)  # output arrives while the command still runs
        handle.send_stdin("more\n")
        handle.close_stdin()
        result = handle.wait()
        assert (result.stdout, result.exit_code) == ("ready\nmore\n", 2)
        assert "".join(chunks) == result.stdout

        background = sbx.commands.run("echo a; echo b >&2", background=True)
        assert sorted(c.stream for c in background) == ["stderr", "stdout"]
        assert isinstance(OutputChunk("stdout", ""), OutputChunk)

        with pytest.raises(CommandTimeout):
            sbx.commands.run("sleep 30", timeout=0.3)

        sbx.files.write("dir/file.txt", "hi")
        assert sbx.files.read("dir/file.txt") == "hi"
        assert b"".join(sbx.files.read_stream("dir/file.txt")) == b"hi"
        assert [e.name for e in sbx.files.list("dir")] == ["file.txt"]
        watch = sbx.files.watch_dir("dir")
        sbx.files.write("dir/other.txt", "x")
        names = set()
        for event in watch:
            names.add(event.name)
            if "other.txt" in names:
                break
        watch.stop()
        with pytest.raises(FileNotFound):
            sbx.files.read("missing")

        again = Sandbox.connect(sbx.id)
        assert again.set_timeout(300).expires_at is not None
        again.close()
        assert sbx.is_running()
    assert sbx.info().state is SandboxState.KILLED  # the with block killed it
    with pytest.raises(SandboxNotFound):
        Sandbox.connect(sbx.id, api_key=live.other_key)
