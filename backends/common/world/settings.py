"""What a Ray world is set up with and keeps for its whole run: read by every part of it.

Grouped here so that a part (a cell, an engine slot, the router, a transport) reads the
world's settings from one frozen value instead of a dozen members of the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from backends.common.stack import CPU_STACK, Stack
from backends.common.training.policy import AnyPolicy

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=120)
"""How long the world waits for an engine's answer (a collective's part waits longer)."""


@dataclass(frozen=True)
class WorldSettings:
    policy: AnyPolicy
    """The model every trainer rank and engine builds (the tiny policy or a checkpoint's)."""
    seed: int
    stack: Stack = CPU_STACK
    engine_token_seconds: float = 0.0
    """A floor on each generated token's time ([sim] engine_token_seconds)."""
    collective_timeout: float = 1800.0
    """How long a weight-update broadcast waits for every member (the trainer's and the
    engines' groups, and the transport's deadline): --update-weight-collective-timeout."""
    flush_refuses_while_queued: bool = False
    """The engines act as an SGLang before #31962 ([sim] flush_refuses_while_queued)."""
    prefix_cache: str = "off"
    """The engines' prefix cache policy ([sim] prefix_cache)."""
    miles_today: bool = False
    """The router sends /generate as today's miles builds it (sglang/generate_body.py), not
    as 31f1ca9 did: ``--miles-profile``."""
