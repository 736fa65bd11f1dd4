"""Inventory validation: every mistake names the file, the line and the field."""
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import load_inventory, parse_inventory

ROOT = Path(__file__).resolve().parent.parent


def test_example_inventory_is_valid_and_complete():
    inv = load_inventory(ROOT / "nodes.yaml.example")
    assert [n.name for n in inv.nodes] == ["head", "gpu1", "gpu2"]
    head, gpu1, _ = inv.nodes
    assert head.local and head.gpus == (0, 1)
    assert gpu1.port == 22 and gpu1.user == "iadeep" and gpu1.max_jobs_per_gpu == 3
    assert inv.admins == ("pi", "sysadmin")
    assert inv.policy.share_threshold == 1.1 and inv.policy.max_jobs_per_gpu == 2
    assert inv.policy.reserve_after_s == 3600
    assert inv.user_limits["student1"].max_gpus == 4
    assert inv.is_admin("pi") and not inv.is_admin("student1")


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_inventory(text, Path("lab/nodes.yaml"))
    return info.value.message


@pytest.mark.parametrize("text, expected", [
    ("nodes:\n  - name: a\n    host: h\n    prot: 22\n",
     "lab/nodes.yaml:4: nodes[0].prot: unknown key 'prot'"),
    ("nodes:\n  - name: a\n    host: h\n    port: twenty\n",
     "lab/nodes.yaml:4: nodes[0].port: expected an integer, got 'twenty'"),
    ("nodes:\n  - name: a\n    host: h\n  - name: a\n    host: i\n",
     "lab/nodes.yaml:4: nodes[1].name: duplicate node name 'a' (also nodes[0])"),
    ("nodes:\n  - host: h\n", "lab/nodes.yaml:2: nodes[0].name: missing"),
    ("lab:\n  admins: alice\n", "lab/nodes.yaml:2: lab.admins: expected a list of strings"),
    ("lab:\n  policy:\n    min_speed: -1\n", "lab/nodes.yaml:3: lab.policy.min_speed: expected"),
    ("lab:\n  poll_interval: yes\n", "lab/nodes.yaml:2: lab.poll_interval: expected a number"),
    ("nodes:\n  - name: a\n    host: h\n    gpus: [0, x]\n", "lab/nodes.yaml:4: nodes[0].gpus[1]"),
    ("nodes:\n  - name: a\n    host: h\n    local: 1\n",
     "lab/nodes.yaml:4: nodes[0].local: expected true or false"),
    ("clusters: []\n", "lab/nodes.yaml:1: clusters: unknown key"),
    ("nodes: [\n", "lab/nodes.yaml:2: not valid YAML"),
    ("nodes:\n  - name: a\n    host: h\n    port: !!int abc\n",
     "lab/nodes.yaml:4: nodes[0].port: cannot read value 'abc'"),
    ("nodes:\n  - name: a\n    host: h\n    port: !custom 1\n",
     "lab/nodes.yaml:4: nodes[0].port: cannot read value '1'"),
])
def test_bad_inventory_names_file_line_and_field(text, expected):
    assert _error(text).startswith(expected)


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_inventory(tmp_path / "nodes.yaml")
    assert "inventory file not found" in info.value.message
    assert "--inventory" in info.value.hint


def test_unreadable_file(tmp_path):
    (tmp_path / "dir.yaml").mkdir()  # readable by nobody as a file, even root
    with pytest.raises(ConfigError, match="cannot read inventory"):
        load_inventory(tmp_path / "dir.yaml")


def test_lookup_order(tmp_path, monkeypatch):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "nodes.yaml").write_text("nodes:\n  - name: fromstate\n    host: h\n")
    (tmp_path / "env.yaml").write_text("nodes:\n  - name: fromenv\n    host: h\n")
    monkeypatch.setenv("IADEEP_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("IADEEP_INVENTORY", raising=False)
    assert load_inventory().nodes[0].name == "fromstate"
    monkeypatch.setenv("IADEEP_INVENTORY", str(tmp_path / "env.yaml"))
    assert load_inventory().nodes[0].name == "fromenv"
    explicit = tmp_path / "x.yaml"
    explicit.write_text("nodes:\n  - name: explicit\n    host: h\n")
    assert load_inventory(explicit).nodes[0].name == "explicit"


def test_empty_inventory_is_an_empty_cluster(tmp_path):
    assert parse_inventory("", tmp_path / "n.yaml").nodes == ()
