"""What a Slurm user's script sees of Slurm inside an iadeep job, end to end on a real sshd
node (the shell backend): the ``SLURM_*`` variables, an ``srun`` that runs its command once in
the job (and refuses more tasks or nodes in one line), ``scontrol requeue $SLURM_JOB_ID``
queueing the job again, and ``--signal=B:SIG`` reaching the batch script alone.

The scripts are written in the forms public ones use: ``srun python ...`` after #SBATCH lines
(cerati/NuGraph scripts/train_batch.sh), ``srun --ntasks 1``/``srun -n1 --gres=...``,
``echo $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID`` (MaherDissem/CI-Failing-Builds-Detection
job_script/job_within.sh), ``trap ... USR1`` with ``scontrol requeue $SLURM_JOBID`` and
``--signal=B:USR1@...`` (public gpt-neox and deblur training scripts).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    cli,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    wait_finished,
    wait_jobs,
)


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    submit = tmp_path / "project"
    submit.mkdir()
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=1, gpus=2, lab="node_grace: 5") as ctl:
        ctl.submit = submit
        yield ctl


def add(lab, name: str, body: str, *args: str) -> int:
    script = lab.submit / name
    script.write_text(body)
    script.chmod(0o755)
    proc = subprocess.run([*IADEEP, "queue", "add", name, *args], cwd=lab.submit,
                          env=env_for(lab.home), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def variables(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


NAMES = ("SLURM_JOB_ID SLURM_JOBID SLURM_JOB_NAME SLURM_SUBMIT_DIR SLURM_CPUS_PER_TASK "
         "SLURM_GPUS SLURM_GPUS_ON_NODE SLURM_JOB_NODELIST SLURM_NODELIST SLURM_NTASKS "
         "SLURM_NNODES SLURM_PROCID SLURM_LOCALID")


def test_a_job_sees_slurms_variables_and_srun_runs_its_command_once(lab):
    out = lab.submit / "env.txt"
    job = add(lab, "train.sh", "#!/bin/bash\n#SBATCH -J train --gres=gpu:2\n"
                               "#SBATCH --cpus-per-task=3 -t 10\n"
                               f"for v in {NAMES}; do eval \"echo $v=\\${{$v-unset}}\"; done"
                               f" > {out}\n"
                               f"srun echo ran-once >> {out}\n"
                               f"srun --ntasks 1 -c 3 echo with-ntasks >> {out}\n"
                               f"srun -n1 --gres=gpu:1 --unbuffered echo short-n1 >> {out}\n"
                               f"srun -N 1 -- sh -c 'echo after-dashes' >> {out}\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "succeeded", jobs[job]
    seen = variables(out)
    node = jobs[job]["node"]
    assert seen == {"SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_JOB_NAME": "train",
                    "SLURM_SUBMIT_DIR": str(lab.submit), "SLURM_CPUS_PER_TASK": "3",
                    "SLURM_GPUS": "2", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_NODELIST": node,
                    "SLURM_NODELIST": node, "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
                    "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    ran = [line for line in out.read_text().splitlines() if "=" not in line]
    assert ran == ["ran-once", "with-ntasks", "short-n1", "after-dashes"]


def test_srun_asking_for_more_tasks_or_nodes_fails_with_one_line(lab):
    out = lab.submit / "refused.txt"
    job = add(lab, "many.sh", "#!/bin/sh\n"
                              f"srun -n 4 echo never 2>> {out} || echo rc=$? >> {out}\n"
                              f"srun --nodes=2 echo never 2>> {out} || echo rc=$? >> {out}\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "succeeded", jobs[job]
    lines = out.read_text().splitlines()
    assert lines[0].startswith("srun: iadeep runs one task on one node: -n 4 needs more")
    assert lines[1] == "rc=1"
    assert lines[2].startswith("srun: iadeep runs one task on one node: --nodes 2 needs more")
    assert "never" not in out.read_text()


def test_an_array_task_sees_its_array_variables_and_its_patterned_output(lab):
    first = add(lab, "array.sh", "#!/bin/sh\n#SBATCH --array=1-5:2\n"
                                 "#SBATCH --output=slurm-%A_%a.out\n"
                                 "echo $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID "
                                 "$SLURM_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN "
                                 "$SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP $SLURM_JOB_ID\n",
                "--chdir", str(lab.submit))
    tasks = sorted(j["id"] for j in jobs_by_id(lab.home).values() if j.get("array_id") == first)
    wait_finished(lab.home, tasks)
    for task, index in zip(tasks, (1, 3, 5)):
        said = (lab.submit / f"slurm-{first}_{index}.out").read_text().split()
        assert said == [str(first), str(index), "3", "1", "5", "2", str(task)]


def test_scontrol_requeue_of_its_own_id_queues_the_job_again(lab):
    mark = lab.submit / "first-attempt-done"
    job = add(lab, "requeue.sh", "#!/bin/bash\n#SBATCH --requeue -t 10\n"
                                 f"if [ ! -e {mark} ]; then touch {mark}\n"
                                 "  scontrol requeue $SLURM_JOBID; sleep 30; echo not-stopped\n"
                                 "fi\necho second attempt\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "succeeded", jobs[job]
    assert jobs[job]["attempts"] == 2
    events = json.loads(cli(lab.home, "queue", "show", str(job), "--json",
                            check=True).stdout)["events"]
    assert any("asked to be requeued (scontrol requeue" in e["reason"] for e in events), events


def test_scontrol_requeue_of_another_job_is_refused_inside_the_job(lab):
    out = lab.submit / "other.txt"
    job = add(lab, "other.sh", f"#!/bin/sh\nscontrol requeue 999999 2> {out}; echo rc=$? >> "
                               f"{out}\nscontrol cancel 3 2>> {out} || true\n")
    wait_finished(lab.home, [job])
    text = out.read_text()
    assert "takes this job's id" in text and "rc=1" in text
    assert "only 'requeue" in text


def test_signal_b_reaches_the_batch_script_and_not_the_programs_it_started(lab):
    out = lab.submit / "signals.txt"
    # -t 1 with the signal 58 s before: it comes about 2 s after the start
    job = add(lab, "batch_signal.sh",
              "#!/bin/bash\n#SBATCH -t 1 --signal=B:USR1@58\n"
              f"sh -c 'trap \"echo child-got-usr1 >> {out}\" USR1; sleep 20 & wait; "
              f"sleep 20 & wait' & child=$!\n"
              f"trap 'echo batch-got-usr1 >> {out}; kill $child; exit 0' USR1\n"
              "while :; do sleep 0.2; done\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "succeeded", jobs[job]
    assert out.read_text().splitlines() == ["batch-got-usr1"]


CGROUP = Path("/sys/fs/cgroup/memory")
needs_memory_cgroup = pytest.mark.skipif(
    not (CGROUP.is_dir() and __import__("os").access(CGROUP, __import__("os").W_OK)),
    reason="this machine's account cannot make cgroup v1 memory cgroups")


@pytest.mark.os_global
@needs_memory_cgroup
def test_a_job_over_its_mem_limit_is_stopped_and_the_reason_says_so(lab):
    job = add(lab, "hog.sh", "#!/bin/sh\n#SBATCH --mem=64M\n"
                             "python3 -c \"x = b'1' * (400 << 20); print(len(x))\"\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "failed", jobs[job]
    assert jobs[job]["reason"].startswith("went over its host memory limit (--mem 64M): the "
                                          "node's memory cgroup stopped it"), jobs[job]


@pytest.mark.os_global
@needs_memory_cgroup
def test_a_job_within_its_mem_limit_runs_and_its_cgroup_is_removed_after(lab):
    out = lab.submit / "cg.txt"
    job = add(lab, "fits.sh", "#!/bin/sh\n#SBATCH --mem=256M\n"
                              f"grep memory /proc/self/cgroup > {out}\n"
                              "python3 -c \"x = b'1' * (20 << 20); print(len(x))\"\n")
    jobs = wait_finished(lab.home, [job])
    assert jobs[job]["state"] == "succeeded", jobs[job]
    group = out.read_text().strip().split(":", 2)[2]
    assert group.startswith(f"/iadeep/job-{job}-")
    assert not (CGROUP / group.lstrip("/")).exists()


@pytest.fixture
def small_node(sshd_cluster, tmp_path):
    """One node with 2 GPUs whose inventory gives it 100M of host RAM and 4 CPUs."""
    submit = tmp_path / "project"
    submit.mkdir()
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=1, gpus=2, lab="node_grace: 5",
                      edit_nodes=lambda text: text.replace(
                          "    workdir:", "    host_mem: 100M\n    cpus: 4\n    workdir:")) as ctl:
        ctl.submit = submit
        yield ctl


def test_host_ram_is_counted_a_job_waits_for_it_and_starts_once_it_is_free(small_node):
    lab = small_node
    gate = lab.submit / "gate"
    first = add(lab, "first.sh", f"#!/bin/sh\n#SBATCH --mem=60M\nwhile [ ! -e {gate} ]; do "
                                 "sleep 0.2; done\n")
    wait_jobs(lab.home, lambda js: js[first]["state"] == "running")
    second = add(lab, "second.sh", "#!/bin/sh\n#SBATCH --mem=60M -c 2\necho ran\n")
    jobs = wait_jobs(lab.home, lambda js: js[second]["reason"].startswith("waiting for host RAM"))
    assert jobs[second]["state"] == "queued", jobs[second]
    assert jobs[second]["reason"].startswith("waiting for host RAM or CPUs (--mem 60M "
                                             "--cpus-per-task 2): node"), jobs[second]
    assert "has 40M RAM and 3 CPUs left" in jobs[second]["reason"]
    gate.touch()
    jobs = wait_finished(lab.home, [first, second])
    assert jobs[second]["state"] == "succeeded", jobs[second]
