"""A real SGLang server as the engine of a Ray actor: ``python -m sglang.launch_server``.

The model directory is written from the policy's config and initial weights
(``save_pretrained``: config.json and safetensors, no download), so the server
starts bitwise equal to the trainers, as the local engine does. The server runs
without a tokenizer (``--skip-tokenizer-init``: the loop sends token ids), in the
policy's float32, on the GPU Ray gave the actor. The actor only launches, watches
and stops the process; the world talks to the server over HTTP in SGLang's API,
exactly as to the local engine.

Not verified here: SGLang cannot be installed on the CPU machines nor on the
offline device host; this path runs where the ``gpu`` extra is installed. The
testbed's own /testbed/weights_checksum is not an SGLang route, so with SGLang
engines the stamp's bitwise check is left out (SGLang's /weights_checker hashes
its own fused tensors, which the trainer side does not reproduce yet).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import ray

from backends.common.session.ray_session import LOOPBACK
from backends.common.training.policy import AnyPolicy, HFPolicy, build_model

START_SECONDS = 600.0
MIDWAY_SECONDS = 0.2
"""How long after a doomed request is sent its SGLang server is killed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def write_model_dir(policy: AnyPolicy, path: Path) -> Path:
    """The HF model directory SGLang loads: a checkpoint's own (``--hf-checkpoint``), or the
    tiny policy written out (no tokenizer: ids only)."""
    if isinstance(policy, HFPolicy):
        return Path(policy.checkpoint)
    build_model(policy).save_pretrained(path, safe_serialization=True)
    return path


def _die_with_parent() -> None:
    """In the server's process: die when the actor does (Ray kills actors with SIGKILL, which
    runs no cleanup), so no server outlives its engine."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch_command(model_dir: Path, port: int, prefix_cache: str = "off") -> list[str]:
    """SGLang's radix cache is its ``shared`` prefix cache; ``off`` disables it; SGLang has
    no cache keyed by weight version, so ``by_version`` is refused before any launch."""
    if prefix_cache not in ("off", "shared"):
        raise ValueError(
            f"prefix_cache: got {prefix_cache!r}, which SGLang cannot do; pass off or shared"
        )
    radix = ["--disable-radix-cache"] if prefix_cache == "off" else []
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--skip-tokenizer-init",
        "--dtype",
        "float32",
        "--mem-fraction-static",
        "0.05",
        "--disable-cuda-graph",
        "--random-seed",
        "0",
        *radix,
    ]


@ray.remote(num_cpus=0)
class SGLangEngineActor:
    """Launches one SGLang server; ``start`` gives its port once /health answers."""

    def __init__(
        self,
        engine_id: str,
        policy: AnyPolicy,
        token_seconds: float = 0.0,
        device: str = "",
        collective_timeout: float = 0.0,
        flush_refuses_while_queued: bool = False,
        prefix_cache: str = "off",
    ) -> None:
        """``token_seconds``, ``collective_timeout`` and ``flush_refuses_while_queued`` are the
        local engine's: SGLang decodes at its own pace, its update groups take torch's default
        timeout, and its /flush_cache answers as its own version does. ``prefix_cache``: its
        radix cache on (shared) or off; SGLang reports no weights for the KV it reuses, so
        ``cached_kv_fresh`` has nothing to judge on a real SGLang."""
        launch_command(Path(), 0, prefix_cache)  # refuses what SGLang cannot do, now
        self.prefix_cache = prefix_cache
        self.engine_id = engine_id
        self.policy = policy
        self.dir = tempfile.mkdtemp(prefix=f"sglang-{engine_id}-")
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self, delay: float = 0.0) -> int:
        """Launch the server (after ``delay`` seconds: the slow_start fault) and wait for its
        /health."""
        if delay > 0:
            await asyncio.sleep(delay)
        model = write_model_dir(self.policy, Path(self.dir) / "model")
        port = _free_port()
        log = open(Path(self.dir) / "server.log", "wb")  # noqa: SIM115 - the server's lifetime
        self.process = subprocess.Popen(
            launch_command(model, port, self.prefix_cache),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + START_SECONDS
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"sglang exited {self.process.returncode}: see {log.name}")
                try:
                    async with http.get(f"http://{LOOPBACK}:{port}/health") as reply:
                        if reply.status == 200:
                            return port
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1.0)
        raise TimeoutError(f"sglang did not answer /health in {START_SECONDS:g} s")

    async def hang(self) -> None:
        """The server stops answering and stays alive (SIGSTOP)."""
        if self.process is not None:
            os.killpg(self.process.pid, signal.SIGSTOP)

    async def hang_route(self, route: str) -> None:
        """SGLang's server cannot be made to leave one route unanswered from outside: the
        hang_call fault is the CPU engine's and the simulator's only; refused, not faked."""
        raise NotImplementedError(
            f"hang_call ({route}) cannot be injected into a real SGLang server; run the "
            "scenario on the CPU backend or in the simulator"
        )

    async def die_midway(self, rid: str) -> None:
        """The mid-generation kill: SGLang's server cannot be made to exit at a request's
        halfway token from outside, so its process is killed a moment after ``rid`` is
        sent (MIDWAY_SECONDS), while it generates."""
        process = self.process

        def kill() -> None:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)

        asyncio.get_running_loop().call_later(MIDWAY_SECONDS, kill)

    async def wait_forever(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
