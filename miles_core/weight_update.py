"""The weight-update sequence, as one ordered plan both update paths share.

    pause engines (the pause mode) -> flush their cache (unless in_place)
    -> begin the update session -> [unload the adapter where it is loaded]
    -> send every bucket
    -> stamp engines (abort_all_requests false) -> end the session
    -> publish version -> resume engines

This is miles' sequence (update_weight_from_distributed/mixin.py:
_pause_and_prepare_engines, _finalize_and_resume_engines): the cache is flushed
only when the pause released every request's KV (abort, retract); under in_place
the frozen requests still hold it, and SGLang refuses to flush (miles #1497).
The version is set with ``abort_all_requests: false``, since SGLang's default
aborts every request in flight and would defeat retract and in_place
(miles #2589, #2296).

The order is the point. Stamping before publishing means no sample carries a
version the rollout side has not heard of for longer than the update itself;
publishing before resuming closes the window (seed report on PR #2244, risk 3)
in which engines generated under the new weights while the consumer still
believed the old version. The stamp action is built by the same function for the
full-parameter and the LoRA paths, so LoRA cannot forget it (the P1 of that
report). A LoRA update unloads the old adapter only from the engine processes
that hold it: SGLang refuses to unload an adapter it does not hold ("LoRA
adapter ... is not loaded", ``LoRAManager.unload_lora_adapter``) and to load a
name it holds. miles decides with one flag per updater (``_lora_loaded``,
update_weight_from_distributed/mixin.py ``_update_lora_weights``; its tests
``test_first_load_does_not_unload``, ``test_reload_unloads_existing_adapter_first``),
which a new updater cell (indep-DP failover) or a restarted engine process
contradicts; here the caller names the processes, from what the transport
reported delivered. The orchestration executes the actions in order and acknowledges each;
an action out of order is a TransitionError. ("Step" names a training step only.)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import TransitionError, int_at_least
from miles_core.kinds import PauseMode


class UpdateKind(StrEnum):
    FULL = "full"
    LORA = "lora"


@dataclass(frozen=True)
class PauseEngines:
    engines: tuple[str, ...]
    mode: PauseMode = PauseMode.RETRACT
    abort_below: int | None = None
    """--pause-abort-below-start-weight-version's threshold (miles_core/pause_filter.py);
    None: the pause sends none."""


@dataclass(frozen=True)
class FlushCache:
    """Drop the engines' KV and prefix cache (the weights it was computed with are going)."""

    engines: tuple[str, ...]


@dataclass(frozen=True)
class BeginUpdate:
    """Open the weight-update session (SGLang's /begin_weight_update)."""

    engines: tuple[str, ...]


@dataclass(frozen=True)
class EndUpdate:
    """Close the session: post-load processing on the whole model (/end_weight_update)."""

    engines: tuple[str, ...]


@dataclass(frozen=True)
class UnloadAdapter:
    """LoRA: the old adapter goes before the new one arrives (unload-then-load), from the
    engines that hold it."""

    engines: tuple[str, ...]
    adapter: str


@dataclass(frozen=True)
class SendBucket:
    bucket: int
    n_buckets: int
    engines: tuple[str, ...]


@dataclass(frozen=True)
class StampEngines:
    """Set each engine's weight_version: the same action for every kind of update."""

    version: int
    engines: tuple[str, ...]


@dataclass(frozen=True)
class PublishVersion:
    version: int


@dataclass(frozen=True)
class ResumeEngines:
    engines: tuple[str, ...]


UpdateAction = (
    PauseEngines
    | FlushCache
    | BeginUpdate
    | UnloadAdapter
    | SendBucket
    | StampEngines
    | EndUpdate
    | PublishVersion
    | ResumeEngines
)


