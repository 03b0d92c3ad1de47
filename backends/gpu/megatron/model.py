"""The tiny policy as a Megatron-core ``GPTModel``: the trainer side of the GPU backend.

It starts from the HF model's weights (``policy.build_model``) sharded for this TP rank,
as miles loads an HF checkpoint into Megatron, so trainer and engines start bitwise
equal; ``convert.megatron_to_hf`` brings the trained weights back for the engines.
It also runs on a CPU-only torch over gloo (see ``shims``), which is how it is tested.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import (
    gather_from_tensor_model_parallel_region,
    model_parallel_cuda_manual_seed,
)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.spec_utils import ModuleSpec
from transformers import LlamaConfig

from backends.common.training.policy import AnyPolicy, build_model
from backends.gpu.megatron.convert import hf_to_megatron
from backends.gpu.megatron.shims import apply_cpu_shims, cpu_model_parallel_manual_seed


def _use_te() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def rope_theta(hf: LlamaConfig) -> float:
    """The RoPE base (transformers 5 keeps it in ``rope_parameters``, 4.x in ``rope_theta``)."""
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def megatron_config(policy: AnyPolicy, tp: int) -> TransformerConfig:
    """A TransformerConfig computing what the HF Llama computes (no dropout, no biases).

    The RoPE base is not a TransformerConfig field: ``MegatronPolicy`` passes
    ``rope_theta(hf)`` to ``GPTModel``.
    """
    hf = policy.hf_config()
    if getattr(hf, "rope_parameters", None):
        assert hf.rope_parameters.get("rope_type", "default") == "default", hf.rope_parameters
    return TransformerConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=hf.num_attention_heads,
        num_query_groups=hf.num_key_value_heads,
        kv_channels=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        tensor_model_parallel_size=tp,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=hf.initializer_range,
        params_dtype=torch.float32,
        use_cpu_initialization=not torch.cuda.is_available(),
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )


def layer_spec(config: TransformerConfig) -> ModuleSpec:
    """Transformer Engine's spec where it can run (CUDA and TE installed), else the local one."""
    if _use_te():
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        return get_gpt_layer_with_transformer_engine_spec()
    return get_gpt_layer_local_spec(normalization=config.normalization)


def init_parallel(tp: int, seed: int) -> None:
    """Megatron's TP groups and RNG tracker over the caller's default process group."""
    world = torch.distributed.get_world_size()
    assert world % tp == 0, f"world size {world} is not divisible by tp={tp}"
    if not torch.cuda.is_available():
        apply_cpu_shims()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    if torch.cuda.is_available():
        model_parallel_cuda_manual_seed(seed)
    else:
        cpu_model_parallel_manual_seed(seed)


def destroy_parallel() -> None:
    """Undo ``init_parallel`` (the default process group stays the caller's)."""
    from megatron.core.tensor_parallel import random as mpu_random

    parallel_state.destroy_model_parallel()
    mpu_random._CUDA_RNG_STATE_TRACKER = None
    mpu_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False


@dataclass
class PolicyOutput:
    """What ``grpo_loss`` and ``sample`` read from an HF model's output."""

    logits: torch.Tensor


class MegatronPolicy(torch.nn.Module):
    """A ``GPTModel`` behind the HF call convention: ``forward(input_ids=...).logits``.

    The logits come back whole ([batch, seq, vocab]): the vocab-parallel output is
    gathered across TP with Megatron's autograd-aware gather, so the loss code is the
    HF trainer's, unchanged.
    """

    def __init__(self, policy: AnyPolicy, tp: int) -> None:
        super().__init__()
        hf = policy.hf_config()
        self.config = megatron_config(policy, tp)
        assert hf.vocab_size % tp == 0, "vocab must split evenly (Megatron would pad it)"
        with torch.random.fork_rng(devices=[]):  # the random init is overwritten anyway
            self.gpt = GPTModel(
                config=self.config,
                transformer_layer_spec=layer_spec(self.config),
                vocab_size=hf.vocab_size,
                max_sequence_length=hf.max_position_embeddings,
                parallel_output=True,
                share_embeddings_and_output_weights=True,
                position_embedding_type="rope",
                rotary_base=rope_theta(hf),
            )

    def forward(self, input_ids: torch.Tensor) -> PolicyOutput:
        device = next(self.gpt.parameters()).device
        input_ids = input_ids.to(device)
        batch, seq = input_ids.shape
        position_ids = torch.arange(seq, device=device).expand(batch, seq)
        # True above the diagonal = masked; explicit, since Megatron's default is built on CUDA.
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1)
        logits = self.gpt(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=mask[None, None].expand(batch, 1, seq, seq),
        )
        return PolicyOutput(logits=gather_from_tensor_model_parallel_region(logits))


def build_megatron_policy(policy: AnyPolicy, tp: int, device: str = "cpu") -> MegatronPolicy:
    """This TP rank's MegatronPolicy with the HF model's weights (after ``init_parallel``)."""
    model = MegatronPolicy(policy, tp)
    expected = model.gpt.state_dict()
    fused = any(k.endswith("layer_norm_weight") for k in expected)
    shard = hf_to_megatron(
        dict(build_model(policy).named_parameters()),
        model.config,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=tp,
        fused_norms=fused,
    )
    result = model.gpt.load_state_dict(shard, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    assert not missing and not result.unexpected_keys, (missing, result.unexpected_keys)
    return model.to(device)
