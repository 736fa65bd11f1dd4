"""Every profile iadeep knows: the shipped H200 defaults, overridden by the lab's own.

Read-only and database-direct (profiles are not scheduling state), so `iadeep profile list`
works whether or not the controller runs.
"""
from __future__ import annotations

from dataclasses import asdict

from .. import paths
from .profiles import shipped_profiles


def known_profiles() -> list[dict]:
    """One dict per workload label: the profile's fields plus ``source`` and ``updated_at``."""
    merged = {name: {**asdict(p), "source": "shipped (H200)", "updated_at": None}
              for name, p in shipped_profiles().items()}
    if paths.db_path().exists():
        from ..store import Store, profiles as profrows

        store = Store(readonly=True)
        try:
            with store.tx() as conn:
                for profile, source, at in profrows.load_profiles(conn):
                    merged[profile.workload] = {**asdict(profile), "source": source,
                                                "updated_at": at}
        finally:
            store.close()
    return [merged[k] for k in sorted(merged)]


def lab_measurements(store=None) -> tuple[dict, list]:
    """(profiles by workload, pair co-locations) measured in this lab, from the database.

    ``store``: an open Store (the controller's); None opens the default database read-only,
    and an absent database simply means no measurements yet.
    """
    from ..store import Store, profiles as profrows

    own = store is None
    if own:
        if not paths.db_path().exists():
            return {}, []
        store = Store(readonly=True)
    try:
        with store.tx() as conn:
            found = {p.workload: p for p, _, _ in profrows.load_profiles(conn)}
            pairs = [c for c in profrows.load_colocations(conn) if len(c.jobs) == 2]
    finally:
        if own:
            store.close()
    return found, pairs
