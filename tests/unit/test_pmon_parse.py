"""Per-process figures over SSH: ``nvidia-smi pmon -c 1 -s um`` in the poll, parsed
(``nodes/gpu.parse_pmon``) and put on each GPU process (``shell/jobstate.attach``), against the
H200 fixture built from the real captures (tests/fixtures/nvidia-smi/README.md) and variants
of the formats drivers print; and the poll script itself, run against the stand-in
nvidia-smi."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from iadeep_cli.nodes.gpu import MARK, PMON_QUERY, ProcessUtil, gpu_script, parse_pmon
from iadeep_cli.nodes.shell.jobstate import parse_poll, poll_script

pytestmark = pytest.mark.unit
FAKES = Path(__file__).resolve().parents[1] / "fakes"
GPU_LOADED = "h200-loaded-query-gpu-full.csv-noheader-nounits.txt"
APPS_PAIR = "h200-pair-compute-apps-full.csv-noheader-nounits.txt"
OLD_DRIVER = """\
# gpu        pid  type    sm   mem   enc   dec    fb   command
# Idx          #   C/G     %     %     %     %    MB   name
    0      20131     C    15     8     -     -  4012   python train.py
    1      34567     G    22    15     -     -    97   Xorg
    1      34568     C     -     -     -     -   512
