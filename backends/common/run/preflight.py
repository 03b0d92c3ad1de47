"""What the ``run`` command checks on this machine before Ray starts: the folders it reads
and writes, and that the cluster it is told to join answers.

Each of these used to fail only after Ray had started (``--load /nonexistent``: exit 2
after 23 s) or at the end of the run (``--save`` into a folder that cannot be made), or
with Ray's own output (``--address`` to a host nobody answers at: 72 lines, three
tracebacks). Imports neither Ray nor torch, so a wrong command fails in a second.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from miles_core.errors import ConfigError

CHECKPOINT_FILE = "checkpoint.pt"
"""The file ``--save`` writes in its folder and ``--load`` reads
(backends.common.run.checkpoint)."""

REACH_SECONDS = 3.0
"""How long ``--address`` gets to accept a connection before the run is refused."""

JOIN_WORDS = ("auto", "local")
"""``--address`` values Ray resolves itself (a cluster on this machine): not probed here."""


def check_load(folder: str, periodic: bool = False) -> Path:
    """``--load DIR``: a folder holding a checkpoint that ``--save`` wrote, or (``periodic``:
    with --save-interval) a killed job's folder of periodic saves, whatever it holds (no
    committed save: the job starts over)."""
    path = Path(folder)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ConfigError("--load", f"{folder!r} {what}", "pass a directory written by --save")
    if not (path / CHECKPOINT_FILE).is_file() and not periodic:
        raise ConfigError(
            "--load",
            f"{folder!r} holds no {CHECKPOINT_FILE}",
            "pass a directory written by --save, or add --save-interval to resume a job's "
            "periodic saves",
        )
    return path


def check_save(folder: str) -> Path:
    """``--save DIR``: a folder that exists and takes a file, or one that can be made (the
    checkpoint is written at the end of the run: a path that fails then loses the run)."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ConfigError("--save", f"{folder!r} is a file", "pass a directory (made if missing)")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError("--save", f"{str(existing)!r} is a file", "fix the path")
    try:  # os.access says yes to root on /proc; making a file is the only sure test
        with tempfile.TemporaryDirectory(dir=existing, prefix=".save-probe-"):
            pass
    except OSError as error:
        raise ConfigError(
            "--save",
            f"cannot make {folder!r}: {error.strerror or error} in {str(existing)!r}",
            "pick a writable directory",
        ) from None
    return path


def _host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``ray://HOST:PORT`` (IPv6 in brackets) as (host, port)."""
    rest = address.removeprefix("ray://")
    try:
        parts = urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None or parts.path or parts.query:
        raise ConfigError(
            "--address",
            f"got {address!r}",
            "write HOST:PORT (the Ray head's GCS port, 6379 unless ray start --port said "
            "otherwise), ray://HOST:PORT for Ray Client, or auto",
        )
    return host, port


def check_address(address: str | None, seconds: float = REACH_SECONDS) -> None:
    """``--address``: something accepts a connection there within ``seconds``, and (for a
    GCS address) answers as a Ray cluster's GCS."""
    if address is None or address in JOIN_WORDS:
        return
    host, port = _host_port(address)
    why = _unreachable(host, port, seconds)
    if why is None and not address.startswith("ray://"):  # Ray Client speaks another protocol
        why = _not_a_gcs(f"{host}:{port}", GCS_SECONDS)
    if why is not None:
        raise ConfigError(
            "--address",
            f"cannot join a Ray cluster at {address!r} ({why})",
            "start Ray there (ray start --head), check the host and port, or leave --address "
            "out to start a local Ray",
        )


def _unreachable(host: str, port: int, seconds: float) -> str | None:
    """Why nothing accepts a TCP connection at host:port (None: something does)."""
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return None
    except socket.gaierror:
        return f"the host name {host!r} does not resolve"
    except TimeoutError:
        return f"no answer from {host}:{port} in {seconds:g} s"
    except OSError as error:
        return f"{host}:{port}: {error.strerror or error}"


GCS_SECONDS = 15.0
"""How long the GCS probe may take (importing Ray is about 2 s of it; a GCS answers at once)."""

_GCS_PROBE = """
import sys
try:
    from ray._raylet import GcsClient
    from ray.exceptions import RayError
except Exception:
    print("unknown")  # a Ray without this API: ray.init will say what is wrong
    sys.exit(0)
try:
    GcsClient(address=sys.argv[1])
except (RayError, OSError) as error:  # what the GCS (or what is there) answered
    print(f"{type(error).__name__}: {error}")
except Exception:
    print("unknown")  # the API changed: not the address's fault
else:
    print("ok")
"""


def _not_a_gcs(address: str, seconds: float) -> str | None:
    """Why ``address`` does not answer as a Ray GCS (None: it does, or this cannot tell).

    Asked as ray.init asks (``GcsClient``), in a child process: ray.init retries for 20 s,
    printing a line a second and three tracebacks, before it gives up; the child's output
    is kept, and its Ray state goes with it."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _GCS_PROBE, address],
            capture_output=True,
            text=True,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired:
        return f"no answer as a Ray GCS in {seconds:g} s"
    answer = (done.stdout.strip().splitlines() or ["unknown"])[-1]
    if done.returncode != 0 or answer in ("ok", "unknown"):
        return None
    return f"something answers there, but Ray cannot join it: {answer}"


def check_folders(
    load: str | None, save: str | None, periodic: bool = False
) -> tuple[Path | None, Path | None]:
    """``--load`` and ``--save`` checked (either may be None: not given)."""
    return (
        check_load(load, periodic) if load is not None else None,
        check_save(save) if save is not None else None,
    )
