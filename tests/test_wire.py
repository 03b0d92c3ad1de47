"""The CPU backend's wire path: reused staging and in-place receive keep pack_bucket's bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from backends.cpu.wire import (  # noqa: E402
    InPlaceReceiver,
    StagingBuffer,
    pack_bucket,
    pack_into,
    spans_of,
)
from miles_core.transfer import ParamSpec, plan_buckets, units_of  # noqa: E402


class Tiny(torch.nn.Module):
    """Mixed item sizes (so spans have padding) and a tied weight, like the engines' Llama."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(3, generator=g).to(torch.bfloat16))
        self.b = torch.nn.Parameter(torch.randn(5, 2, generator=g))
        self.c = torch.nn.Parameter(torch.randint(0, 9, (7,), generator=g), requires_grad=False)
        self.head = torch.nn.Linear(2, 5, bias=False)
        self.head.weight = self.b  # tied: one parameter, two modules


def plan(model: torch.nn.Module, size: int):
    specs = [
        ParamSpec.of(n, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for n, p in model.named_parameters()
    ]
    return plan_buckets(units_of(specs), size)


def raw(model: torch.nn.Module) -> dict[str, bytes]:
    return {n: p.detach().view(torch.uint8).numpy().tobytes() for n, p in model.named_parameters()}


def deliver(sender: torch.nn.Module, receiver: InPlaceReceiver, buckets, staging) -> None:
    """What a broadcast does to the receiver's buffer: the sender's bytes, copied."""
    for bucket in buckets:
        wire = staging.pack(sender, bucket)
        assert torch.equal(wire, pack_bucket(sender, bucket))  # the wire layout is unchanged
        payload = ([s.name for s in bucket.spans], [s.dtype for s in bucket.spans])
        buffer = receiver.buffer_for(*payload, [list(s.shape) for s in bucket.spans])
        buffer.copy_(wire)


def test_pack_into_a_dirty_reused_buffer_gives_pack_buckets_bytes() -> None:
    model = Tiny(0)
    (bucket,) = plan(model, 1 << 20)
    assert bucket.nbytes > bucket.payload_bytes  # there is padding to zero
    buffer = torch.full((bucket.nbytes,), 0xAB, dtype=torch.uint8)
    pack_into(dict(model.named_parameters()), bucket, buffer)
    assert torch.equal(buffer, pack_bucket(model, bucket))


@pytest.mark.parametrize("size", [1 << 20, 16])
def test_in_place_receiver_ends_bitwise_equal_update_after_update(size: int) -> None:
    sender, engine = Tiny(1), Tiny(2)
    receiver, staging = InPlaceReceiver(engine), StagingBuffer()
    buckets = plan(sender, size)
    deliver(sender, receiver, buckets, staging)
    assert raw(engine) == raw(sender)
    assert engine.head.weight is engine.b  # the tie survives: one parameter, rebound once
    with torch.no_grad():  # a training step changes the sender; the next update must land
        for p in sender.parameters():
            p.add_(1)
    deliver(sender, receiver, buckets, staging)
    assert raw(engine) == raw(sender)


def test_a_new_layout_retires_the_old_one_and_going_back_rebinds() -> None:
    sender, engine = Tiny(3), Tiny(4)
    receiver, staging = InPlaceReceiver(engine), StagingBuffer()
    for size in (1 << 20, 16, 1 << 20):  # one bucket, many buckets, one bucket again
        with torch.no_grad():
            for p in sender.parameters():
                p.add_(1)
        deliver(sender, receiver, plan(sender, size), staging)
        assert raw(engine) == raw(sender)


def test_a_bucket_that_does_not_match_the_model_is_refused() -> None:
    receiver = InPlaceReceiver(Tiny(0))
    with pytest.raises(ValueError, match="b: the bucket says float16"):
        receiver.buffer_for(["b"], ["float16"], [[5, 2]])
    with pytest.raises(ValueError, match="bucket shape"):
        receiver.buffer_for(["b"], ["float32"], [[2, 5]])
    assert spans_of(["a"], ["bfloat16"], [[3]])[1] == 6
