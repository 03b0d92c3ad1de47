"""``--address``: the Ray cluster a command is told to join answers, as a Ray GCS, before
Ray starts (the real ``run`` commands and ``python -m sim sweep`` ask it).

Ray's own answer to an address nobody answers at is 72 lines and three tracebacks after
20 s of retries. Imports neither Ray nor torch: the probe that speaks to a GCS runs Ray in
a child process, whose state goes with it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from urllib.parse import urlsplit

from miles_core.errors import ConfigError

REACH_SECONDS = 3.0
"""How long ``--address`` gets to accept a connection before the run is refused."""

JOIN_WORDS = ("auto", "local")
"""``--address`` values Ray resolves itself (a cluster on this machine): not probed here."""


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
