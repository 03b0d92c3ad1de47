"""The device check's checks, in ``devcheck.PLAN`` order, one function each (the two that
run the GPU backend's command are in devcheck_run.py, and named here too: the runner looks
every check up in this module by its name).

A check takes a ``Context`` and returns a dict of figures (seconds; GB/s as 1e9 bytes a
second); it raises ``CheckFailed`` to fail while keeping its figures. Every CUDA check
does its work in spawned children (time-limited, each with its own CUDA/NCCL world)
whose entry points are the top-level ``*_child`` / ``*_rank`` / ``ipc_*`` functions
(spawn imports them by name). They take a ``device``, so that their code also runs on
CPU over gloo, which is how it was tried without a GPU; the checks pass ``cuda``.
"""

from __future__ import annotations

import math
import os
import platform
import random
import re
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from backends.gpu.devcheck_children import (
    CheckFailed,
    Context,
    all_ok,
    free_port,
    log_tail,
    popen,
    run_children,
    spawn_context,
)
from backends.gpu.devcheck_run import gpu_run as gpu_run
from backends.gpu.devcheck_run import gpu_run_checkpoint as gpu_run_checkpoint

MIB, GIB = 1 << 20, 1 << 30
SEED = 20240601
MODULES = ("ray", "simpy", "megatron.core", "transformers", "aiohttp", "transformer_engine")
# Both NCCL checks: sockets over loopback only, no shortcut through P2P/SHM/NVLS/MNNVL.
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}
NCCL_ENV |= {"NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_MNNVL_ENABLE": "0"}
NCCL_ENV |= {"NCCL_NET": "Socket", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}


def _nccl_version() -> str:
    try:
        version = torch.cuda.nccl.version()
    except Exception as error:  # a build without NCCL
        return f"unknown ({error})"
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _generator(device: str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(SEED)


def _seeded(nbytes: int, device: str, g: torch.Generator | None = None) -> torch.Tensor:
    """A seeded uint8 pattern (pass one generator to draw several in sequence)."""
    g = g if g is not None else _generator(device)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=g)


def _init_group(device: str, port: int, rank: int = 0, world: int = 1) -> None:
    """A process group over a TCP store on loopback: NCCL on cuda:0, gloo on CPU.
    (The NCCL_* settings are in the child's environment from its start, via run_children.)"""
    how = {"init_method": f"tcp://127.0.0.1:{port}", "rank": rank, "world_size": world}
    how["timeout"] = timedelta(seconds=60)
    if device == "cuda":
        torch.cuda.set_device(0)
        how["device_id"] = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dist.init_process_group("nccl" if device == "cuda" else "gloo", **how)


def _groups(prompts: int = 4, per_group: int = 4) -> list[list[Any]]:
    """Fixed trajectories: seeded responses to the task's prompts, scored by its verifier."""
    from backends.common.training.policy import RESPONSE_TOKENS, Trajectory, prompt_tokens, reward

    rng, groups = random.Random(SEED), []
    for pid in range(prompts):
        prompt, answers = tuple(prompt_tokens(0, pid)), []
        for _ in range(per_group):
            answers.append(tuple(rng.randrange(10) for _ in range(RESPONSE_TOKENS)))
        groups.append([Trajectory(prompt, a, reward(prompt, a)) for a in answers])
    return groups


def _device_io(model: Any, device: str) -> Any:
    """The model as grpo_loss calls it with CPU tensors: ids go to ``device``, logits come
    back to the ids' device (a no-op once grpo_loss builds them on the model's device)."""

    class DeviceIO(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: torch.Tensor) -> Any:
            logits = self.inner(input_ids=input_ids.to(device)).logits
            return type("Output", (), {"logits": logits.to(input_ids.device)})()

    return DeviceIO()


def _train(model: torch.nn.Module, device: str, steps: int) -> dict[str, Any]:
    """Adam steps of grpo_loss on the fixed trajectories; the last loss is after them."""
    from backends.common.training.policy import PolicyConfig, grpo_loss

    groups, wrapped = _groups(), _device_io(model, device)
    optimizer, losses, seconds = torch.optim.Adam(model.parameters(), PolicyConfig().lr), [], []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        loss = grpo_loss(wrapped, groups)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        _sync(device)
        seconds.append(time.perf_counter() - t0)
        losses.append(float(loss))
    with torch.no_grad():
        losses.append(float(grpo_loss(wrapped, groups)))
    return {"losses": losses, "step_seconds": seconds}


# ---------------------------------------------------------------- 0-1. environment, copy


