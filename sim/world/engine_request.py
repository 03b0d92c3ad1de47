"""One generate request inside a simulated engine: its progress, the versions its spans came
from, and its place in a capped engine's slots and decode clock (engine.py and
engine_batch.py both hold it)."""

from __future__ import annotations

from sim.world.runtime import SimSignal


class EngineRequest:
    """One generate request's progress: tokens done, the versions its spans came from."""

    __slots__ = (
        "aborted",
        "admitted",
        "cached",
        "death",
        "done",
        "first",
        "holds_pages",
        "kept_kv",
        "prompt",
        "queued",
        "recompute",
        "running",
        "spans",
        "start_version",
        "started",
        "total",
        "wake_step",
        "wake_tokens",
        "woken",
    )

    def __init__(
        self, total: float, started: float, death: SimSignal, prompt: int | tuple[str, int]
    ) -> None:
        self.total = total
        self.prompt = prompt
        """Its prefix-cache key: the prompt, or (namespace, prompt) under
        --namespaced-radix-cache."""
        self.cached: list[int | None] = []
        """The weights that computed the prompt KV it reused from the prefix cache."""
        self.started = started
        self.death = death
        """The death of the process the request was sent to (not of a restarted one)."""
        self.done = 0.0
        self.start_version: int | None = None
        """The start_weight_version its request declared (sglang #34185), if any."""
        self.spans: list[int | None] = []
        self.kept_kv = False
        self.recompute = False
        self.first = True
        self.aborted = False
        """An abort of every request (an abort-mode pause, a version update that aborts)
        reached it while the engine held it: it ends aborted, whatever woke it first."""
        self.holds_pages = False
        """It holds KV pages: decoding, or frozen in place (a retracted one holds none)."""
        self.running = False
        """It holds one of a capped engine's running slots (Slots)."""
        self.queued = False
        """It waits in a capped engine's queue for a slot (Slots)."""
        self.admitted: SimSignal | None = None
        """Set when Slots gives it a slot."""
        self.wake_tokens = 0.0
        """Under the decode law: the tokens at which DecodeClock wakes it ..."""
        self.wake_step = 0.0
        """... that clock's step then ..."""
        self.woken: SimSignal | None = None
        """... and the signal it sets then."""

    def on_weights(self, version: int | None) -> None:
        """Tokens from here on come from ``version``; frozen KV across a change is kept KV."""
        if self.spans and self.spans[-1] != version:
            self.kept_kv = self.kept_kv or not self.recompute
        if not self.spans or self.spans[-1] != version:
            self.spans.append(version)


__all__ = ["EngineRequest"]
