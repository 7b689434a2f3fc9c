"""The composition root: what it builds, what it refuses, and what it closes (only its own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringfence import compose
from ringfence.audit.signing import SealKey
from ringfence.backends.process import ProcessExecutor
from ringfence.compose import build_services, start_job_egress
from ringfence.config import Config
from ringfence.errors import InvalidRequest, RingfenceError
from ringfence.service.credentials import KEY_FILE, CredentialKey
from ringfence.store import MemoryStore, factory


class _CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.closes = 0

    async def aclose(self) -> None:
        self.closes += 1
        await super().aclose()


def _config(data_dir: Path, **settings: object) -> Config:
    return Config(backend="process", data_dir=data_dir, pool_sizes={}, **settings)


async def test_a_given_store_is_used_and_left_open_for_its_caller(tmp_path: Path) -> None:
    store = _CountingStore()
    config = _config(tmp_path)
    async with await build_services(
        config, store=store, executor=ProcessExecutor(config),
        seal_key=SealKey.generate(), credentials=CredentialKey.generate(),
    ) as services:  # fmt: skip
        assert services.store is store
        assert services.approvals is not None and services.runtime is None  # process: none
    assert store.closes == 0
    assert not any(tmp_path.iterdir()), "nothing read from or written to the data directory"


async def test_the_first_admin_key_is_made_only_when_asked(tmp_path: Path) -> None:
    config = _config(tmp_path)
    store = MemoryStore()

    async def build(**told: object) -> None:
        await build_services(
            config, store=store, executor=ProcessExecutor(config), seal_key=SealKey.generate(),
            credentials=CredentialKey.generate(), **told,  # type: ignore[arg-type]
        )  # fmt: skip

    await build()
    assert await store.list_keys() == [] and not (tmp_path / "admin-key").exists()
    told: list[Path] = []
    await build(on_first_admin_key=told.append)
    [key] = await store.list_keys()
    assert told == [tmp_path / "admin-key"] and told[0].exists() and key.tenant == "default"


async def test_webhook_urls_without_a_secret_fail_the_build(tmp_path: Path) -> None:
    config = _config(tmp_path, webhook_urls=["http://127.0.0.1:9/hook"])
    store = _CountingStore()
    with pytest.raises(InvalidRequest) as refused:
        await build_services(
            config, store=store, executor=ProcessExecutor(config),
            seal_key=SealKey.generate(), credentials=CredentialKey.generate(),
        )  # fmt: skip
    assert refused.value.code == "invalid_request"
    assert store.closes == 0, "a given store is its caller's, even when the build fails"


async def test_a_credentials_key_others_may_read_fails_the_build_closed(tmp_path: Path) -> None:
    CredentialKey.load_or_create(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    config = _config(tmp_path)
    with pytest.raises(RingfenceError) as refused:
        await build_services(
            config, store=MemoryStore(), executor=ProcessExecutor(config),
            seal_key=SealKey.generate(),
        )  # fmt: skip
    assert refused.value.code == "error"


class _BrokenClose(Exception):
    """What a part's ``aclose`` raises here: never the error a failed build reports."""


async def test_a_cleanup_that_raises_does_not_hide_why_the_build_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    closed: list[str] = []

    class BrokenExecutor(ProcessExecutor):
        async def aclose(self) -> None:
            closed.append("executor")
            raise _BrokenClose

    class BrokenStore(MemoryStore):
        async def aclose(self) -> None:
            closed.append("store")
            raise _BrokenClose

    async def open_store(config: Config) -> MemoryStore:
        return BrokenStore()

    monkeypatch.setattr(compose, "create_executor", BrokenExecutor)
    monkeypatch.setattr(factory, "open_store", open_store)
    config = _config(tmp_path, webhook_urls=["http://127.0.0.1:9/hook"])  # no secret
    with pytest.raises(InvalidRequest, match="RINGFENCE_WEBHOOK_SECRET"):
        await build_services(config, seal_key=SealKey.generate())
    assert closed == ["store", "executor"], "each part closed, last opened first"
    assert "failed build" in caplog.text


async def test_the_replica_egress_is_only_the_job_backends(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with pytest.raises(TypeError):
        await start_job_egress(config, ProcessExecutor(config), None)
