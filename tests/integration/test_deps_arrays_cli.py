"""--after/--array/--retry-on-fail and `queue rerun` through the real `iadeep` command and a
real controller process (with no nodes: every job stays queued, so what is listed is stable)."""
import json

import pytest

from helpers.controllers import cli, queue_add


@pytest.fixture
def home(controller):
    """The state directory of the shared ``controller`` fixture (tests/integration/conftest)."""
    return controller.home


def _ids(home):
    return {j["id"]: j for j in json.loads(cli(home, "queue", "list", "--all", "--json",
                                               check=True).stdout)}


def test_an_array_is_listed_folded_and_controlled_whole_or_by_task(home, script):
    array = queue_add(home, str(script), "--array", "0-5%2")
    jobs = _ids(home)
    assert sorted((j["array_id"], j["array_index"]) for j in jobs.values()) == \
        [(array, i) for i in range(6)]
    assert all(j["array"] == "0-5%2" for j in jobs.values())
    lines = cli(home, "queue", "list", check=True).stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith(f"{array}_[0-5] ")
    assert cli(home, "queue", "hold", f"{array}_3", check=True).stdout.strip() == \
        f"job {array + 3}: held"
    lines = cli(home, "queue", "list", check=True).stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [f"{array}_[0-2,4-5]", f"{array}_3"]
    shown = cli(home, "queue", "show", f"{array}_3", check=True).stdout
    assert "array_index: 3" in shown and f"array_id: {array}" in shown
    out = cli(home, "queue", "cancel", str(array), check=True).stdout.splitlines()
    assert len(out) == 6 and all(line.endswith(": cancelled") for line in out)
    assert {j["state"] for j in _ids(home).values()} == {"cancelled"}


def test_dependencies_travel_and_are_refused_for_unknown_ids(home, script):
    first = cli(home, "queue", "add", str(script), check=True).stdout.strip()
    second = cli(home, "queue", "add", str(script), "--after", first, "--after-any", first,
                 "--retry-on-fail", "--retries", "2", check=True).stdout.strip()
    shown = json.loads(cli(home, "queue", "show", second, "--json", check=True).stdout)
    assert (shown["after"], shown["after_any"], shown["retry_on_fail"]) == \
        ([int(first)], [int(first)], True)
    bad = cli(home, "queue", "add", str(script), "--after", "999")
    assert bad.returncode != 0 and "--after 999: there is no job 999" in bad.stderr
    bad = cli(home, "queue", "add", str(script), "--after", "1;2")
    assert bad.returncode != 0 and "not a list of job ids" in bad.stderr
    bad = cli(home, "queue", "add", str(script), "--array", "0-20000")
    assert bad.returncode != 0 and "more than 10000 tasks" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) <= 2   # message and hint, no traceback


def test_rerun_makes_a_new_job_that_names_the_old_one(home, script):
    first = cli(home, "queue", "add", str(script), "x", check=True).stdout.strip()
    refused = cli(home, "queue", "rerun", first)
    assert refused.returncode != 0 and "only a finished job can be run again" in refused.stderr
    cli(home, "queue", "cancel", first, check=True)
    again = cli(home, "queue", "rerun", first, check=True).stdout.strip()
    assert again != first
    shown = json.loads(cli(home, "queue", "show", again, "--json", check=True).stdout)
    assert (shown["rerun_of"], shown["args"], shown["state"]) == (int(first), ["x"], "queued")
    assert f"rerun_of: {first}" in cli(home, "queue", "show", again, check=True).stdout


def test_a_rerun_task_alone_is_labelled_with_its_task(home, script):
    """`queue rerun 12_3`: the new run is 12_3 (what the name refers to from now on); the
    earlier run is listed by its own id, never a second 12_3."""
    array = queue_add(home, str(script), "--array", "0-1")
    cli(home, "queue", "cancel", str(array), check=True)
    again = int(cli(home, "queue", "rerun", f"{array}_1", check=True).stdout)
    rows = [line.split()[0] for line in
            cli(home, "queue", "list", "--all", check=True).stdout.splitlines()[1:]]
    assert sorted(rows) == sorted([f"{array}_0", str(array + 1), f"{array}_1"]), rows
    cancelled = cli(home, "queue", "cancel", f"{array}_1", check=True).stdout.strip()
    assert cancelled == f"job {again}: cancelled"
