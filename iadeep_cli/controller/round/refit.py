"""The controller's model refit, run as a child process at low priority.

A fit is seconds of numpy and scipy on the head node's CPU; in the controller's own interpreter
it would hold the interpreter lock against the scheduling rounds. The controller starts
``python -m iadeep_cli.controller.round.refit --db DB --out FILE`` instead: the child lowers its
priority (``nice`` 10), reads the lab's profiles and pairs from the database read-only, fits on
them and the shipped data, and writes the model's plain numbers to FILE (atomically). The
previous FILE's selected setting is reused while the data grew by at most 10 % since it was
selected (an incremental refit: one fit instead of the selection's ~200). The
controller's waiting thread only loads that file (numpy, no scipy) and swaps the model in.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...paths import replace_file

NICE = 10


def command(db: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "iadeep_cli.controller.round.refit", "--db", str(db), "--out",
            str(out)]


def run(db: Path, out: Path, timeout_s: float | None = None
        ) -> subprocess.CompletedProcess[str]:
    """Refit in a child process (blocks the calling thread only, not the interpreter)."""
    return subprocess.run(command(db, out), capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


def _previous(path: Path) -> dict[str, Any] | None:
    """The last refit's numbers (its selected setting is reused while the data grew little),
    or None when there is none or it cannot be read (then a full fit)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="iadeep-refit")
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        os.nice(NICE)
    except OSError:
        pass
    from ...model.data import shipped_pairs, shipped_profiles
    from ...model.fit import fit_parameters
    from ...store import Store
    from ..catalog import lab_measurements

    lab_profiles: dict[str, Any] = {}
    lab_pairs: list[Any] = []
    if args.db.exists():
        store = Store(args.db, readonly=True)
        try:
            lab_profiles, lab_pairs = lab_measurements(store)
        finally:
            store.close()
    params = fit_parameters(shipped_profiles(), shipped_pairs(), extra_profiles=lab_profiles,
                            extra_observations=lab_pairs, previous=_previous(args.out))
    replace_file(args.out, json.dumps(params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
