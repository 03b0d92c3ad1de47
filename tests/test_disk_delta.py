"""disk-delta's encodings, checksums, index and version chain (miles_core/disk_delta.py), and
its files (backends/common/wire/disk_delta.py): property tests over bytes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_core.disk_delta import (
    DeltaEncoding,
    DeltaError,
    DeltaIndex,
    checksum,
    decode,
    encode,
    plan_pull,
    verified_apply,
)
from miles_core.errors import ConfigError

ENCODINGS = st.sampled_from(list(DeltaEncoding))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """Two versions of one tensor's bytes (same size), often alike in most bytes."""
    old = draw(st.binary(min_size=1, max_size=64))
    changes = draw(st.dictionaries(st.integers(0, len(old) - 1), st.integers(0, 255)))
    new = bytearray(old)
    for i, value in changes.items():
        new[i] = value
    return old, bytes(new)


@given(pairs(), ENCODINGS)
def test_decode_undoes_encode(pair: tuple[bytes, bytes], encoding: DeltaEncoding) -> None:
    old, new = pair
    payload = encode(encoding, old, new)
    if old == new:
        assert payload is None  # an unchanged tensor is not written
    else:
        assert payload is not None
        assert decode(encoding, old, payload) == new
        assert verified_apply(encoding, old, payload, checksum(new)) == new


@given(pairs())
def test_xor_applied_twice_reverts_and_its_checksum_says_so(pair: tuple[bytes, bytes]) -> None:
    """xor is an involution: a second apply gives the base back. A delta holds only changed
    tensors, so the verifying apply's checksum of the NEW bytes catches the second apply."""
    old, new = pair
    payload = encode(DeltaEncoding.XOR, old, new)
    if payload is None:
        return
    twice = decode(DeltaEncoding.XOR, new, payload)
    assert twice == old
    with pytest.raises(DeltaError, match="checksum mismatch"):
        verified_apply(DeltaEncoding.XOR, new, payload, checksum(new))


@given(pairs())
def test_overwrite_applied_twice_is_harmless(pair: tuple[bytes, bytes]) -> None:
    old, new = pair
    payload = encode(DeltaEncoding.OVERWRITE, old, new)
    if payload is None:
        return
    assert decode(DeltaEncoding.OVERWRITE, new, payload) == new


@given(pairs(), ENCODINGS, st.data())
def test_a_torn_payload_is_refused_or_fails_its_checksum(
    pair: tuple[bytes, bytes], encoding: DeltaEncoding, data: st.DataObject
) -> None:
    """A truncated payload never passes the verifying apply."""
    old, new = pair
    payload = encode(encoding, old, new)
    if payload is None:
        return
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(DeltaError):
        verified_apply(encoding, old, payload[:cut], checksum(new))


@given(st.lists(st.binary(min_size=8, max_size=8), min_size=3, max_size=6), ENCODINGS)
def test_a_skipped_version_leaves_the_old_bytes(
    versions: list[bytes], encoding: DeltaEncoding
) -> None:
    """Skipping version k leaves the bytes of k-1; applying k+1 on them is caught by its
    checksum unless k changed nothing."""
    deltas = [encode(encoding, a, b) for a, b in itertools.pairwise(versions)]
    held = versions[0]
    payload = deltas[1]
    if deltas[0] is None or payload is None:
        return
    out = decode(encoding, held, payload) if encoding is DeltaEncoding.XOR else None
    if out is not None and out != versions[2]:
        with pytest.raises(DeltaError):
            verified_apply(encoding, held, payload, checksum(versions[2]))


def test_the_index_says_its_base_and_refuses_another() -> None:
    index = DeltaIndex(3, DeltaEncoding.OVERWRITE)
    meta = index.metadata()
    assert meta["version"] == "000003" and meta["base_version"] == "000002"
    assert DeltaIndex.read(meta) == index
    with pytest.raises(DeltaError, match="builds on 1"):
        DeltaIndex.read({**meta, "base_version": "000001"})
    with pytest.raises(DeltaError, match="unsupported"):
        DeltaIndex.read({**meta, "compression_format": "zstd"})


def test_the_chain_applies_from_the_marker_and_refuses_a_gap() -> None:
    written = {v: DeltaIndex(v, DeltaEncoding.XOR) for v in (1, 2, 3)}
    assert plan_pull(1, 3, written) == (2, 3)
    assert plan_pull(3, 3, written) == ()
    with pytest.raises(DeltaError, match="past"):
        plan_pull(3, 2, written)
    with pytest.raises(DeltaError, match="no delta for version 4"):
        plan_pull(3, 4, written)