def environment(ctx: Context) -> dict[str, Any]:
    figures: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    figures |= {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__}
    figures |= {"torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if figures["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        figures |= {"device": props.name, "device_count": torch.cuda.device_count()}
        figures |= {"capability": f"{props.major}.{props.minor}"}
        figures |= {"memory_gib": round(props.total_memory / GIB, 1)}
        figures["nccl"] = _nccl_version()
    figures["env"] = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_"))}
    code = "import importlib, sys; print(importlib.import_module(sys.argv[1]).__version__)"
    procs = {name: popen([sys.executable, "-W", "ignore", "-c", code, name]) for name in MODULES}
    deadline, versions, errors = time.monotonic() + min(90.0, ctx.timeout_s), {}, {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += "\nimport timed out"
        ok = proc.returncode == 0
        versions[name] = out.strip() if ok else None
        if not ok:
            errors[name] = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return figures | {"modules": versions, "import_errors": errors}


def copy_child(nbytes: int, repeats: int) -> dict:
    """Device-to-device copies of one seeded buffer, timed with CUDA events after a warmup."""
    torch.cuda.set_device(0)
    src = _seeded(nbytes, "cuda")
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    best, median = min(times), sorted(times)[len(times) // 2]
    figures = {"bytes": nbytes, "repeats": repeats, "seconds_best": best, "seconds_median": median}
    figures |= {"gbps": nbytes / best / 1e9, "gbps_median": nbytes / median / 1e9}
    figures["counted_as"] = "bytes copied / time (the memory moves twice that)"
    return figures | {"equal": bool(torch.equal(dst, src))}


def copy_ceiling(ctx: Context, nbytes: int = 2 * GIB, repeats: int = 5) -> dict[str, Any]:
    """The best a copy between buckets can do on this device (in a child, time-limited)."""
    entries = [(copy_child, (nbytes, repeats), {})]
    (figures,) = all_ok("copy_ceiling", run_children("copy_ceiling", ctx, entries, ctx.timeout_s))
    if not figures["equal"]:
        raise CheckFailed("the device-to-device copy is not bitwise equal", figures)
    return figures


# ---------------------------------------------------------------- 2. CUDA IPC


def ipc_producer(handles: Any, done: Any, shape: tuple[int, int], wait_s: float, device: str):
    """Shares seeded buckets as IPC handles; keeps them alive until the consumer is done."""
    from torch.multiprocessing.reductions import reduce_tensor

    if device == "cuda":
        torch.cuda.set_device(0)
    g = _generator(device)
    tensors = [_seeded(shape[1], device, g) for _ in range(shape[0])]
    _sync(device)
    t0 = time.perf_counter()
    handles.put([reduce_tensor(t) for t in tensors])
    share_s = time.perf_counter() - t0
    released = done.wait(wait_s)
    if device == "cuda":
        torch.cuda.ipc_collect()
    return {"share_seconds": share_s, "released_by_consumer": released}


def ipc_consumer(handles: Any, done: Any, shape: tuple[int, int], wait_s: float, device: str):
    """Opens the handles, copies each bucket into its own buffer (timed), compares bitwise."""
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        own = [torch.empty(shape[1], dtype=torch.uint8, device=device) for _ in range(shape[0])]
        received = handles.get(timeout=wait_s)
        t0 = time.perf_counter()
        shared = [rebuild(*args) for rebuild, args in received]
        _sync(device)
        open_s, times, bitwise = time.perf_counter() - t0, [], True
        for _ in range(3):
            for buf in own:
                buf.zero_()
            _sync(device)
            t0 = time.perf_counter()
            for buf, src in zip(own, shared, strict=True):
                buf.copy_(src)
            _sync(device)
            times.append(time.perf_counter() - t0)
            bitwise &= all(bool(torch.equal(b, s)) for b, s in zip(own, shared, strict=True))
        g = _generator(device)
        pattern = all(bool(torch.equal(b, _seeded(shape[1], device, g))) for b in own)
        del shared, received
        _sync(device)
    finally:
        done.set()
    total, best = shape[0] * shape[1], min(times)
    figures = {"bytes": total, "buckets": shape[0], "open_seconds": open_s}
    figures |= {"seconds_first": times[0], "seconds_best": best, "gbps": total / best / 1e9}
    figures |= {"gbps_first": total / times[0] / 1e9}
    return figures | {"bitwise": bitwise, "matches_seeded_pattern": pattern}


def cuda_ipc(ctx: Context, buckets: int = 8, nbytes: int = 256 * MIB, device: str = "cuda"):
    mp = spawn_context()
    args = (mp.Queue(), mp.Event(), (buckets, nbytes), max(5.0, ctx.timeout_s - 15), device)
    entries = [(ipc_producer, args, {}), (ipc_consumer, args, {})]
    producer, consumer = all_ok("cuda_ipc", run_children("cuda_ipc", ctx, entries, ctx.timeout_s))
    ceiling = ctx.results.get("copy_ceiling", {}).get("figures", {}).get("gbps")
    figures = {**consumer, "share_seconds": producer["share_seconds"]}
    figures["ratio_to_ceiling"] = consumer["gbps"] / ceiling if ceiling else None
    if not (consumer["bitwise"] and consumer["matches_seeded_pattern"]):
        raise CheckFailed("the consumer's copies differ from the producer's buckets", figures)
    return figures


# ---------------------------------------------------------------- 3-4. NCCL


def nccl_rank(rank: int, port: int, nbytes: int, repeats: int, p2p: bool, device: str) -> dict:
    """One of two ranks: broadcast a seeded buffer from rank 0, then a small send/recv."""
    t0 = time.perf_counter()
    _init_group(device, port, rank, 2)
    try:
        probe = torch.ones(1, device=device)
        dist.all_reduce(probe)  # the first collective: NCCL's communicator is up after it
        _sync(device)
        figures: dict[str, Any] = {"init_seconds": time.perf_counter() - t0}
        expected = _seeded(nbytes, device)
        buf = expected.clone() if rank == 0 else torch.zeros_like(expected)
        times, bitwise = [], True
        for _ in range(repeats):
            if rank != 0:
                buf.zero_()
            dist.all_reduce(probe)  # line the ranks up
            _sync(device)
            t1 = time.perf_counter()
            dist.broadcast(buf, src=0)
            _sync(device)
            times.append(time.perf_counter() - t1)
            bitwise &= bool(torch.equal(buf, expected))
        figures |= {"broadcast_seconds": times, "bitwise": bitwise}
        if p2p:
            small = torch.arange(4096, dtype=torch.float32, device=device) * 0.5 + 1
            if rank == 0:
                dist.send(small, dst=1)
            else:
                got = torch.zeros_like(small)
                dist.recv(got, src=0)
                figures["p2p_ok"] = bool(torch.equal(got, small))
            _sync(device)
        return figures | ({"nccl": _nccl_version()} if device == "cuda" else {})
    finally:
        dist.destroy_process_group()


def _transports(ctx: Context, name: str) -> list[str]:
    """NCCL's "via NET/Socket/0" lines in the ranks' logs: the transports it chose."""
    found: set[str] = set()
    for log in (ctx.out / "logs").glob(f"{name}.*.log"):
        text = log.read_text(errors="replace")
        found |= set(re.findall(r"via ((?:NET|P2P|SHM|CollNet|NVLS)/\S+)", text))
    return sorted(found)


def nccl_two_hosts(ctx: Context, nbytes: int = 256 * MIB, device: str = "cuda") -> dict[str, Any]:
    """Two ranks on one GPU passing for two hosts (distinct NCCL_HOSTID), over sockets."""
    name, port = "nccl_two_hosts", free_port()
    hosts = [f"devcheck-host-{rank}" for rank in range(2)]
    args = [(rank, port, nbytes, 3, True, device) for rank in range(2)]
    entries = [(nccl_rank, args[r], {**NCCL_ENV, "NCCL_HOSTID": hosts[r]}) for r in range(2)]
    outcomes = run_children(name, ctx, entries, ctx.timeout_s)
    sender, receiver = all_ok(name, outcomes, {"transports": _transports(ctx, name)})
    pairs = zip(sender["broadcast_seconds"], receiver["broadcast_seconds"], strict=True)
    best = min(max(pair) for pair in pairs)
    figures = {"bytes": nbytes, "bitwise": receiver["bitwise"], "p2p_ok": receiver.get("p2p_ok")}
    figures |= {"init_seconds": max(sender["init_seconds"], receiver["init_seconds"])}
    figures |= {"broadcast_seconds_best": best, "gbps": nbytes / best / 1e9}
    figures |= {"transports": _transports(ctx, name), "nccl": sender.get("nccl"), "hostids": hosts}
    if not (figures["bitwise"] and figures["p2p_ok"]):
        raise CheckFailed("the receiver's data differ from the sender's", figures)
    return figures


def nccl_duplicate_gpu_refused(ctx: Context, device: str = "cuda") -> dict[str, Any]:
    """The negative control: the same two ranks without NCCL_HOSTID; NCCL should refuse."""
    name, port = "nccl_duplicate_gpu_refused", free_port()
    env = {**NCCL_ENV, "NCCL_HOSTID": None}
    entries = [(nccl_rank, (rank, port, MIB, 1, False, device), env) for rank in range(2)]
    outcomes = run_children(name, ctx, entries, min(60.0, ctx.timeout_s))
    texts = [str(v) for k, v in outcomes if k != "ok"]
    texts += [log_tail(p, 40) for p in sorted((ctx.out / "logs").glob(f"{name}.*.log"))]
    duplicate = [ln.strip() for t in texts for ln in t.splitlines() if "Duplicate GPU" in ln]
    refused = any(kind != "ok" for kind, _ in outcomes)
    figures = {"refused": refused, "outcomes": [kind for kind, _ in outcomes]}
    figures["duplicate_gpu_message"] = bool(duplicate)
    if refused:
        first = [ln for ln in texts[0].splitlines() if ln.strip()] or ["(no message)"]
        figures["message"] = (duplicate or first)[-1][-500:]
    else:
        figures["note"] = "NCCL let two ranks share one GPU without distinct NCCL_HOSTID"
    return figures


# ---------------------------------------------------------------- 5-6. Megatron, FSDP2


def megatron_child(device: str, port: int, steps: int = 3) -> dict:
    """Megatron's TP=1 world on one rank: train, convert to HF, compare the logits."""
    _init_group(device, port)
    from transformers import LlamaForCausalLM

    from backends.common.training.policy import PolicyConfig, build_model, grpo_loss
    from backends.gpu.megatron import model as mg
    from backends.gpu.megatron.convert import megatron_to_hf

    policy, groups = PolicyConfig(), _groups()
    figures: dict[str, Any] = {"initial_loss_hf_cpu": float(grpo_loss(build_model(policy), groups))}
    mg.init_parallel(tp=1, seed=0)
    try:
        model = mg.build_megatron_policy(policy, tp=1, device=device)
        figures |= _train(model, device, steps)
        model.eval()
        state = megatron_to_hf(model, mg.megatron_config(policy, 1))
        hf = LlamaForCausalLM(policy.hf_config()).float().to(device).eval()
        loaded = hf.load_state_dict(state, strict=False)
        missing = [k for k in loaded.missing_keys if k != "lm_head.weight"]
        assert not missing and not loaded.unexpected_keys, (missing, loaded.unexpected_keys)
        ids = torch.tensor([[*t.prompt, *t.response] for g in groups for t in g], device=device)
        with torch.no_grad():
            ours, theirs = model(input_ids=ids).logits.float(), hf(input_ids=ids).logits.float()
        diff = float((ours - theirs).abs().max())
        te = any("layer_norm_weight" in k for k in model.gpt.state_dict())
    finally:
        mg.destroy_parallel()
        dist.destroy_process_group()
    figures |= {"device": device, "layer_spec": "transformer_engine" if te else "local"}
    figures["hf_tensors"] = len(state)
    return figures | {"logits_max_abs_diff": diff, "logits_match": diff < 1e-4}


def megatron_tp1(ctx: Context, device: str = "cuda") -> dict[str, Any]:
    """A few Adam steps of grpo_loss on the Megatron policy, converted back to HF: the logits
    must agree. A missing module fails (it is what this check is for)."""
    import importlib.util

    for module in ("backends.gpu.megatron.model", "backends.gpu.megatron.convert"):
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"No module named {module!r}")
    entries = [(megatron_child, (device, free_port()), {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})]
    (figures,) = all_ok("megatron_tp1", run_children("megatron_tp1", ctx, entries, ctx.timeout_s))
    if not figures["logits_match"]:
        diff = figures["logits_max_abs_diff"]
        raise CheckFailed(f"Megatron and HF logits differ by {diff:.3g} (>= 1e-4)", figures)
    return figures


def fsdp2_child(device: str, port: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from backends.common.training.policy import PolicyConfig, build_model

    _init_group(device, port)
    try:
        mesh = init_device_mesh(device, (1,))
        model = build_model(PolicyConfig()).to(device)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trained = _train(model, device, steps=1)
        (loss, after), (seconds,) = trained["losses"], trained["step_seconds"]
        return {"device": device, "loss": loss, "loss_after": after, "step_seconds": seconds}
    finally:
        dist.destroy_process_group()


def fsdp2_step(ctx: Context, device: str = "cuda") -> dict[str, Any]:
    """One Adam step of grpo_loss on the HF policy under FSDP2 (fully_shard per layer + root)."""
    entries = [(fsdp2_child, (device, free_port()), {})]
    (figures,) = all_ok("fsdp2_step", run_children("fsdp2_step", ctx, entries, ctx.timeout_s))
    if not (math.isfinite(figures["loss"]) and math.isfinite(figures["loss_after"])):
        raise CheckFailed("the loss is not finite", figures)
    return figures
