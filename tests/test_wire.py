"""The CPU backend's wire path: parameters as bucket views keep pack_bucket's bytes, both ways."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from backends.common.wire.buckets import (  # noqa: E402
    BucketViews,
    UnalignedTensor,
    pack_bucket,
    pack_into,
    wire_spans,
)
from miles_core.transfer import ParamSpec, plan_buckets, units_of  # noqa: E402


class Tiny(torch.nn.Module):
    """Mixed item sizes, each tensor ending aligned for the next (SGLang's packed layout has
    no padding), and a tied weight, like the engines' Llama."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(4, generator=g).to(torch.bfloat16))
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


def payload(bucket) -> tuple[list[str], list[str], list[list[int]]]:
    spans = bucket.spans
    return [s.name for s in spans], [s.dtype for s in spans], [list(s.shape) for s in spans]


def deliver(sender: BucketViews, receiver: BucketViews, buckets) -> None:
    """What a broadcast does: the sender's buffer's bytes land in the receiver's buffer."""
    for bucket in buckets:
        wire = sender.buffer_for(*payload(bucket))
        assert torch.equal(wire, pack_bucket(sender.model, bucket))  # the wire is unchanged
        receiver.buffer_for(*payload(bucket)).copy_(wire)


def test_pack_into_a_dirty_reused_buffer_gives_pack_buckets_bytes() -> None:
    model = Tiny(0)
    (bucket,) = plan(model, 1 << 20)
    wire = pack_bucket(model, bucket)
    assert wire.numel() == bucket.payload_bytes  # packed: no padding on the wire
    buffer = torch.full((wire.numel(),), 0xAB, dtype=torch.uint8)
    pack_into(dict(model.named_parameters()), bucket, buffer)
    assert torch.equal(buffer, wire)


def test_the_wire_layout_is_sglangs_packed_one_and_refuses_an_unaligned_tensor() -> None:
    """SGLang's FlattenedTensorBucket: tensors back to back; a float32 after 3 bfloat16s
    would start at byte 6, which SGLang's receiver refuses, and so does ours."""
    spans, nbytes = wire_spans(["a", "b"], ["bfloat16", "float32"], [[4], [2]])
    assert [(s.start, s.end) for s in spans] == [(0, 8), (8, 16)] and nbytes == 16
    with pytest.raises(UnalignedTensor, match=r"b: byte offset 6 .* float32 item size 4"):
        wire_spans(["a", "b"], ["bfloat16", "float32"], [[3], [2]])


@pytest.mark.parametrize("size", [1 << 20, 16])
def test_in_place_receiver_ends_bitwise_equal_update_after_update(size: int) -> None:
    sender, engine = Tiny(1), Tiny(2)
    views, receiver = BucketViews(sender), BucketViews(engine)
    buckets = plan(sender, size)
    deliver(views, receiver, buckets)
    assert raw(engine) == raw(sender)
    assert engine.head.weight is engine.b  # the tie survives: one parameter, rebound once
    with torch.no_grad():  # a training step changes the sender; the next update must land
        for p in sender.parameters():
            p.add_(1)
    deliver(views, receiver, buckets)
    assert raw(engine) == raw(sender)


def test_a_new_layout_retires_the_old_one_and_going_back_rebinds() -> None:
    sender, engine = Tiny(3), Tiny(4)
    views, receiver = BucketViews(sender), BucketViews(engine)
    for size in (1 << 20, 16, 1 << 20):  # one bucket, many buckets, one bucket again
        with torch.no_grad():
            for p in sender.parameters():
                p.add_(1)
        deliver(views, receiver, plan(sender, size))
        assert raw(engine) == raw(sender)


def test_a_bucket_that_does_not_match_the_model_is_refused() -> None:
    receiver = BucketViews(Tiny(0))
    with pytest.raises(ValueError, match="b: the bucket says float16"):
        receiver.buffer_for(["b"], ["float16"], [[5, 2]])
    with pytest.raises(ValueError, match="bucket shape"):
        receiver.buffer_for(["b"], ["float32"], [[2, 5]])
    assert wire_spans(["a"], ["bfloat16"], [[3]])[1] == 6


def test_a_trainer_whose_parameters_are_bucket_views_trains_bitwise_like_one_without() -> None:
    """Adam updates parameters in place, so the views keep tracking the weights."""

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

    plain, bound = model(), model()
    views = BucketViews(bound)
    for bucket in plan(bound, 100):
        views.buffer_for(*payload(bucket))
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (plain, bound)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(4, 6, generator=generator)
        for m, opt in zip((plain, bound), optimizers, strict=True):
            opt.zero_grad(set_to_none=False)
            m(x).pow(2).mean().backward()
            opt.step()
    assert raw(bound) == raw(plain)
    for bucket in plan(bound, 100):  # and the wire buffers hold the trained weights
        assert torch.equal(views.buffer_for(*payload(bucket)), pack_bucket(bound, bucket))


def test_an_engine_remembers_a_checked_layout_and_still_refuses_its_mutants() -> None:
    """check_bucket keeps the layouts that passed (the same buckets every update): a
    request that differs in one dtype or one shape is checked afresh and refused."""
    from backends.common.engine.requests import BadRequest
    from backends.common.engine.weights import EngineWeights

    model = torch.nn.Linear(4, 3)
    weights = EngineWeights(model, "cpu")
    names, dtypes, shapes = ["weight", "bias"], ["float32", "float32"], [[3, 4], [3]]
    for _ in range(2):
        weights.check_bucket(names, dtypes, shapes)
    assert len(weights._valid) == 1
    with pytest.raises(BadRequest, match="float32 here, the request says bfloat16"):
        weights.check_bucket(names, ["float32", "bfloat16"], shapes)
    with pytest.raises(BadRequest, match=r"\[3\] here, the request says \[4\]"):
        weights.check_bucket(names, dtypes, [[3, 4], [4]])
    assert len(weights._valid) == 1