"""


def poll_output(gpu: str, apps: str, pmon: str | None) -> str:
    """What the poll script prints, with (or without) its pmon section."""
    tail = "" if pmon is None else f"{MARK} pmon\n{pmon}\n"
    return (f"{MARK} state\n\n{MARK} dirs\n\n{MARK} gpu 0\n{gpu}\n{MARK} apps 0\n{apps}\n"
            f"{MARK} procs\n\n" + tail)


def test_the_h200_pmon_figures_reach_each_process_of_an_ssh_poll(smi_fixture):
    captured = {s["pid"]: s for s in
                json.loads(smi_fixture("h200-pair-nvml-process-utilization.json"))}
    snap = parse_poll("n1", poll_output(smi_fixture(GPU_LOADED), smi_fixture(APPS_PAIR),
                                        smi_fixture("h200-pair-pmon-um.txt")))
    assert snap.ok
    [gpu] = snap.gpus
    assert len(gpu.processes) == 14
    for proc in gpu.processes:
        sample = captured.get(proc.pid)
        assert proc.sm_util == (sample["sm"] if sample else None)
        assert proc.mem_util == (sample["mem"] if sample else None)
    assert sum(p.sm_util is not None for p in gpu.processes) == len(captured) == 8


def test_an_idle_gpus_row_of_dashes_is_no_process():
    assert parse_pmon((FAKES.parent / "fixtures" / "nvidia-smi" /
                       "h200-idle-pmon-um.txt").read_text()) == {}


def test_an_older_drivers_fewer_columns_are_read_from_its_header():
    """No jpg/ofa/ccpm, a command with a space, a row without its command."""
    assert parse_pmon(OLD_DRIVER) == {(0, 20131): ProcessUtil(15.0, 8.0),
                                      (1, 34567): ProcessUtil(22.0, 15.0),
                                      (1, 34568): ProcessUtil(None, None)}


def test_runs_for_groups_of_gpus_each_with_its_header_are_all_read(smi_fixture):
    pair = smi_fixture("h200-pair-pmon-um.txt")
    second = pair.replace("\n    0 ", "\n    5 ")
    figures = parse_pmon(pair + OLD_DRIVER + second)
    assert figures[(0, 458)] == figures[(5, 458)] == ProcessUtil(17.0, 4.0)
    assert figures[(0, 20131)] == ProcessUtil(15.0, 8.0)


def test_a_process_with_a_compute_and_a_graphics_row_sums_them_up_to_100():
    text = OLD_DRIVER.splitlines()[0] + "\n" + "\n".join([
        "    0    4712     C     70     1     -     -    10   app",
        "    0    4712     G     45     -     -     -    10   app",
        "    0    4713     C      -     -     -     -    10   app",
        "    0    4713     G      5     2     -     -    10   app"])
    assert parse_pmon(text) == {(0, 4712): ProcessUtil(100.0, 1.0),
                                (0, 4713): ProcessUtil(5.0, 2.0)}


def test_garbage_figures_and_rows_are_skipped_without_failing_the_node(smi_fixture):
    header = "\n".join(smi_fixture("h200-pair-pmon-um.txt").splitlines()[:2])
    garbage = "\n".join([
        "    0     999     C     50     5",                         # rows before any header
        header,
        "    0    1001     C    NaN    -5     -     -     -     -   10    0   a",
        "    0    1002     C   1e400  inf     -     -     -     -   10    0   b",
        "    0     nan     C     10    10     -     -     -     -   10    0   c",
        "    x    1003     C     10    10     -     -     -     -   10    0   d",
        "    0    1004     C    101    -1     -     -     -     -   10    0   e",
        "    0  garbage",
        "No running processes found",
        "# some other table",
        "    0    1005     C     10    10",
        "# sm mem gpu pid",                                          # no command column
        "    0    1006     1    1007"])
    assert parse_pmon(garbage) == {(0, 1001): ProcessUtil(None, None),
                                   (0, 1002): ProcessUtil(None, None),
                                   (0, 1004): ProcessUtil(None, None)}
    snap = parse_poll("n1", poll_output(smi_fixture(GPU_LOADED), smi_fixture(APPS_PAIR),
                                        garbage))
    assert snap.ok and len(snap.gpus[0].processes) == 14
    assert all(p.sm_util is None for p in snap.gpus[0].processes)


@pytest.mark.parametrize("pmon", [None, "", "Failed to process command line",
                                  "NVIDIA-SMI has failed because it couldn't communicate with "
                                  "the NVIDIA driver."])
def test_pmon_missing_or_failing_costs_only_the_figures(smi_fixture, pmon):
    snap = parse_poll("n1", poll_output(smi_fixture(GPU_LOADED), smi_fixture(APPS_PAIR), pmon))
    assert snap.ok and len(snap.gpus[0].processes) == 14
    assert all(p.sm_util is None and p.mem_util is None for p in snap.gpus[0].processes)


def test_a_gpu_in_mig_mode_gets_no_per_process_figures(smi_fixture):
    """MIG: the driver does not attribute utilisation to processes (a 0 there is no 0)."""
    gpu = smi_fixture(GPU_LOADED).replace(", Disabled, Enabled", ", Enabled, Enabled")
    assert gpu != smi_fixture(GPU_LOADED)
    snap = parse_poll("n1", poll_output(gpu, smi_fixture(APPS_PAIR),
                                        smi_fixture("h200-pair-pmon-um.txt")))
    assert snap.ok and len(snap.gpus[0].processes) == 14
    assert all(p.sm_util is None for p in snap.gpus[0].processes)


def _run_gpu_part(tmp_path: Path, mode: str, gpus: int) -> dict[str, str]:
    """The poll's GPU part run by sh against the stand-in nvidia-smi; sections by name."""
    state = tmp_path / "smi"
    state.mkdir()
    (state / "mode").write_text(mode)
    (state / "gpus").write_text(str(gpus))
    (state / "noscan").write_text("")
    env = {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_SMI_STATE": str(state)}
    out = subprocess.run(["sh", "-c", gpu_script()], env=env, capture_output=True, text=True,
                         timeout=60, check=False).stdout
    sections: dict[str, str] = {}
    name = ""
    for line in out.splitlines():
        if line.startswith(MARK):
            name = line.split()[1]
            sections[name] = ""
        else:
            sections[name] += line + "\n"
    return sections


def test_the_poll_asks_pmon_for_six_gpus_in_two_runs_of_at_most_four(tmp_path):
    sections = _run_gpu_part(tmp_path, "loaded", 6)
    pmon = sections["pmon"]
    assert pmon.count("# gpu") == 2
    assert {i for i, _ in parse_pmon(pmon)} == {0}   # the capture's processes are on GPU 0
    rows = [ln.split()[0] for ln in pmon.splitlines() if not ln.startswith("#")]
    assert set(rows) == {"0", "1", "2", "3", "4", "5"}   # every GPU answered, once
    assert PMON_QUERY in poll_script("~/.iadeep")


def test_a_node_without_gpu_processes_is_not_asked_for_pmon(tmp_path):
    sections = _run_gpu_part(tmp_path, "idle", 2)
    assert sections["apps"].strip() == "" and sections["pmon"].strip() == ""
