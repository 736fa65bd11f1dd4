"""Host RAM and CPUs counted as Slurm counts them (scheduler/hostres.py): a node's room is what
the inventory says it has less its active jobs' asks."""
from __future__ import annotations

from iadeep_cli.jobs import Job, JobSpec, JobState
from iadeep_cli.scheduler import hostres
from iadeep_cli.settings import Node


def job(i: int, node: str | None = None, mem: int | None = None, cpus: int | None = None,
        state: JobState = JobState.QUEUED) -> Job:
    return Job(id=i, owner="u", spec=JobSpec(script="/x.sh", host_mem_mib=mem,
                                             cpus_per_task=cpus), state=state,
               submitted_at=0.0, node=node)


NODES = (Node("big", "h", host_mem_mib=1000, cpus=8), Node("small", "h", host_mem_mib=100),
         Node("uncounted", "h"))


def test_a_nodes_room_is_what_it_has_less_its_active_jobs_asks():
    room = hostres.rooms(NODES, [job(1, "big", mem=300, cpus=2, state=JobState.RUNNING),
                                 job(2, "big", state=JobState.RUNNING)])
    assert (room["big"].mem_mib, room["big"].cpus) == (700, 5)   # a job without -c: one CPU
    assert "uncounted" not in room


def test_a_job_is_kept_off_the_nodes_without_room_and_told_why():
    room = hostres.rooms(NODES, [job(1, "big", mem=900, state=JobState.RUNNING)])
    planned, why = hostres.restrict([job(5, mem=200), job(6)], room)
    assert planned[0].spec.exclude == ("big", "small")
    assert planned[1].spec.exclude == ()          # asks for nothing: never held back
    assert why == {5: "waiting for host RAM or CPUs (--mem 200M): big has 100M RAM and 7 CPUs "
                      "left, small has 100M RAM left"}


def test_cpus_asked_beyond_a_nodes_cpus_keep_it_off_that_node():
    planned, why = hostres.restrict([job(7, cpus=16)], hostres.rooms(NODES, []))
    assert planned[0].spec.exclude == ("big",) and "--cpus-per-task 16" in why[7]


def test_the_inventory_gives_a_nodes_host_ram_and_cpus(tmp_path):
    import pytest

    from iadeep_cli.errors import ConfigError
    from iadeep_cli.inventory import parse_inventory

    inv = parse_inventory("nodes:\n  - {name: g1, host: h, host_mem: 512G, cpus: 64}\n"
                          "  - {name: g2, host: h, host_mem: 64000}\n  - {name: g3, host: h}\n",
                          tmp_path / "nodes.yaml")
    assert [(n.host_mem_mib, n.cpus) for n in inv.nodes] == [(512 * 1024, 64), (64000, None),
                                                             (None, None)]
    with pytest.raises(ConfigError, match=r"host_mem: expected a size, e\.g\. 512G"):
        parse_inventory("nodes:\n  - {name: g1, host: h, host_mem: lots}\n",
                        tmp_path / "nodes.yaml")
