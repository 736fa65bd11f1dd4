"""The Slurm backend's pure parts: the inventory's ``slurm:`` section and Slurm's GRES strings
(the backend against a real Slurm: tests/integration/test_slurm_backend.py)."""
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import parse_inventory
from iadeep_cli.nodes.slurm.commands import ENDED, _exit_code, gpu_types, tag


def test_slurm_section_is_read_with_defaults():
    inv = parse_inventory("nodes: []\nslurm:\n  partition: gpu\n  shards_per_gpu: 8\n",
                          Path("nodes.yaml"))
    assert inv.slurm is not None
    assert (inv.slurm.partition, inv.slurm.shards_per_gpu, inv.slurm.gpu_type_prefix,
            inv.slurm.gpu_memory_gib) == ("gpu", 8, "g", 80.0)


@pytest.mark.parametrize("body, says", [
    ("slurm:\n  shards_per_gpu: 4\n", "partition is missing"),
    ("slurm:\n  partition: gpu\n  shards_per_gpu: 0\n", "slurm.shards_per_gpu: expected"),
    ("slurm:\n  partition: gpu\n  conf: etc/slurm.conf\n", "absolute path to slurm.conf"),
    ("slurm:\n  partition: gpu\n  gpu_type_prefix: '0g'\n", "starting with a letter"),
    ("slurm:\n  partition: gpu\n  gpus: 2\n", "unknown key 'gpus'"),
])
def test_bad_slurm_section_is_one_line_naming_the_field(body, says):
    with pytest.raises(ConfigError) as err:
        parse_inventory("nodes: []\n" + body, Path("nodes.yaml"))
    assert says in err.value.message and "\n" not in err.value.message


def test_gres_types_give_the_gpus_iadeep_may_pin():
    got = gpu_types("gpu:g0:1,gpu:g1:1(S:0),shard:g0:4,shard:g1:4,gpu:a100:1,gpu:2,license:x:1",
                    "g")
    assert got == {"gpu": {0: 1, 1: 1}, "shard": {0: 4, 1: 4}}


def test_exit_code_only_when_the_script_ended_by_itself():
    assert _exit_code({"job_state": "COMPLETED", "exit_code": 0}) == 0
    assert _exit_code({"job_state": "FAILED", "exit_code": 3 << 8}) == 3   # a wait status
    assert _exit_code({"job_state": "FAILED", "exit_code": 9}) == 137      # killed by KILL
    assert _exit_code({"job_state": "FAILED", "exit_code": {"return_code": 3}}) == 3
    assert _exit_code({"job_state": "CANCELLED", "exit_code": 0}) is None
    assert {"COMPLETED", "CANCELLED", "TIMEOUT"} <= ENDED


def test_each_attempt_has_its_own_name():
    assert tag("abcdef0123456789", 7, 1) == "iadeep-abcdef012345-7-1" != tag("abcdef0123456789",
                                                                              7, 2)


def test_example_inventory_documents_every_slurm_field():
    """nodes.yaml.example shows the slurm: section commented out (most labs have none); as
    written there, uncommented, it is valid and names every field the parser knows."""
    import re

    from iadeep_cli import inventory

    text = (Path(__file__).resolve().parents[2] / "nodes.yaml.example").read_text()
    block = "\n".join(re.sub(r"^# ", "", line) for line in text.splitlines()
                      if re.match(r"^# (slurm:|  \w+:)", line))
    inv = parse_inventory(block, Path("nodes.yaml.example"))
    assert inv.slurm is not None and inv.slurm.partition == "gpu"
    shown = {m.group(1) for m in re.finditer(r"^  (\w+):", block, re.M)}
    assert shown == set(inventory._SLURM_FIELDS)


def test_telemetry_over_ssh_keeps_what_slurm_holds():
    """A Slurm node's GPUs from nvidia-smi (memory, utilisation, processes), with iadeep's
    Slurm jobs kept as its jobs and a foreign Slurm job's reservation counted as used even
    while its processes use less; an SSH answer without GPU data changes nothing."""
    from iadeep_cli.nodes.slurm import with_telemetry
    from iadeep_cli.snapshot import GpuProcess, GpuSample, NodeSnapshot

    total = 80 * 1024.0
    slurm_snap = NodeSnapshot("n1", 1.0, gpus=(
        GpuSample(0, "s0", "slurm gres g0", total, 0.0, total,
                  processes=(GpuProcess(11, None, "slurm job 11", job_id=5),)),
        GpuSample(1, "s1", "slurm gres g1", total, total / 2, total / 2,
                  processes=(GpuProcess(12, total / 2, "slurm job 12 (bob)"),))))
    h200 = 143771.0
    ssh_snap = NodeSnapshot("n1", 1.0, gpus=(
        GpuSample(0, "GPU-0", "NVIDIA H200", h200, 30000.0, h200 - 30000.0, 97.0,
                  processes=(GpuProcess(4242, 29000.0, "python"),)),
        GpuSample(1, "GPU-1", "NVIDIA H200", h200, 1000.0, h200 - 1000.0, 3.0)))
    g0, g1 = with_telemetry(slurm_snap, ssh_snap).gpus
    assert (g0.name, g0.memory_total_mib, g0.memory_used_mib, g0.utilization_gpu) == (
        "NVIDIA H200", h200, 30000.0, 97.0)
    assert [p.pid for p in g0.foreign_processes] == [4242]
    assert [p.job_id for p in g0.processes if not p.foreign] == [5]
    # Slurm reserved half of GPU 1 for bob's job: half of the real GPU is used, whatever
    # nvidia-smi shows yet, and that job is foreign load of that size
    assert g1.memory_used_mib == h200 / 2 and g1.memory_free_mib == h200 / 2
    assert [(p.pid, p.used_memory_mib) for p in g1.foreign_processes] == [(12, h200 / 2)]
    failed = NodeSnapshot("n1", 1.0, gpus=(), error=None)
    assert with_telemetry(slurm_snap, failed) == slurm_snap
    assert with_telemetry(slurm_snap, None) == slurm_snap
    down = NodeSnapshot("n1", 1.0, error="connection refused")
    assert with_telemetry(slurm_snap, down) == slurm_snap
