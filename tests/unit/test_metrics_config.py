"""Where the controller serves Prometheus metrics: `lab.metrics` and `--metrics` (inventory.py).

Off unless asked for; an address other than loopback only when the lab's own file allows it,
because the series name the lab's users, jobs and nodes."""
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.settings import MetricsSettings, is_loopback, metrics_address, parse_listen


def _inv(metrics: str):
    return parse_inventory(f"lab:\n  metrics:\n{metrics}nodes: []\n", Path("lab/nodes.yaml"))


def test_metrics_are_off_by_default():
    inv = parse_inventory("nodes: []\n", Path("nodes.yaml"))
    assert inv.metrics == MetricsSettings()
    assert metrics_address(inv.metrics) is None


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("localhost:9100", ("localhost", 9100)),
    ("[::1]:9464", ("::1", 9464)),
    ("9464", ("127.0.0.1", 9464)),      # a bare port: loopback
    (":9464", ("", 9464)),              # every interface
    ("127.0.0.1:0", ("127.0.0.1", 0)),  # any free port
])
def test_listen_addresses(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "host:", "host:http", "127.0.0.1:65536", "a b:1",
                                  "127.0.0.1:-1", "user@host:1"])
def test_bad_listen_addresses(text):
    assert parse_listen(text) is None


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.5", True), ("::1", True), ("localhost", True),
    ("", False), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False),
    ("head.lab.example.org", False)])   # a name is never looked up: it could be anything
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_lab_metrics_on_loopback():
    inv = _inv("    listen: 127.0.0.1:9464\n")
    assert inv.metrics.listen == ("127.0.0.1", 9464) and not inv.metrics.allow_remote
    assert metrics_address(inv.metrics) == ("127.0.0.1", 9464)


def test_lab_metrics_elsewhere_needs_allow_remote():
    with pytest.raises(ConfigError) as info:
        _inv("    listen: 0.0.0.0:9464\n")
    assert info.value.message.startswith("lab/nodes.yaml:3: lab.metrics.listen: not a loopback")
    assert "allow_remote: true" in info.value.message
    inv = _inv("    listen: 0.0.0.0:9464\n    allow_remote: true\n")
    assert metrics_address(inv.metrics) == ("0.0.0.0", 9464)


@pytest.mark.parametrize("metrics, expected", [
    ("    listen: nine\n", "lab/nodes.yaml:3: lab.metrics.listen: expected HOST:PORT"),
    ("    listen: 127.0.0.1:9464\n    allow_remote: yes please\n",
     "lab/nodes.yaml:4: lab.metrics.allow_remote: expected true or false"),
    ("    port: 9464\n", "lab/nodes.yaml:3: lab.metrics.port: unknown key 'port'"),
])
def test_bad_lab_metrics_name_file_line_and_field(metrics, expected):
    with pytest.raises(ConfigError) as info:
        _inv(metrics)
    assert info.value.message.startswith(expected)


def test_the_flag_overrides_the_lab_but_not_its_rule():
    lab = MetricsSettings(listen=("127.0.0.1", 9464))
    assert metrics_address(lab, "127.0.0.1:9500") == ("127.0.0.1", 9500)
    with pytest.raises(ConfigError) as info:
        metrics_address(lab, "0.0.0.0:9500")
    assert info.value.message.startswith("metrics address 0.0.0.0:9500 is not loopback")
    assert "allow_remote" in info.value.hint
    assert metrics_address(MetricsSettings(allow_remote=True), ":9500") == ("", 9500)
    with pytest.raises(ConfigError) as info:
        metrics_address(lab, "bogus")
    assert info.value.message == "--metrics 'bogus': expected HOST:PORT, e.g. 127.0.0.1:9464"
