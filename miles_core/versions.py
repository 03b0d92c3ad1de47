"""The version ledger: the one authority that issues weight versions.

In miles each trainer's weight updater kept a private counter
(``weight_version += 1``) and pushed it to the rollout manager. Under
``--indep-dp`` the survivor of a failover started from its own counter, so the
version went from 57 back to 1, staleness turned negative and the most
off-policy groups were trained on; the rollout manager only logged a warning
(seed report on PR #2244, open problem P2).

Here no updater counts. An updater *reserves* the next version from the ledger,
transfers, stamps the engines with the reserved number and the ledger
*publishes* it. A reservation that is never published (the updater died) is
handed to the next updater unchanged, so a failover continues the sequence by
construction and a half-done update advances the version once. The ledger's
snapshot is saved in every checkpoint; restoring never moves it backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.errors import VersionRegressionError, int_at_least

INITIAL_WEIGHTS_VERSION = 0
"""Staleness arithmetic treats weights that were never updated as version 0.

The published version is None until the first update (staleness filtering is
off then); once version 1 exists, a sample generated from the initial weights
is 1 version old, not of unknown age.
"""


@dataclass(frozen=True)
class LedgerSnapshot:
    """What a checkpoint stores of the ledger."""

    version: int | None


@dataclass(frozen=True)
class Reservation:
    """A version handed to an updater for one update, not yet published."""

    version: int
    updater: str


class VersionLedger:
    """Issues, publishes and remembers the weight version; it never goes backwards."""

    def __init__(self, snapshot: LedgerSnapshot | None = None) -> None:
        self._version: int | None = None
        self._reservation: Reservation | None = None
        if snapshot is not None:
            self.restore(snapshot)

    @property
    def current(self) -> int | None:
        """The last published version; None before the first update."""
        return self._version

    @property
    def reservation(self) -> Reservation | None:
        """The update in progress, if any."""
        return self._reservation

    def next_version(self) -> int:
        """The version the next update will carry."""
        return (self._version or 0) + 1

    def reserve(self, updater: str) -> int:
        """Reserve the next version for ``updater``.

        A reservation left by an updater that died is taken over: the new
        updater gets the same number, so the sequence has no gap and no repeat.
        """
        version = self.next_version()
        self._reservation = Reservation(version, updater)
        return version

    def abandon(self, version: int) -> None:
        """The update carrying ``version`` failed; the next reservation reuses the number."""
        if self._reservation is not None and self._reservation.version == version:
            self._reservation = None

    def publish(self, version: int, updater: str) -> int:
        """Publish ``version``: it must be the one reserved for ``updater``."""
        self.check_forward(version, source=updater)
        reservation = self._reservation
        if reservation is None or reservation != Reservation(version, updater):
            held = (
                "nothing is reserved"
                if reservation is None
                else (
                    f"the reservation is version {reservation.version} for {reservation.updater!r}"
                )
            )
            raise VersionRegressionError(
                f"updater {updater!r} published weight version {version} but {held}; "
                "call reserve() before the transfer and publish the number it returned"
            )
        self._version = version
        self._reservation = None
        return version

    def check_forward(self, version: int, source: str) -> None:
        """Raise if ``version`` is not ahead of the published one."""
        if not int_at_least(version, 1):
            raise VersionRegressionError(
                f"{source!r} reported weight version {version!r}; versions are integers >= 1"
            )
        if self._version is not None and version <= self._version:
            raise VersionRegressionError(
                f"weight version would go backwards: published {self._version}, then {version} "
                f"from {source!r}. Versions come from the ledger (reserve/publish), never from a "
                "per-cell counter; a failover must continue the sequence"
            )

    def snapshot(self) -> LedgerSnapshot:
        """The state a checkpoint stores."""
        return LedgerSnapshot(self._version)

    def restore(self, snapshot: LedgerSnapshot) -> None:
        """Load a checkpoint's ledger; refuses one older than what was published."""
        version = snapshot.version
        if version is None:
            if self._version is not None:
                raise VersionRegressionError(
                    f"restoring a checkpoint with no weight version would move the ledger back "
                    f"from {self._version} to None; restore the latest checkpoint instead"
                )
            return
        if not int_at_least(version, 1):
            raise VersionRegressionError(
                f"checkpoint holds weight version {version!r}; versions are integers >= 1"
            )
        if self._version is not None and version < self._version:
            raise VersionRegressionError(
                f"restoring a checkpoint at weight version {version} would move the ledger back "
                f"from {self._version}; restore the latest checkpoint instead"
            )
        self._version = version
        self._reservation = None


def staleness(current: int | None, oldest: int | None) -> int | None:
    """current - oldest, or None when the current version is unknown (filtering is off)."""
    if current is None:
        return None
    return current - (INITIAL_WEIGHTS_VERSION if oldest is None else oldest)


def untrusted_version(
    reported: tuple[int | None, ...], stamped: int | None, published: int | None
) -> str | None:
    """Why the versions an engine process reported for a completed request (each span's, in
    order) cannot be trusted, or None. An honest process reports at least what it was stamped
    with before the request was sent (a stamp is recorded once the process answered it), at
    most the version an update can have sent it (the published one + 1), and spans that never
    go back: anything else was set from outside the control plane (SGLang's
    /update_weight_version takes any string), and the sample would carry a version no update
    explains."""
    newest = (published or 0) + 1
    floor = stamped
    for version in reported:
        if version is None:
            if floor is not None:
                return f"reported no version (SGLang's 'default') after version {floor}"
        elif version > newest:
            return f"reported weight_version {version}, above {newest}, the newest any update sent"
        elif floor is not None and version < floor:
            return (
                f"reported weight_version {version} after version {floor} (its stamp, or an "
                "earlier span of the same request): its version went backwards"
            )
        else:
            floor = version
    return None
