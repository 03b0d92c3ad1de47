"""LoopConfig: the loop's flags, with miles' names and defaults, checked once.

Every field takes miles' spelling too: its CLI flag (``--max-weight-staleness``)
on the command lines, and the flag's snake_case form
(``async_data_buffer_capacity_factor``) as a scenario file's key, besides the
field's own name. ``FLAGS`` is the one table of those spellings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from miles_core.buffer import DEFAULT_UNUSED_HANDLER, BufferConfig, UnusedHandler
from miles_core.disk_delta import DeltaEncoding, check_transfer
from miles_core.errors import ConfigError, int_at_least
from miles_core.filters import dynamic_filter
from miles_core.kinds import PauseMode, SubmissionGranularity
from miles_core.pause_filter import check_pause_filter
from miles_core.profile import DEFAULT_MILES_PROFILE, MilesProfile
from miles_core.staleness_gate import DEFAULT_STALENESS_POLICY, StalenessPolicy
from miles_core.transfer import DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE, TransferMode

MODES = ("fully_async", "one_step_off", "sync")
BATCH_MODES = ("one_step_off", "sync")
"""The modes with no producer of their own: each batch is generated on demand, whole."""


@dataclass(frozen=True)
class LoopConfig:
    """The loop's flags. Each field's miles flag, where there is one, is in ``FLAGS``."""

    steps: int
    rollout_batch_size: int = 4
    n_samples_per_prompt: int = 2
    max_weight_staleness: int | None = None
    unused_samples_handler: UnusedHandler = DEFAULT_UNUSED_HANDLER
    staleness_policy: StalenessPolicy = DEFAULT_STALENESS_POLICY
    """--staleness-policy: drop_at_buffer (miles: generate freely, the buffer drops or
    recycles a group beyond --max-weight-staleness when it is taken) or gate_submission
    (AReaL: a group is submitted only while it cannot be trained beyond the bound;
    miles_core.staleness_gate). Ours: miles has no such flag."""
    capacity_factor: float = 2.0
    async_max_concurrent_samples: int | None = None
    """Samples generating at once; the producer keeps max(1, this // n_samples_per_prompt)
    groups in flight (miles' FullyAsyncRolloutFn._max_in_flight_groups); None: one batch."""
    rollout_submission_granularity: SubmissionGranularity | None = None
    """--rollout-submission-granularity; None: miles' driver default, sample under
    fully_async (``FullyAsyncRolloutFn``: ``make_submission_scheduler(default="sample")``)
    and group otherwise (one_step_off submits its shortfall at once, unpaced)."""
    pause_generation_mode: PauseMode = PauseMode.RETRACT
    """What an update does to requests in flight (miles' default: retract)."""
    pause_abort_below_start_weight_version: bool = False
    """--pause-abort-below-start-weight-version: each update's pause also drops (aborts) the
    requests that started under a version below (the version it publishes) -
    --max-weight-staleness, which the buffer would drop as stale anyway (SGLang's
    ``abort_below_start_weight_version`` on /pause_generation, sglang #34185, open draft); the
    producer then sends each request's ``start_weight_version``, which miles does not (miles
    #2296, open). Ours: miles has no such flag (miles_core/pause_filter.py)."""
    dynamic_sampling_filter: str | None = None
    """--dynamic-sampling-filter-path: one of miles' built-in filters, or any importable
    ``module.function`` called as miles calls one, ``fn(args, group)`` (miles_core.filters)."""
    update_weight_buffer_size: int = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE
    transfer_mode: TransferMode = TransferMode.BROADCAST
    update_weight_delta_encoding: DeltaEncoding = DeltaEncoding.XOR
    """--update-weight-delta-encoding under disk-delta: xor (miles' default) or overwrite
    (miles_core/disk_delta.py)."""
    max_step_attempts: int = 30
    max_route_attempts: int = 30
    lora_adapter: str | None = None
    """Train and push only this LoRA adapter (one atomic unit, unload-then-load)."""
    mode: str = "fully_async"
    """fully_async (miles' --fully-async: a producer keeps generating through updates),
    one_step_off (batch k+1 is generated during step k and weights are updated when both
    are done: staleness 1, nothing in flight at an update) or sync (miles' train.py, as it
    runs colocated: a batch is generated with the current weights, then trained, then the
    weights updated, nothing overlapping: staleness 0)."""
    miles_profile: MilesProfile = DEFAULT_MILES_PROFILE
    """[miles] profile / --miles-profile: which miles the loop follows (miles_core.profile):
    ``today`` (the default) or ``aug2026`` (31f1ca9, every recorded history hash). Ours:
    miles has no such flag."""
    heartbeat_interval: float | None = None
    """--trainer-heartbeat-checker-interval; None turns the monitor off."""
    heartbeat_timeout: float = 10.0
    """--trainer-heartbeat-checker-timeout: seconds a cell has to answer."""
    heartbeat_failure_threshold: int = 3
    """--trainer-heartbeat-checker-failure-threshold: misses in a row that fail a cell."""
    heartbeat_first_wait: float = 0.0
    """--trainer-heartbeat-checker-first-wait: seconds the checker waits after the run starts
    and after each resume before its next round (miles' default is 300; 0 here, so that a
    short simulated run is checked: its first round then goes out at once, as miles'
    ``SimpleHealthChecker._loop`` checks at once after a first wait of 0)."""
    use_fault_tolerance: bool = False
    """--use-fault-tolerance: a health monitor finds dead or hung engines and recovers them;
    without it, losing every engine ends the run (NoLiveEngineError)."""
    rollout_health_check_interval: float = 30.0
    rollout_health_check_timeout: float = 30.0
    rollout_health_check_first_wait: float = 0.0
    rollout_health_check_failure_threshold: int = 1
    """--rollout-health-check-failure-threshold (today's miles, configs/fault_tolerance.py
    3c07fcdd: 1): failed checks in a row before today's checker publishes an engine
    unhealthy (miles_core/loop/rollout_health.py); aug2026's monitor acts on the first."""
    mini_ft_controller_enable: bool | None = None
    """--mini-ft-controller-enable: stopped cells are resumed (new processes, healed at the
    next refresh) without an operator; miles_core/loop/cell_controller.py. Unset (None): off
    under aug2026; under today on with --use-fault-tolerance, healing the rollout engines
    (miles' ``_resolve_mini_ft_controller_enable``): ``mini_ft_controller_on``."""
    namespaced_radix_cache: bool | None = None
    """--namespaced-radix-cache / --no-namespaced-radix-cache: an engine's prefix cache
    reuses a prompt's KV only within one train call's namespace ``train:-:{rollout_id}``
    (SGLang's ``extra_key``). Unset (None): off under aug2026 (31f1ca9 has no such flag);
    under today miles' default, on for fully_async with in_place (``configs/rollout.py`` at
    3c07fcdd): ``radix_namespaced``."""
    mini_ft_controller_poll_interval: float = 10.0
    """--mini-ft-controller-poll-interval: seconds between the controller's looks at the
    cells."""
    mini_ft_controller_resume_delay: float = 10.0
    """--mini-ft-controller-resume-delay: seconds a cell stays suspended before it is
    resumed, and before a resumed cell may be resumed again."""
    save_interval: int = 0
    """--save-interval: save after every N-th step and after the last (miles'
    ``should_run_periodic_action``), after the step's weight update; 0: no periodic save. What
    a save holds and how a killed job resumes from it: miles_core.saves."""
    # -- retries: miles has no flags for these, only constants; the names are ours --
    request_max_retries: int = 60
    """Tries in all of a generate request that fails at the router (miles' ``_post``
    ``max_retries=60``, miles/utils/http_utils.py); after the last the run fails
    (RequestFailedError), as miles' worker does."""
    request_retry_interval: float = 1.0
    """Seconds between those tries (``_post`` sleeps 1 s)."""
    flush_cache_max_retries: int = 60
    """Tries in all of a refused /flush_cache (miles' ``SGLangEngine.flush_cache``: 60);
    after the last the update fails (FlushTimeoutError, miles' TimeoutError)."""
    flush_cache_retry_interval: float = 1.0
    """Seconds after each refused flush (``flush_cache`` sleeps 1 s, after the last too)."""
    update_weight_collective_timeout: float = 1800.0
    """Seconds a weight-update broadcast waits for every member of its group before it fails
    for all (torch's default_pg_timeout, which miles' ``init_process_group`` gives the update
    group, miles/utils/distributed_utils.py): a member that hung stalls the whole group this
    long, and is the one blamed."""
    update_weight_engine_request_timeout: float = 300.0
    """--update-weight-engine-request-timeout (today's miles, configs/rollout.py 3c07fcdd):
    seconds one control call of an update has to answer before only that engine is given up
    (miles_core/loop/cell_isolation.py); aug2026 keeps the health check's timeout, under
    --use-fault-tolerance only."""
    update_weights_timeout: float = 600.0
    """--update-weights-timeout (today's miles, configs/rollout.py 3c07fcdd): seconds one
    trainer cell's update may take before the cell is given up and the update fails over
    (TrainerController.update_weights); aug2026 has no such deadline."""
    # -- miles as it is, bugs included: each off by default; on, the loop does what miles does
    miles_bug_p2p_failures_logged: bool = False
    """miles' p2p weight transfer (``--update-weight-transfer-mode p2p`` only): each bucket's
    writes go out unwaited (update_weight_from_distributed/p2p.py
    ``_update_weight_implementation``, the last engine rank's, every rank with one GPU per
    engine), and after the last bucket ``wait_transfers`` (p2p_transfer_utils.py) waits for
    each at most --p2p-transfer-timeout (30 s: miles_core.loop.update.P2P_TRANSFER_TIMEOUT)
    and only logs a write that failed or is still going; the update then stamps, publishes
    and resumes (mixin.py ``update_weights``)."""
    miles_bug_health_monitor_left_paused: bool = False
    """miles pauses the rollout health monitor as a weight update begins and only the next
    ``generate()`` resumes it (miles/ray/train/group.py and actor_group.py
    ``update_weights``, rollout_manager.py ``generate``): an update that raises leaves it
    paused until the next rollout begins (the fix proposed in miles PR #2601, closed
    unmerged, resumed it in a ``finally``)."""
    miles_bug_fsdp_ignores_pause_mode: bool = False
    """miles' FSDP updater calls ``pause_generation()`` without the mode, so SGLangEngine's
    default, retract, and flushes always: --pause-generation-mode in_place is retract plus
    a flush there (miles/backends/fsdp_utils/update_weight_utils.py
    ``UpdateWeight.update_weights``; miles PR #2494, open)."""
    scenario: str = "custom"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "max_step_attempts", "max_route_attempts"):
            _at_least(name, getattr(self, name), 1)
        _at_least("heartbeat_failure_threshold", self.heartbeat_failure_threshold, 1)
        _at_least(
            "rollout_health_check_failure_threshold", self.rollout_health_check_failure_threshold, 1
        )
        _at_least("save_interval", self.save_interval, 0)
        self._check_retries()
        _at_least("update_weight_buffer_size", self.update_weight_buffer_size, 1)
        if self.async_max_concurrent_samples is not None:
            _at_least("async_max_concurrent_samples", self.async_max_concurrent_samples, 1)
            if self.async_max_concurrent_samples < self.n_samples_per_prompt:
                raise ConfigError(
                    "async_max_concurrent_samples",
                    f"{self.async_max_concurrent_samples} is fewer than one group of "
                    f"n_samples_per_prompt = {self.n_samples_per_prompt}",
                    "pass at least n_samples_per_prompt: whole groups are submitted (miles)",
                )
        for name in ("heartbeat_interval", "heartbeat_timeout", "rollout_health_check_interval",
                     "rollout_health_check_timeout", "mini_ft_controller_poll_interval",
                     "update_weight_collective_timeout",
                     "update_weight_engine_request_timeout", "update_weights_timeout"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not _seconds(value, strict=True):
                raise ConfigError(name, f"got {value!r}", "pass seconds > 0")
        for name in ("rollout_health_check_first_wait", "heartbeat_first_wait",
                     "mini_ft_controller_resume_delay"):  # fmt: skip
            value = getattr(self, name)
            if not _seconds(value, strict=False):
                raise ConfigError(name, f"got {value!r}", "pass seconds >= 0")
        if self.rollout_submission_granularity is not None:
            try:
                granularity = SubmissionGranularity(self.rollout_submission_granularity)
            except ValueError:
                raise ConfigError(
                    "rollout_submission_granularity",
                    f"got {self.rollout_submission_granularity!r}",
                    f"choose one of {[g.value for g in SubmissionGranularity]}",
                ) from None
            object.__setattr__(self, "rollout_submission_granularity", granularity)
        if self.mode not in MODES:
            raise ConfigError("mode", f"got {self.mode!r}", f"choose one of {MODES}")
        self._check_mode_and_pause()
        check_pause_filter(
            self.pause_abort_below_start_weight_version,
            self.pause_generation_mode,
            self.max_weight_staleness,
        )
        self._check_staleness_policy()
        self._check_profile()
        object.__setattr__(  # disk-delta: its encoding, and refused with a LoRA adapter
            self,
            "update_weight_delta_encoding",
            check_transfer(
                self.transfer_mode,
                self.update_weight_delta_encoding,
                self.lora_adapter is not None,
            ),
        )
        dynamic_filter(self.dynamic_sampling_filter)  # a built-in, or a path that imports
        self.buffer_config()  # the buffer's own checks, before anything runs

    def _check_retries(self) -> None:
        """At least one try, and a wait between tries: with none, a router that fails at once
        (the Ray world's) would be retried in a hot loop."""
        for name in ("request_max_retries", "flush_cache_max_retries"):
            _at_least(name, getattr(self, name), 1)
        for name in ("request_retry_interval", "flush_cache_retry_interval"):
            value = getattr(self, name)
            if not _seconds(value, strict=True):
                raise ConfigError(
                    name, f"got {value!r}", "pass seconds > 0 (miles waits 1 s between tries)"
                )

    def _check_mode_and_pause(self) -> None:
        try:
            object.__setattr__(self, "pause_generation_mode", PauseMode(self.pause_generation_mode))
        except ValueError:
            raise ConfigError(
                "pause_generation_mode",
                f"got {self.pause_generation_mode!r}",
                f"choose one of {[m.value for m in PauseMode]}",
            ) from None
        if self.mode == "fully_async" and self.pause_generation_mode is PauseMode.ABORT:
            raise ConfigError(  # miles/utils/arguments.py refuses the same, for the same reason
                "pause_generation_mode",
                "fully_async cannot use abort: generation is always in flight, so every weight "
                "update would kill it and force a full regeneration",
                "use retract (miles' default) or in_place, or mode = one_step_off",
            )
        if self.mode in BATCH_MODES and self.capacity_factor < 1:
            raise ConfigError(
                "capacity_factor",
                f"{self.capacity_factor} holds less than one batch, but {self.mode} puts a "
                "whole batch before it is drained",
                f"use --async-data-buffer-capacity-factor >= 1 with {self.mode}",
            )

    def _check_profile(self) -> None:
        try:
            object.__setattr__(self, "miles_profile", MilesProfile(self.miles_profile))
        except ValueError:
            raise ConfigError(
                "miles_profile",
                f"got {self.miles_profile!r}",
                f"choose one of {[p.value for p in MilesProfile]} ([miles] profile in a "
                "scenario file, --miles-profile on a command line)",
            ) from None

    @property
    def today(self) -> bool:
        """Whether the loop follows today's miles (the cell-isolation line), not 31f1ca9."""
        return self.miles_profile is MilesProfile.TODAY

    @property
    def mini_ft_controller_on(self) -> bool:
        """Whether the mini FT controller runs: as set, or unset (None) off under aug2026 and,
        under today, on with --use-fault-tolerance (miles' ``_resolve_mini_ft_controller_enable``:
        ``bool(ft_components) and api_server_port != 0``, ft_components ["rollout"] with FT;
        miles/utils/arguments.py, docs/miles-today-reading.md section 4). Resolved here, not
        stored, so that --miles-profile on a scenario keeps the other profile's default."""
        if self.mini_ft_controller_enable is not None:
            return self.mini_ft_controller_enable
        return self.today and self.use_fault_tolerance

    @property
    def radix_namespaced(self) -> bool:
        """Whether prefix KV is namespaced per train call: as set, or unset (None) off under
        aug2026 and, under today, ``args.fully_async and args.pause_generation_mode ==
        "in_place"`` (miles' resolver in miles/utils/arguments.py; docs/miles-today-reading.md
        section 7). Resolved here, not stored, as ``mini_ft_controller_on``."""
        if self.namespaced_radix_cache is not None:
            return self.namespaced_radix_cache
        return (
            self.today
            and self.mode == "fully_async"
            and self.pause_generation_mode is PauseMode.IN_PLACE
        )

    def _check_staleness_policy(self) -> None:
        try:
            policy = StalenessPolicy(self.staleness_policy)
        except ValueError:
            raise ConfigError(
                "staleness_policy",
                f"got {self.staleness_policy!r}",
                f"choose one of {[p.value for p in StalenessPolicy]}",
            ) from None
        object.__setattr__(self, "staleness_policy", policy)
        if policy is not StalenessPolicy.GATE_SUBMISSION:
            return
        if self.max_weight_staleness is None:
            raise ConfigError(
                "staleness_policy",
                "gate_submission gates submission by the staleness bound, but "
                "--max-weight-staleness is unset",
                "pass --max-weight-staleness N with --staleness-policy gate_submission, or "
                "use --staleness-policy drop_at_buffer",
            )
        if self.mode != "fully_async":
            raise ConfigError(
                "staleness_policy",
                f"gate_submission gates the fully_async producer, but mode is {self.mode}, "
                "which generates each batch on demand",
                "use --mode fully_async, or --staleness-policy drop_at_buffer",
            )

    @property
    def in_flight_groups(self) -> int:
        """Groups the producer keeps generating (miles' _max_in_flight_groups)."""
        if self.async_max_concurrent_samples is None:
            return self.rollout_batch_size
        return max(1, self.async_max_concurrent_samples // self.n_samples_per_prompt)

    @property
    def submission_granularity(self) -> SubmissionGranularity:
        """The granularity in force: the flag, else miles' default for the mode."""
        if self.rollout_submission_granularity is not None:
            return self.rollout_submission_granularity
        if self.mode == "fully_async":
            return SubmissionGranularity.SAMPLE
        return SubmissionGranularity.GROUP

    def buffer_config(self) -> BufferConfig:
        return BufferConfig(
            rollout_batch_size=self.rollout_batch_size,
            capacity_factor=self.capacity_factor,
            max_weight_staleness=self.max_weight_staleness,
            unused_samples_handler=self.unused_samples_handler,
            n_samples_per_prompt=self.n_samples_per_prompt,
        )


def _at_least(name: str, value: object, minimum: int) -> None:
    if not int_at_least(value, minimum):
        raise ConfigError(name, f"got {value!r}", f"pass an integer >= {minimum}")


def _seconds(value: object, strict: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return value > 0 if strict else value >= 0


FLAGS: Mapping[str, str] = {
    "steps": "--steps",
    "rollout_batch_size": "--rollout-batch-size",
    "n_samples_per_prompt": "--n-samples-per-prompt",
    "max_weight_staleness": "--max-weight-staleness",
    "unused_samples_handler": "--async-unused-samples-handler",
    "staleness_policy": "--staleness-policy",
    "capacity_factor": "--async-data-buffer-capacity-factor",
    "async_max_concurrent_samples": "--async-max-concurrent-samples",
    "rollout_submission_granularity": "--rollout-submission-granularity",
    "pause_generation_mode": "--pause-generation-mode",
    "pause_abort_below_start_weight_version": "--pause-abort-below-start-weight-version",
    "dynamic_sampling_filter": "--dynamic-sampling-filter-path",
    "update_weight_buffer_size": "--update-weight-buffer-size",
    "transfer_mode": "--update-weight-transfer-mode",
    "update_weight_delta_encoding": "--update-weight-delta-encoding",
    "max_step_attempts": "--max-step-attempts",
    "max_route_attempts": "--max-route-attempts",
    "lora_adapter": "--lora-adapter",
    "mode": "--mode",
    "miles_profile": "--miles-profile",
    "heartbeat_interval": "--trainer-heartbeat-checker-interval",
    "heartbeat_timeout": "--trainer-heartbeat-checker-timeout",
    "heartbeat_failure_threshold": "--trainer-heartbeat-checker-failure-threshold",
    "heartbeat_first_wait": "--trainer-heartbeat-checker-first-wait",
    "use_fault_tolerance": "--use-fault-tolerance",
    "rollout_health_check_interval": "--rollout-health-check-interval",
    "rollout_health_check_timeout": "--rollout-health-check-timeout",
    "rollout_health_check_first_wait": "--rollout-health-check-first-wait",
    "rollout_health_check_failure_threshold": "--rollout-health-check-failure-threshold",
    "mini_ft_controller_enable": "--mini-ft-controller-enable",
    "namespaced_radix_cache": "--namespaced-radix-cache",
    "mini_ft_controller_poll_interval": "--mini-ft-controller-poll-interval",
    "mini_ft_controller_resume_delay": "--mini-ft-controller-resume-delay",
    "save_interval": "--save-interval",
    "request_max_retries": "--request-max-retries",
    "request_retry_interval": "--request-retry-interval",
    "flush_cache_max_retries": "--flush-cache-max-retries",
    "flush_cache_retry_interval": "--flush-cache-retry-interval",
    "update_weight_collective_timeout": "--update-weight-collective-timeout",
    "update_weight_engine_request_timeout": "--update-weight-engine-request-timeout",
    "update_weights_timeout": "--update-weights-timeout",
    "miles_bug_p2p_failures_logged": "--miles-bug-p2p-failures-logged",
    "miles_bug_health_monitor_left_paused": "--miles-bug-health-monitor-left-paused",
    "miles_bug_fsdp_ignores_pause_mode": "--miles-bug-fsdp-ignores-pause-mode",
}
"""Every LoopConfig flag a user sets -> its command-line spelling (miles' where miles has
the flag; ``scenario`` and ``seed`` belong to a run, not to the loop's flags)."""

FIELD_OF_FLAG: Mapping[str, str] = {flag: name for name, flag in FLAGS.items()}
FIELD_OF_KEY: Mapping[str, str] = {
    flag.removeprefix("--").replace("-", "_"): name
    for name, flag in FLAGS.items()
    if flag.removeprefix("--").replace("-", "_") != name
}
"""A scenario file's key in miles' spelling -> the field (``async_data_buffer_capacity_factor``
-> ``capacity_factor``)."""

assert set(FLAGS) == {f.name for f in fields(LoopConfig)} - {"scenario", "seed"}

MILES_BUGS: tuple[str, ...] = tuple(
    f.name for f in fields(LoopConfig) if f.name.startswith("miles_bug_")
)
"""The switches that put one of miles' bugs in the loop (off by default): a run names those
on in its summary."""


def field_name(name_or_flag: str) -> str:
    """The LoopConfig field behind a field name, a miles flag or its snake_case key."""
    return FIELD_OF_FLAG.get(name_or_flag) or FIELD_OF_KEY.get(name_or_flag, name_or_flag)


def check_until_witnessed(until: int | None, steps: int) -> None:
    """``until_witnessed`` (the most steps a run may take while a fault's effect is awaited)
    is None or a whole number of steps >= ``steps``."""
    if until is None:
        return
    if not isinstance(until, int) or isinstance(until, bool) or until < steps:
        raise ConfigError(
            "until_witnessed",
            f"got {until!r} with [loop].steps = {steps}",
            f"pass a whole number of steps >= {steps} (the most steps the run may take), "
            "or leave it out to run exactly [loop].steps",
        )
