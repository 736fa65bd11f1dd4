"""Slurm users' batch scripts submitted unchanged (issue 43): the corpus in
tests/fixtures/sbatch, written for these tests in the forms public GPU batch scripts use, each
`iadeep queue add`-ed as it is to a real controller (whose one node never answers, so each job
stays as it was queued) and read back with `queue show --json`.

Where the forms come from (public scripts found with the search tool; the scripts here are
our own, written in those forms):
- ``-t 1440``, ``--gres=gpu:v100:1``, ``-A``/``-q``/``-p``, ``--signal=SIGUSR1@90``, ``srun
  python``: cerati/NuGraph scripts/train_batch.sh.
- ``-L SCRATCH``, ``-q preempt``, ``--gpus-per-node=4``, ``-o %j.out``/``-e %j.err``,
  ``--signal=USR1@60``, ``--requeue``, ``--open-mode=append``, ``# comment`` after a value:
  gigantocypris/CT_NVAE experimental/signal_interrupt.sh.
- ``--out=`` (an abbreviation of --output), ``--time=5-00:00:00``, ``--gres=gpu:a100:4``,
  ``--mail-type`` on two lines: anttitapsa/TCR_transformer code/run_train.sh.
- ``--time=48:0:00``, ``--mem=8000M``, ``--array=0-14``, ``slurm-%A_%a.out``:
  MaherDissem/CI-Failing-Builds-Detection job_script/job_within.sh.
- two options on one line (``--time=0-03:00:00 --mem-per-cpu=5000``), ``-o log/out_%a.txt``:
  avehtari/loocv_uncertainty simulated/run_out.sh.
- ``--signal=B:USR1@60 #comment``, ``--array=0-0%1``, ``--comment="<...>"``, ``##SBATCH``
  commented out, ``#! /bin/bash``: a public sbatch_train.sh (ECCV training script).
- ``-p -A -N 1 -n 1 -c 1 -t 1:00:00 -J``, a blank line between directives, ``%A.e``/``%A.o``:
  public slurm_array scripts; ``--output=~/...`` with ``%x_%j``: a public tcsh array test;
  ``--gpus-per-node=4 --qos=gpu4-8h --signal=B:USR1@120`` with a trap: a public deblur
  training script; ``scontrol requeue $SLURM_JOBID`` in a USR1 trap: a public gpt-neox script.
- sbatch(1) for the rest: -G, --gpus=type:N, --gpus-per-task, the time forms (M, M:S, H:M:S,
  D-H, D-H:M, D-H:M:S, UNLIMITED), -H, --begin=now+1hour, --export=ALL,NAME=VALUE,
  --nodes=MIN-MAX, --ntasks-per-gpu, -a with %N, zero-padded %3a/%4j, %N.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers.controllers import IADEEP, cli, controller_on, env_for

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "sbatch"
H = 3600


@pytest.fixture(scope="module")
def queued(tmp_path_factory):
    """A controller whose two nodes never answer: what it accepts stays queued. Its
    notifications go to a webhook (never reached: they are only asked for here); a job without
    --time gets the lab's default of a day, as a Slurm partition's DefaultTime."""
    ctl = controller_on(tmp_path_factory.mktemp("slurm"),
                        "[{name: gone, host: 127.0.0.1, port: 9}, "
                        "{name: gone2, host: 127.0.0.1, port: 9}]",
                        lab="default_time_limit: 1d\nnotify:\n  webhook: http://127.0.0.1:9/hook")
    yield ctl
    ctl.stop()


def submit(ctl, script: Path, *args: str, cwd: Path | None = None,
           **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*IADEEP, "queue", "add", str(script), *args], cwd=cwd or script.parent,
                          env=env_for(ctl.home, **env), capture_output=True, text=True,
                          timeout=120)


def shown(ctl, job_id: str) -> dict:
    return json.loads(cli(ctl.home, "queue", "show", job_id, "--json", check=True).stdout)


def script_copy(tmp_path: Path, name: str) -> Path:
    """The corpus script copied, unchanged, into a submission directory of its own."""
    where = tmp_path / "submit"
    where.mkdir(exist_ok=True)
    path = where / name
    shutil.copy2(CORPUS / name, path)
    return path


# What each script asks for, as Slurm reads it: GPUs, time limit (seconds), array, output and
# error names (patterns kept as written; filled in on the node), signal, notifications, and
# any other field it sets.
EXPECTED: dict[str, dict] = {
    "01_gres_type_signal.sh": {"gpus": 1, "time_limit_s": 24 * H, "signal": "USR1@90",
                                   "name": "track_train", "notify": "none"},
    "02_preempt_requeue.sh": {"gpus": 4, "time_limit_s": 10 * H, "output": "%j.out",
                              "error": "%j.err", "signal": "USR1@60", "name": "sig_interrupt"},
    "03_abbreviated_output.sh": {"gpus": 4, "time_limit_s": 5 * 24 * H, "output": "logs/train.out",
                                     "error": "logs/train.error", "notify": "all"},
    "04_array_A_a.sh": {"gpus": 1, "time_limit_s": 48 * H, "array": "0-14",
                            "output": "./slurm_output/slurm-%A_%a.out", "tasks": 15},
    "05_array_throttle_batch_signal.sh": {
        "gpus": 8, "array": "0-3%1", "output": "/tmp/jobs_output/slurm-%A_%a.out",
        "error": "/tmp/jobs_output/slurm-%A_%a.err", "signal": "B:USR1@60", "time_limit_s": 24 * H,
        "tasks": 4},
    "06_two_options_a_line.sh": {"gpus": 1, "time_limit_s": 3 * H, "array": "0-71",
                                     "output": "log/out_%a.txt", "tasks": 72},
    "07_short_name_nodes.sh": {"name": "array", "array": "1-31", "tasks": 31,
                                   "output": "../logs/slurm-%j-%A-%a.out",
                                   "error": "../logs/slurm-%j-%A-%a.err"},
    "08_name_and_id.sh": {"name": "sweep", "array": "1-31:2", "tasks": 16, "gpus": 1,
                              "output": "logs/slurm-%x.%j.out", "error": "logs/slurm-%x.%j.err"},
    "09_mail_all_account.sh": {"name": "array", "time_limit_s": 20 * H, "notify": "all",
                                   "array": "1-10", "tasks": 10, "output": "logs/array_%A_%a.out"},
    "10_short_options_blank_line.sh": {"name": "slurm_array", "time_limit_s": H, "notify": "all",
                                           "array": "1-3", "tasks": 3,
                                           "error": "./logs/slurm_array/slurm_array.%A.e",
                                           "output": "./logs/slurm_array/slurm_array.%A.o"},
    "11_mail_end_large_array.sh": {"notify": "end", "array": "0-399", "tasks": 400,
                                       "output": "/tmp/log/%j.out", "error": "/tmp/log/%j.err"},
    "12_tilde_output.sh": {"name": "test_log", "output": "~/kinetics/logs/%x_%j.out",
                               "array": "1-1", "tasks": 1},
    "13_gpus_per_node_qos.sh": {"gpus": 4, "signal": "B:USR1@120", "name": "train_deblur",
                                    "output": "output/slurm-%j.out", "error": "error/slurm-%j.err"},
    "14_gpus_typed_minutes.sh": {"gpus": 2, "time_limit_s": 90 * 60, "name": "lr-sweep"},
    "15_G_short_min_sec.sh": {"gpus": 2, "time_limit_s": 30 * 60, "output": "run-%4j.log"},
    "16_days_hours_per_task.sh": {"gpus": 1, "time_limit_s": 2 * 24 * H + 12 * H,
                                      "output": "slurm-%N-%j.out"},
    "17_days_hours_minutes_signal_default.sh": {"gpus": 2, "time_limit_s": 36 * H + 30 * 60,
                                                    "signal": "USR2@60", "name": "spaced name"},
    "18_unit_time_and_no_requeue.sh": {"gpus": 1, "time_limit_s": 45 * 60, "notify": "none"},
    "19_hold_begin.sh": {"gpus": 1, "time_limit_s": 600, "state": "held"},
    "20_export_values.sh": {"gpus": 1, "time_limit_s": 300, "env": {"LR": "0.1", "EPOCHS": "3"}},
    "21_exclusive_unlimited.sh": {"gpus": 1, "exclusive": True, "notify": "end",
                                      "time_limit_s": 24 * H},
    "22_nodes_range_tasks_per_gpu.sh": {"gpus": 1, "time_limit_s": 2 * H, "array": "0-9%2",
                                            "tasks": 10, "output": "%x-%A-%3a.out"},
}


def test_the_corpus_has_at_least_twenty_scripts_each_with_its_expectations():
    names = sorted(p.name for p in CORPUS.glob("*.sh"))
    assert len(names) >= 20
    assert sorted(EXPECTED) == names


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_slurm_batch_script_submitted_unchanged_gets_what_it_asks_for(queued, tmp_path,
                                                                        name):
    path = script_copy(tmp_path, name)
    proc = submit(queued, path)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.strip()
    job = shown(queued, first)
    want = dict(EXPECTED[name])
    tasks = want.pop("tasks", None)
    for key, value in want.items():
        assert job.get(key) == value, (key, job.get(key), value, proc.stderr)
    if "signal" not in want:
        assert job.get("signal") is None
    if tasks is not None:
        listed = json.loads(cli(queued.home, "queue", "list", "--all", "--json",
                                check=True).stdout)
        assert len([j for j in listed if j.get("array_id") == int(first)]) == tasks


def test_notes_name_each_option_that_does_nothing_on_one_node_once(queued, tmp_path):
    proc = submit(queued, script_copy(tmp_path, "01_gres_type_signal.sh"))
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, proc.stderr
    for option in ("--partition (", "--account (", "--qos (", "--cpus-per-task (",
                   "GPU type ('v100'"):
        assert notes[0].count(option) == 1, notes[0]


def test_mail_type_where_the_lab_sends_no_messages_is_noted_not_refused(tmp_path):
    ctl = controller_on(tmp_path / "quiet", "[]")
    try:
        proc = submit(ctl, script_copy(tmp_path, "09_mail_all_account.sh"))
        assert proc.returncode == 0, proc.stderr
        assert "--mail-type left out: --notify all: no notification channel" in proc.stderr
        assert shown(ctl, proc.stdout.strip())["notify"] == "none"
    finally:
        ctl.stop()


def test_a_held_script_waits_until_its_begin_time(queued, tmp_path):
    job = shown(queued, submit(queued, script_copy(tmp_path, "19_hold_begin.sh")).stdout.strip())
    assert job["state"] == "held"
    # --begin=now+1hour, read when it was submitted
    released = cli(queued.home, "queue", "release", str(job["id"]), check=True)
    assert "queued" in released.stdout


def _script(tmp_path: Path, body: str, name: str = "job.sh") -> Path:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(0o755)
    return path


def test_every_problem_of_a_script_is_reported_at_once_naming_file_and_line(queued, tmp_path):
    path = _script(tmp_path, "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:2\n"
                             "#SBATCH --ntasks 4 --time=forever\n#SBATCH --frobnicate=1\n"
                             "#SBATCH -d after:12\npython x.py\n")
    proc = submit(queued, path)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: 5 problems in"), proc.stderr
    for said in (f"{path}:2: -N 2 asks for nodes", f"{path}:4: --ntasks 4 asks for tasks",
                 f"{path}:4: --time 'forever' is not a time limit",
                 f"{path}:5: sbatch has no option --frobnicate",
                 f"{path}:6: -d 'after:12': iadeep has afterok"):
        assert said in lines[0], lines[0]


def test_the_command_line_wins_over_sbatch_lines_as_sbatch_does(queued, tmp_path):
    path = script_copy(tmp_path, "14_gpus_typed_minutes.sh")
    job = shown(queued, submit(queued, path, "--gres", "gpu:3", "-t", "2:00:00",
                               "-J", "cli").stdout.strip())
    assert (job["gpus"], job["time_limit_s"], job["name"]) == (3, 7200, "cli")


def test_iadeep_lines_win_over_sbatch_lines_in_the_same_script(queued, tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n#SBATCH --gres=gpu:2 -t 10\n#IADEEP --gpus 1\n")
    job = shown(queued, submit(queued, path).stdout.strip())
    assert (job["gpus"], job["time_limit_s"]) == (1, 600)


def test_a_lab_that_chose_warn_keeps_sbatch_lines_unread_with_the_warning(queued, tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n#SBATCH --gres=gpu:2\n#SBATCH -t 5\n")
    proc = submit(queued, path, IADEEP_SBATCH="warn")
    assert proc.returncode == 0, proc.stderr
    assert "has #SBATCH lines, which iadeep does not read" in proc.stderr
    job = shown(queued, proc.stdout.strip())
    assert (job["gpus"], job["time_limit_s"]) == (1, 86400)   # the lab's default


def test_dependencies_as_sbatch_writes_them(queued, tmp_path):
    first = submit(queued, _script(tmp_path, "#!/bin/sh\n", "a.sh")).stdout.strip()
    second = submit(queued, _script(tmp_path, "#!/bin/sh\n", "b.sh")).stdout.strip()
    path = _script(tmp_path, f"#!/bin/sh\n#SBATCH --dependency=afterok:{first}:{second}\n"
                             f"#SBATCH -d afterany:{first},afternotok:{second}\n", "c.sh")
    job = shown(queued, submit(queued, path).stdout.strip())
    assert job["after"] == [int(first), int(second)]
    assert (job["after_any"], job["after_fail"]) == ([int(first)], [int(second)])


def test_singleton_waits_for_the_users_unfinished_job_of_the_same_name(queued, tmp_path):
    body = "#!/bin/sh\n#SBATCH -J only-one\n#SBATCH --dependency=singleton\n"
    first = submit(queued, _script(tmp_path, body, "s1.sh")).stdout.strip()
    second = shown(queued, submit(queued, _script(tmp_path, body, "s2.sh")).stdout.strip())
    assert int(first) in second["after_any"]


# ------------------------------------------------------------------------------------------
# No sbatch option accepted with another meaning, on the command line either: one test per
# option whose iadeep spelling differed, and per option of the table.

def test_dash_p_is_the_partition_and_a_number_there_is_the_old_priority_with_a_warning(
        queued, tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n")
    proc = submit(queued, path, "-p", "gpu")
    assert proc.returncode == 0 and "--partition" in proc.stderr, proc.stderr
    assert shown(queued, proc.stdout.strip())["priority"] == 0
    old = submit(queued, path, "-p", "5")
    assert "warning: -p 5 is read as --priority 5 in this release only" in old.stderr
    assert shown(queued, old.stdout.strip())["priority"] == 5


def test_dash_w_is_the_nodelist_never_a_workload(queued, tmp_path):
    proc = submit(queued, _script(tmp_path, "#!/bin/sh\n"), "-w", "ttnusa1")
    assert proc.returncode == 1
    assert "--nodelist: no node named ttnusa1" in proc.stderr
    job = shown(queued, submit(queued, _script(tmp_path, "#!/bin/sh\n"), "-w",
                               "gone").stdout.strip())
    # the node list, never the workload (that is its program's label, `name@user:digest`)
    assert job["nodelist"] == ["gone"] and job["workload"].startswith("job.sh@")


def test_dash_e_is_the_error_file_and_name_value_is_the_old_env_with_a_warning(queued,
                                                                               tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n")
    job = shown(queued, submit(queued, path, "-e", "%j.err").stdout.strip())
    assert (job["error"], job["env"]) == ("%j.err", {})
    old = submit(queued, path, "-e", "LR=3")
    assert "warning: -e LR=3 is read as --env LR=3" in old.stderr
    assert shown(queued, old.stdout.strip())["env"] == {"LR": "3"}


def test_dash_n_is_the_task_count_and_a_word_there_is_the_old_name_with_a_warning(queued,
                                                                                  tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n")
    assert submit(queued, path, "-n", "1").returncode == 0
    refused = submit(queued, path, "-n", "4")
    assert refused.returncode == 1 and "--ntasks 4 asks for tasks" in refused.stderr
    old = submit(queued, path, "-n", "resnet")
    assert "warning: -n resnet is read as --name resnet" in old.stderr
    assert shown(queued, old.stdout.strip())["name"] == "resnet"


@pytest.mark.parametrize("value, gpu_mem, warned", [
    ("12", 12.0, True), ("16G", None, False), ("8000M", None, False), ("16384", None, False)])
def test_mem_with_a_unit_is_host_ram_and_a_bare_gib_the_old_gpu_memory(queued, tmp_path,
                                                                       value, gpu_mem, warned):
    proc = submit(queued, _script(tmp_path, "#!/bin/sh\n"), "--mem", value)
    assert proc.returncode == 0, proc.stderr
    assert ("--gpu-mem" in proc.stderr) == warned, proc.stderr
    assert shown(queued, proc.stdout.strip())["mem_gib"] == gpu_mem


def test_gpu_mem_is_gpu_memory(queued, tmp_path):
    proc = submit(queued, _script(tmp_path, "#!/bin/sh\n"), "--gpu-mem", "20")
    assert shown(queued, proc.stdout.strip())["mem_gib"] == 20.0


@pytest.mark.parametrize("args, field, value", [
    (["-J", "x"], "name", "x"), (["-t", "1-0"], "time_limit_s", 86400),
    (["-o", "o-%j"], "output", "o-%j"), (["-a", "0-3"], "array", "0-3"),
    (["-G", "2"], "gpus", 2), (["--gres=gpu:a100:2"], "gpus", 2),
    (["--gpus-per-node", "3"], "gpus", 3), (["--gpus-per-task", "2"], "gpus", 2),
    (["-D", "/tmp"], "workdir", "/tmp"), (["-x", "gone2"], "exclude", ["gone2"]),
    (["--mail-type", "FAIL"], "notify", "fail"), (["--requeue"], "requeue", True),
    (["-H"], "state", "held"), (["-N", "1"], "gpus", 1), (["-A", "acct"], "gpus", 1),
    (["-q", "normal"], "gpus", 1), (["-c", "4"], "gpus", 1), (["--mem-per-cpu", "4G"], "gpus", 1),
    (["--signal", "B:USR1@30"], "signal", "B:USR1@30"), ([], "time_limit_s", 86400),
])
def test_each_sbatch_option_on_the_command_line_keeps_sbatchs_meaning(queued, tmp_path, args,
                                                                       field, value):
    proc = submit(queued, _script(tmp_path, "#!/bin/sh\n"), *args)
    assert proc.returncode == 0, proc.stderr
    job = shown(queued, proc.stdout.strip())
    assert job.get(field) == value, (field, job.get(field))


def test_begin_on_the_command_line_keeps_a_job_waiting_saying_until_when(queued, tmp_path):
    proc = submit(queued, _script(tmp_path, "#!/bin/sh\n"), "--begin", "now+2hours")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        why = cli(queued.home, "queue", "why", job_id, check=True).stdout
        if "(--begin)" in why:
            break
        time.sleep(0.5)
    assert "waiting until" in why and "(--begin)" in why, why


def test_queue_show_says_when_a_job_begins_and_its_host_memory(queued, tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n#SBATCH --begin=2031-01-02T03:04:05 --mem=8G\n")
    shown_text = cli(queued.home, "queue", "show", submit(queued, path).stdout.strip(),
                     check=True).stdout
    assert "begin_at: 2031-01-02 03:04:05" in shown_text
    assert "host_mem_mib: 8192M" in shown_text


def test_a_deprecated_short_option_on_the_command_line_wins_over_the_scripts_line(queued,
                                                                                   tmp_path):
    path = _script(tmp_path, "#!/bin/sh\n#SBATCH -J from-script\n")
    job = shown(queued, submit(queued, path, "-n", "from-cli").stdout.strip())
    assert job["name"] == "from-cli"
