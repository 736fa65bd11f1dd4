"""How fast `iadeep status` and `iadeep queue list` answer, against `python -c pass`.

Target (issue 2): median wall time under 0.3 s on the lab machine. Runs a real controller in a
temporary state directory with 200 queued jobs; each command is a whole new process.
Usage: .venv/bin/python benchmarks/bench_startup.py [--repeats N]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON_PASS, compile_package, python_pass, report, slowest, time_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    opts = parser.parse_args()
    compile_package()
    home = Path(tempfile.mkdtemp(prefix="iadeep-bench-"))
    env = {**os.environ, "IADEEP_HOME": str(home)}
    (home / "nodes.yaml").write_text("nodes: []\n")   # an empty cluster: no nodes to poll
    iadeep = [sys.executable, "-m", "iadeep_cli"]
    ctl = subprocess.Popen([*iadeep, "controller", "run"], env=env, stdout=subprocess.DEVNULL)
    try:
        while not (home / "controller.sock").exists():
            time.sleep(0.05)
        from iadeep_cli.controller import client
        os.environ["IADEEP_HOME"] = str(home)
        for i in range(200):
            client.submit({"script": "/bin/true", "name": f"job{i}"}, b"#!/bin/sh\ntrue\n")
        rows = [
            python_pass(opts.repeats),
            ("iadeep status", time_process([*iadeep, "status"], opts.repeats, env=env)),
            ("iadeep queue list (200 jobs)", time_process([*iadeep, "queue", "list"],
                                                          opts.repeats, env=env)),
        ]
    finally:
        ctl.terminate()
        ctl.wait()
    report(rows, PYTHON_PASS)
    slowest(rows[1:], "command", 0.3)


if __name__ == "__main__":
    main()
