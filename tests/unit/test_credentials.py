"""The credentials key: a private file made once and kept; seals that open only for the
proposal they were made for, and markers that bind each value without showing it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ringfence.errors import Conflict
from ringfence.models import NetworkPolicy
from ringfence.service.credentials import KEY_FILE, CredentialKey, is_marker

SECRET = "s3cr3t-token"
CP1 = {"tenant": "acme", "proposal_id": "cp1"}


def _policy(value: str = SECRET) -> NetworkPolicy:
    return NetworkPolicy.model_validate(
        {"rules": [{"domain": "api.vendor.example", "headers": {"Authorization": value}}]}
    )


def test_the_key_file_is_made_private_once_and_kept(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = CredentialKey.load_or_create(data)
    mode = (data / KEY_FILE).stat().st_mode
    assert stat.S_IMODE(mode) == 0o600 and stat.S_IMODE(data.stat().st_mode) == 0o700
    sealed = first.seal(_policy(), tenant="acme", proposal_id="cp1")
    again = CredentialKey.load_or_create(data)  # a restart
    marked = first.marked(_policy(), **CP1)
    assert again.open(sealed, marked, tenant="acme", proposal_id="cp1") == _policy()
    assert [p.name for p in data.iterdir()] == [KEY_FILE], "no temporary file left"


def test_a_key_file_others_may_read_or_that_holds_no_key_is_refused(tmp_path: Path) -> None:
    CredentialKey.load_or_create(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(ValueError, match="readable by every user"):
        CredentialKey.load_or_create(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o600)
    (tmp_path / KEY_FILE).write_text("not base64!\n")
    with pytest.raises(ValueError, match="holds no credentials key"):
        CredentialKey.load_or_create(tmp_path)


def test_markers_bind_each_value_and_show_none() -> None:
    key, other = CredentialKey.generate(), CredentialKey.generate()
    [rule] = key.marked(_policy(), **CP1).rules
    marker = rule.headers["Authorization"]
    assert is_marker(marker) and SECRET not in marker
    assert key.marked(_policy(), **CP1) == key.marked(_policy(), **CP1), "same value, marker"
    assert key.marked(_policy("other"), **CP1) != key.marked(_policy(), **CP1)
    assert other.marked(_policy(), **CP1) != key.marked(_policy(), **CP1), (
        "nobody without the key tests one"
    )
    assert not is_marker(SECRET) and not is_marker("<redacted>")


def test_a_value_shows_the_same_marker_only_within_its_proposal() -> None:
    """Markers equal across proposals were a guessing oracle: any key that may propose could
    propose a guessed value and compare its marker with another proposal's."""
    key = CredentialKey.generate()
    mine = key.marked(_policy(), **CP1)
    for tenant, proposal_id in (("acme", "cp2"), ("globex", "cp1")):
        theirs = key.marked(_policy(), tenant=tenant, proposal_id=proposal_id)
        assert theirs != mine, f"{tenant}/{proposal_id}: the same credential, another marker"
    policy = NetworkPolicy.model_validate(
        {"rules": [{"domain": "a.example", "headers": {"X-Key": SECRET, "X-Other": SECRET}}]}
    )
    [rule] = key.marked(policy, **CP1).rules
    assert rule.headers["X-Key"] != rule.headers["X-Other"], "bound to the header's name too"
    sealed = key.seal(policy, **CP1)
    assert key.open(sealed, key.marked(policy, **CP1), **CP1) == policy  # the run-time check


def test_a_seal_opens_only_for_its_proposal_under_its_key() -> None:
    key = CredentialKey.generate()
    sealed = key.seal(_policy(), tenant="acme", proposal_id="cp1")
    marked = key.marked(_policy(), **CP1)
    assert SECRET not in sealed
    for tenant, proposal_id in (("globex", "cp1"), ("acme", "cp2")):
        with pytest.raises(Conflict):
            key.open(sealed, marked, tenant=tenant, proposal_id=proposal_id)
    with pytest.raises(Conflict):
        CredentialKey.generate().open(sealed, marked, tenant="acme", proposal_id="cp1")
    with pytest.raises(Conflict):
        key.open(sealed[:-4] + "AAAA", marked, tenant="acme", proposal_id="cp1")
    with pytest.raises(Conflict):  # a value that is not the one the approved marker binds
        key.open(sealed, key.marked(_policy("other"), **CP1), tenant="acme", proposal_id="cp1")
    with pytest.raises(Conflict):
        key.open("not base64", marked, tenant="acme", proposal_id="cp1")
