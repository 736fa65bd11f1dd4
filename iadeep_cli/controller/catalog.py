"""Every profile iadeep knows: the shipped H200 defaults, overridden by the lab's own.

``profile_views`` is the one shape `iadeep profile list/show` print, whether it came from the
controller, the database or the controller's public snapshot (``controller.offline``).
"""
from __future__ import annotations

import logging
from dataclasses import asdict

from .. import paths
from ..model.data import shipped_profiles
from ..profiles import MAX_MEASURED_SPEED, measurable

log = logging.getLogger("iadeep.model")


def profile_views(conn=None) -> list[dict]:
    """One dict per workload label: the profile's fields plus ``source``, ``updated_at``,
    ``pinned_by``, ``pinned_at`` and its newest ``samples`` (job, user, time, verdict).
    ``conn``: the state database, None for the shipped profiles alone."""
    merged = {name: {**asdict(p), "source": "shipped (H200)", "updated_at": None}
              for name, p in shipped_profiles().items()}
    extra: dict[str, dict] = {}
    if conn is not None:
        from ..store import profiles as profrows

        for profile, source, at in profrows.load_profiles(conn):
            merged[profile.workload] = {**asdict(profile), "source": source, "updated_at": at}
        extra = profrows.details(conn)
    for name, view in merged.items():
        found = extra.get(name, {})
        view.update(pinned_by=found.get("pinned_by"), pinned_at=found.get("pinned_at"),
                    samples=found.get("samples", []))
    return [merged[k] for k in sorted(merged)]


def lab_measurements(store=None) -> tuple[dict, list]:
    """(profiles by workload, pair co-locations) measured in this lab, from the database.

    ``store``: an open Store (the controller's); None opens the default database read-only,
    and an absent database simply means no measurements yet.
    """
    from ..store import Store, profiles as profrows

    own = store is None
    if own:
        if not paths.StateDir.default().db.exists():
            return {}, []
        store = Store(readonly=True)
    try:
        with store.tx() as conn:
            found = {p.workload: p for p, _, _ in profrows.load_profiles(conn)}
            pairs = [c for c in profrows.load_colocations(conn) if len(c.jobs) == 2]
    finally:
        if own:
            store.close()
    usable = []
    for c in pairs:
        if measurable(c.speeds):
            usable.append(c)
        else:   # stored by an older controller (a stalled job's 0.0): kept, not fitted
            log.warning("lab measurement %s next to %s at speeds %s left out of the fit: a "
                        "speed must be in (0, %g]", *c.jobs, c.speeds, MAX_MEASURED_SPEED)
    return found, usable
