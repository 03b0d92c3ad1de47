"""A Megatron-core trainer rank: the common TrainerRank with a GPTModel sharded by TP.

The cell's ranks are one torch world (gloo on CPU, NCCL on CUDA) split by
Megatron into TP groups of ``stack.tp`` ranks and data-parallel groups across
them. The ranks of a TP group compute the same samples (TP splits the weights,
not the batch); the data-parallel ranks split the cell's share of the batch and
average their gradients. Across cells, rank r of every member cell holds the same
shard, so the common cross-cell averaging applies as it is.

What leaves the trainer is what the engines hold: the weights converted to HF
names and layout (convert.megatron_to_hf: TP gather, stride-2 fc1, QKV split),
once per weights version, then cut into miles_core's buckets. The checksum is of
those converted tensors, so the engines' checksums are compared bitwise with it.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
import torch.distributed as dist

from backends.common.stack import Stack
from backends.common.training.policy import INIT_SEED, AnyPolicy, checksum_of
from backends.common.world.trainer import TrainerRank
from miles_core.transfer import Bucket


class MegatronTrainerRank(TrainerRank):
    views_ok = False  # Megatron's parameters are shards under Megatron names, not the engines'

    def build(self, policy: AnyPolicy, stack: Stack) -> torch.nn.Module:
        from backends.gpu.megatron.model import build_megatron_policy, init_parallel

        if self.ranks % stack.tp:
            raise ValueError(f"--tp {stack.tp} does not divide the cell's {self.ranks} ranks")
        if self.ranks == 1:  # Megatron's groups are made from a default world, even of one
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        init_parallel(stack.tp, INIT_SEED)
        self._converted: dict[str, torch.Tensor] | None = None
        model = build_megatron_policy(policy, stack.tp, stack.device)
        self.config = model.config
        return model

    def reference(self, policy: AnyPolicy, stack: Stack) -> torch.nn.Module:
        """The initial weights as a second Megatron model of this TP rank (the parallel
        state ``build`` made serves both)."""
        from backends.gpu.megatron.model import build_megatron_policy

        return build_megatron_policy(policy, stack.tp, stack.device)

    @property
    def data_rank(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_rank()

    @property
    def data_ranks(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_world_size()

    def reduce_grads(self) -> None:
        """Average over the cell's data-parallel ranks (no Megatron DDP wrapper here)."""
        if self.data_ranks == 1:
            return
        from megatron.core import parallel_state

        group = parallel_state.get_data_parallel_group()
        for p in self.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad /= self.data_ranks

    def converted(self) -> dict[str, torch.Tensor]:
        """The weights as the engines hold them (a collective of the TP group), made once per
        weights version."""
        if self._converted is None:
            from backends.gpu.megatron.convert import megatron_to_hf

            self._converted = megatron_to_hf(self.model, self.config)
        return self._converted

    def hf_tensors(self, bucket: Bucket) -> dict[str, torch.Tensor]:
        tensors = self.converted()
        return {span.name: tensors[span.name] for span in bucket.spans}

    def checksum(self) -> str:
        return checksum_of(self.converted().items())

    def train(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._converted = None  # a step (or a discarded attempt) may change the weights
        return super().train(*args, **kwargs)

    def set_state(self, state: dict[str, Any]) -> str:
        self._converted = None
        return super().set_state(state)


MegatronTrainerActor = ray.remote(num_cpus=0, max_concurrency=4)(MegatronTrainerRank)
