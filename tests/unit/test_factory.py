import logging

import pytest

from ringfence.backends import BACKENDS, create_executor
from ringfence.backends.process import ProcessExecutor
from ringfence.config import Config
from ringfence.errors import InvalidRequest, UnknownBackend
from ringfence.models import ExecutionRequest, Mount


def test_an_unknown_backend_is_an_error_listing_the_valid_ones() -> None:
    with pytest.raises(UnknownBackend) as exc:
        create_executor(Config(backend="docker"))
    assert exc.value.code == "unknown_backend"
    for name in BACKENDS:
        assert name in exc.value.message


def test_sandbox_backend_variable_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_BACKEND", "process")
    assert Config().backend == "process"
    monkeypatch.delenv("SANDBOX_BACKEND")
    assert Config().backend == "local", "the isolated backend is the default"


def test_the_process_backend_says_it_has_no_isolation(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        executor = create_executor(Config(backend="process"))
    assert isinstance(executor, ProcessExecutor)
    assert "NO isolation" in caplog.text


def test_the_process_backend_refuses_what_it_cannot_do() -> None:
    executor = ProcessExecutor(Config(backend="process"))
    with pytest.raises(InvalidRequest):
        executor.check(ExecutionRequest(command=["true"], mounts=[Mount.parse("/a:/b")]))
    with pytest.raises(InvalidRequest):
        executor.check(ExecutionRequest(command=["true"], image="/srv/rootfs"))
