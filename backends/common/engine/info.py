"""What the CPU engine reports of itself: SGLang's /model_info and /server_info bodies.

/model_info (entrypoints/http_server.py ``model_info``) carries what a weight
update changes, ``weight_version`` among them (miles' ``get_weight_version`` reads
it, falling back to the removed /get_weight_version). /server_info and its
deprecated alias /get_server_info (``server_info``: the resolved server arguments,
``launch_command``, scheduler info, ``startup_time``, ``internal_states``,
``version``) are read whole by miles: its p2p transfer builds ``ServerArgs`` from
them (p2p_transfer_utils.py, ``create_server_args_from_dict``), and
``--rollout-external`` compares the fields it would have launched with
(sglang_engine.py ``_init_external``). Every key of ``SERVER_ARGS`` is a SGLang
server argument (the contract test holds them to the wheel's flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from backends.common.sglang.contract import SGLANG_VERSION

SERVER_INFO_EXTRAS: Final = frozenset(
    {"launch_command", "startup_time", "internal_states", "version", "frontend", "kv_events"}
)
"""/server_info keys that are not server arguments (``server_info``, ``build_server_info``)."""


@dataclass(frozen=True)
class EngineInfo:
    """The facts an engine process reports; fixed when it starts."""

    model_path: str
    host: str
    port: int
    context_length: int
    device: str
    dtype: str
    started: float
    """Seconds since the epoch at start (SGLang's ``startup_time``)."""

    def server_args(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_path,
            "host": self.host,
            "port": self.port,
            "tp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            "ep_size": 1,
            "context_length": self.context_length,
            "device": self.device,
            "dtype": self.dtype,
            "load_format": "auto",
            "skip_tokenizer_init": True,
            "random_seed": 0,
        }

    def server_info(self, running: int, paused: bool, session_open: bool = False) -> dict[str, Any]:
        """``session_open``: a weight-update session is open, reported in internal_states
        under the testbed's own key (what a hot-restarted driver reads to close the window
        the dead one left open: miles' ``is_update_weights_window_open``)."""
        return {
            **self.server_args(),
            "launch_command": f"testbed engine {self.model_path} on {self.host}:{self.port}",
            "startup_time": self.started,
            "internal_states": [
                {
                    "running_requests": running,
                    "paused": paused,
                    "testbed_session_open": session_open,
                }
            ],
            "version": SGLANG_VERSION,
            "frontend": "python",
        }

    def model_info(self, weight_version: str) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "served_model_name": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": weight_version,
            "load_format": "auto",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        }
