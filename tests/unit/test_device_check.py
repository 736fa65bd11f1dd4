"""``benchmarks/device_check.sh`` runs only on a machine with a GPU, rarely and on lent time, so
what can be checked without one is checked here: the script parses (``bash -n``) and the
inventory it writes is one the controller accepts (it once asked for a ``share_threshold`` the
inventory rules had come to reject, and would have failed at its second step)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from iadeep_cli.inventory import parse_inventory

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_its_inventory_is_valid(tmp_path):
    [text] = re.findall(r'cat > "\$INV" <<EOF\n(.*?)\nEOF\n', SCRIPT.read_text(), re.S)
    inv = parse_inventory(text.replace("$WORK", str(tmp_path)), tmp_path / "nodes.yaml")
    [node] = inv.nodes
    assert node.local and node.workdir == f"{tmp_path}/wd"
    assert inv.policy.share_threshold == 1.0 and inv.policy.min_speed == 0.1
