"""``lab.job_dir_retention``: how long finished jobs' directories stay on the nodes (issue 9.5).
Removing them is ``Backend.clean`` (the shell's ``clean_finished``), tested on a real sshd node in
test_node_untrusted_sshd.py."""
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import load_inventory, parse_inventory

ROOT = Path(__file__).resolve().parents[2]


def retention(value: str) -> float:
    return parse_inventory(f"lab:\n  job_dir_retention: {value}\n",
                           Path("nodes.yaml")).job_dir_retention_s


def test_default_and_example_keep_a_week():
    assert parse_inventory("", Path("nodes.yaml")).job_dir_retention_s == 7 * 86400
    assert load_inventory(ROOT / "nodes.yaml.example").job_dir_retention_s == 7 * 86400


@pytest.mark.parametrize("value, seconds", [
    ("7d", 604800), ("12h", 43200), ("30m", 1800), ("90s", 90), ("3600", 3600), ("0", 0),
    ("1.5d", 129600),
])
def test_durations(value, seconds):
    assert retention(value) == seconds


@pytest.mark.parametrize("value", ["-1d", "soon", "7y", ".nan", "1e400", "true", "[1]"])
def test_bad_durations_name_file_line_and_field(value):
    with pytest.raises(ConfigError) as info:
        retention(value)
    assert info.value.message.startswith("nodes.yaml:2: lab.job_dir_retention: ")


def test_time_limit_settings_are_durations_and_the_default_fits_the_maximum():
    inv = parse_inventory("lab:\n  default_time_limit: 12h\n  max_time_limit: 7d\n"
                          "  kill_grace: 30\n", Path("nodes.yaml"))
    assert (inv.default_time_limit_s, inv.max_time_limit_s, inv.kill_grace_s) == \
        (12 * 3600, 7 * 86400, 30)
    plain = parse_inventory("", Path("nodes.yaml"))
    assert (plain.default_time_limit_s, plain.max_time_limit_s, plain.kill_grace_s) == \
        (None, None, 10)
    with pytest.raises(ConfigError, match=r"nodes.yaml:2: lab.default_time_limit: expected at "
                                          r"most lab.max_time_limit \(3600 s\)"):
        parse_inventory("lab:\n  default_time_limit: 2h\n  max_time_limit: 1h\n",
                        Path("nodes.yaml"))
    with pytest.raises(ConfigError, match=r"lab\.max_time_limit: expected a duration > 0, got 0"):
        parse_inventory("lab:\n  max_time_limit: 0\n", Path("nodes.yaml"))