def test_disk_delta_is_taken_under_both_profiles_and_refused_with_lora() -> None:
    """miles at 31f1ca9 has disk-delta (arguments.py's choices; delta.py), so aug2026 takes
    it; miles refuses it with LoRA, and so does the config."""
    from miles_core.loop.config import LoopConfig
    from miles_core.profile import MilesProfile
    from miles_core.transfer import TransferMode

    old = LoopConfig(1, transfer_mode=TransferMode.DISK_DELTA, miles_profile=MilesProfile.AUG2026)
    assert old.update_weight_delta_encoding is DeltaEncoding.XOR
    with pytest.raises(ConfigError, match="LoRA weight sync"):
        LoopConfig(1, transfer_mode=TransferMode.DISK_DELTA, lora_adapter="a")
    with pytest.raises(ConfigError, match="update_weight_delta_encoding"):
        LoopConfig(1, transfer_mode=TransferMode.DISK_DELTA, update_weight_delta_encoding="zip")
    config = LoopConfig(
        1, transfer_mode=TransferMode.DISK_DELTA, update_weight_delta_encoding="overwrite"
    )
    assert config.update_weight_delta_encoding is DeltaEncoding.OVERWRITE


# -- the files (backends/common/wire/disk_delta.py) ------------------------------------


def _versions() -> list[dict[str, bytes]]:
    """Three versions of two tensors; ``b`` unchanged from 1 to 2 (not written then)."""
    return [
        {"a": bytes(range(16)), "b": b"\x00" * 8},
        {"a": bytes(range(1, 17)), "b": b"\x01" * 8},
        {"a": bytes(range(2, 18)), "b": b"\x01" * 8},
    ]


def _publish(root: Path, encoding: DeltaEncoding, upto: int) -> list[dict[str, bytes]]:
    from backends.common.wire.disk_delta import Publisher

    versions = _versions()
    publisher = Publisher(root, encoding)
    for v in range(1, upto + 1):
        publisher.write(v, 0, 1, versions[v], lambda: dict(versions[0]))
    return versions


@pytest.mark.parametrize("encoding", list(DeltaEncoding))
def test_an_engine_pulls_the_chain_onto_its_checkpoint(
    tmp_path: Path, encoding: DeltaEncoding
) -> None:
    from backends.common.wire.disk_delta import LocalCheckpoint

    versions = _publish(tmp_path / "delta", encoding, 2)
    local = LocalCheckpoint(tmp_path / "local")
    local.materialize(versions[0])
    assert local.pull(tmp_path / "delta", 2) == (1, 2)
    assert local.tensors() == versions[2] and local.applied == 2
    assert local.pull(tmp_path / "delta", 2) == ()  # applied already: nothing again


@pytest.mark.parametrize("encoding", list(DeltaEncoding))
def test_applied_twice_past_the_check(tmp_path: Path, encoding: DeltaEncoding) -> None:
    """xor's second apply gives version 1's bytes back under marker 2; overwrite's is harmless."""
    from backends.common.wire.disk_delta import LocalCheckpoint

    versions = _publish(tmp_path / "delta", encoding, 2)
    local = LocalCheckpoint(tmp_path / "local")
    local.materialize(versions[0])
    local.pull(tmp_path / "delta", 1)
    local.pull(tmp_path / "delta", 2, fault="applied_twice")
    want = versions[1]["a"] if encoding is DeltaEncoding.XOR else versions[2]["a"]
    assert local.tensors()["a"] == want and local.applied == 2


def test_a_skipped_pull_keeps_the_marker_and_the_next_catches_up(tmp_path: Path) -> None:
    from backends.common.wire.disk_delta import LocalCheckpoint

    versions = _publish(tmp_path / "delta", DeltaEncoding.XOR, 2)
    local = LocalCheckpoint(tmp_path / "local")
    local.materialize(versions[0])
    assert local.pull(tmp_path / "delta", 1, fault="skipped") == ()
    assert local.tensors() == versions[0] and local.applied == 0
    assert local.pull(tmp_path / "delta", 2) == (1, 2) and local.tensors() == versions[2]


def test_a_torn_file_or_a_gap_is_refused_with_nothing_changed(tmp_path: Path) -> None:
    from backends.common.wire.disk_delta import LocalCheckpoint

    root = tmp_path / "delta"
    versions = _publish(root, DeltaEncoding.XOR, 2)
    local = LocalCheckpoint(tmp_path / "local")
    local.materialize(versions[0])
    shard = next((root / "weight_v000002").glob("model-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-3])  # torn after its atomic write
    with pytest.raises(DeltaError):
        local.pull(root, 2)
    assert local.tensors() == versions[0] and local.applied == 0  # staged: nothing committed
    with pytest.raises(DeltaError, match="no delta for version 3"):
        local.pull(root, 3)


def test_a_refused_first_pull_makes_no_local_checkpoint(tmp_path: Path) -> None:
    """A base_version mismatch is refused before any state change: not even version 0's copy."""
    from backends.common.wire.disk_delta import LocalCheckpoint

    local = LocalCheckpoint(tmp_path / "local")
    with pytest.raises(DeltaError, match="no delta for version 1"):
        local.pull(tmp_path / "delta", 1, initial=lambda: {"a": b"\x00"})
    assert local.applied is None and not (tmp_path / "local").exists()
    assert local.pull(tmp_path / "delta", 0, initial=lambda: {"a": b"\x00"}) == ()
    assert local.applied == 0 and local.tensors() == {"a": b"\x00"}