def plan_update_actions(
    version: int,
    engines: tuple[str, ...],
    n_buckets: int,
    kind: UpdateKind = UpdateKind.FULL,
    adapter: str | None = None,
    publish: bool = True,
    pause_mode: PauseMode = PauseMode.RETRACT,
    holding: tuple[str, ...] | None = None,
    abort_below: int | None = None,
) -> tuple[UpdateAction, ...]:
    """The actions of one weight update, in the order they must run.

    ``publish=False`` is a sync: restarted engines receive the already published
    version, so there is nothing new to publish. ``holding`` (LoRA only): the engines
    whose process holds the adapter now, the only ones it is unloaded from (none: no
    unload); None unloads it from every engine. ``abort_below``: the pause's
    abort_below_start_weight_version (refused with an abort pause, as SGLang refuses it).
    """
    if not int_at_least(version, 1):
        raise TransitionError(
            f"a weight update carries a version >= 1 from the ledger, got {version!r}"
        )
    if not engines:
        raise TransitionError("a weight update needs at least one engine, got none")
    try:
        kind = UpdateKind(kind)
    except ValueError:
        raise TransitionError(f"kind must be 'full' or 'lora', got {kind!r}") from None
    if not int_at_least(n_buckets, 1):
        raise TransitionError(
            f"a weight update needs at least one bucket, got n_buckets={n_buckets}"
        )
    if (kind is UpdateKind.LORA) != (adapter is not None):
        raise TransitionError(
            f"adapter={adapter!r} with kind={kind.value}: a LoRA update names its adapter, "
            "a full update names none"
        )
    if holding is not None and (adapter is None or not set(holding) <= set(engines)):
        raise TransitionError(
            f"holding={holding!r}: the engines holding the adapter of a LoRA update, "
            f"among its engines {engines!r}"
        )
    mode = PauseMode(pause_mode)
    if abort_below is not None and mode is PauseMode.ABORT:
        raise TransitionError(
            f"abort_below={abort_below}: an abort pause aborts every request already, and "
            "SGLang rejects abort_below_start_weight_version with it (sglang #34185)"
        )
    actions: list[UpdateAction] = [PauseEngines(engines, mode, abort_below)]
    if mode is not PauseMode.IN_PLACE:  # frozen requests still hold their KV pages
        actions.append(FlushCache(engines))
    actions.append(BeginUpdate(engines))
    if adapter is not None and (holding is None or holding):
        actions.append(UnloadAdapter(engines if holding is None else holding, adapter))
    actions.extend(SendBucket(k, n_buckets, engines) for k in range(n_buckets))
    actions.append(StampEngines(version, engines))
    actions.append(EndUpdate(engines))
    if publish:
        actions.append(PublishVersion(version))
    actions.append(ResumeEngines(engines))
    return tuple(actions)


class WeightUpdate:
    """Tracks one update through its plan; refuses actions out of order."""

    def __init__(
        self,
        version: int,
        engines: tuple[str, ...],
        n_buckets: int,
        kind: UpdateKind = UpdateKind.FULL,
        adapter: str | None = None,
        publish: bool = True,
        pause_mode: PauseMode = PauseMode.RETRACT,
        holding: tuple[str, ...] | None = None,
        abort_below: int | None = None,
    ) -> None:
        self.actions = plan_update_actions(
            version, engines, n_buckets, kind, adapter, publish, pause_mode, holding, abort_below
        )
        self.publish = publish
        self.version = version
        self.kind = UpdateKind(kind)
        self._done = 0

    @property
    def finished(self) -> bool:
        return self._done == len(self.actions)

    @property
    def completed_actions(self) -> tuple[UpdateAction, ...]:
        return self.actions[: self._done]

    def next_action(self) -> UpdateAction | None:
        return None if self.finished else self.actions[self._done]

    def complete(self, action: UpdateAction) -> None:
        """Acknowledge that ``action`` ran; it must be the next one in the plan."""
        expected = self.next_action()
        if action != expected:
            raise TransitionError(
                f"weight update {self.version}: action {action!r} completed but the plan expects "
                f"{expected!r} next"
            )
        self._done += 1
