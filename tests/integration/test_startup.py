"""The fast commands must not pay for numpy, scipy, textual or paramiko (timing: benchmarks/);
sklearn stays in the list so that a future import of it is caught too."""
import json
import subprocess
import sys

import pytest

from helpers.controllers import env_for

PROBE = """
import json, sys
from iadeep_cli.cli.main import main
sys.argv = ["iadeep", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"sklearn", "textual", "paramiko",
                                                         "rich", "numpy", "scipy",
                                                         "prometheus_client"})
print("HEAVY=" + json.dumps(heavy))
"""


@pytest.mark.parametrize("argv", [["status"], ["queue", "list"], ["queue", "list", "--json"],
                                  ["status", "--json"]])
def test_fast_commands_import_nothing_heavy(tmp_path, argv):
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env_for(tmp_path),
                         capture_output=True, text=True, timeout=60).stdout
    heavy = json.loads(out.rsplit("HEAVY=", 1)[1])
    assert heavy == []
