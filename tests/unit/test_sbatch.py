"""``#SBATCH`` lines read as sbatch reads them (iadeep_cli/cli/sbatch.py): getopt_long's forms
(sbatch(1); the abbreviation ``--out=`` is anttitapsa/TCR_transformer code/run_train.sh's, two
options on a line avehtari/loocv_uncertainty simulated/run_out.sh's), what each option means,
and every problem at once with its file and line."""
from __future__ import annotations

import datetime

import pytest

from iadeep_cli.cli import sbatch
from iadeep_cli.errors import InputError


def read(*lines: str) -> sbatch.Reading:
    return sbatch.read_script("job.sh", "#!/bin/bash\n" + "".join(f"{x}\n" for x in lines))


@pytest.mark.parametrize("line, key, value", [
    ("#SBATCH --time=1:00:00", "time", "1:00:00"), ("#SBATCH --time 1:00:00", "time", "1:00:00"),
    ("#SBATCH -t 90", "time", "90"), ("#SBATCH -t90", "time", "90"),
    ("#SBATCH --job=x", "name", "x"),
    ("#SBATCH --out=o.txt", "output", "o.txt"), ("#SBATCH -oo.txt", "output", "o.txt"),
    ("#SBATCH -J name", "name", "name"), ("#SBATCH --job-name 'a b'", "name", "a b"),
    ("#SBATCH -a 1-3%2", "array", "1-3%2"), ("#SBATCH --arr=0-4", "array", "0-4"),
    ("#SBATCH -e e.%j", "error", "e.%j"), ("#SBATCH -D /scratch/run", "workdir", "/scratch/run"),
    ("#SBATCH -w n[01-03,7]", "nodelist", "n01,n02,n03,n7"),
    ("#SBATCH -x gpu5", "exclude", "gpu5"), ("#SBATCH -C a100&nvlink", "constraint",
                                             "a100&nvlink"),
    ("#SBATCH --exclusive", "exclusive", True), ("#SBATCH --requeue", "requeue", True),
    ("#SBATCH --no-requeue", "requeue", False), ("#SBATCH --signal=SIGINT@60", "signal",
                                                "INT@60"),
    ("#SBATCH --signal=B:USR1", "signal", "B:USR1@60"),
    ("#SBATCH --mail-type=BEGIN,END", "notify", "all"), ("#SBATCH --mail-type=FAIL", "notify",
                                                        "fail"),
    ("#SBATCH --export=NONE", "export", "NONE"), ("#SBATCH --export=PATH,HOME", "export",
                                                  "PATH,HOME"),
    ("#SBATCH -c 8", "cpus_per_task", 8), ("#SBATCH -d afterok:5:6", "after", "5,6"),
    ("#SBATCH --dependency=afternotok:7", "after_fail", "7"),
    ("#SBATCH --gres=gpu:3", "gpus", 3), ("#SBATCH --gres=gpu:tesla:2,tmpdisk:10", "gpus", 2),
    ("#SBATCH --gres=gpu", "gpus", 1), ("#SBATCH -G a100:2", "gpus", 2),
    ("#SBATCH --gpus-per-n=4", "gpus", 4),
])
def test_each_form_sbatch_takes_means_what_it_means_to_sbatch(line, key, value):
    reading = read(line)
    assert reading.problems == []
    assert reading.values[key] == value


def test_several_short_options_in_one_word_and_on_one_line():
    reading = read("#SBATCH -N1 -n 1 -c2 -t 10 -J x")
    assert reading.problems == []
    assert (reading.values["time"], reading.values["name"], reading.values["cpus_per_task"]) \
        == ("10", "x", 2)
    assert {"-N 1", "-n 1"} <= set(reading.notes)


def test_reading_stops_at_the_first_command_and_skips_commented_directives():
    reading = read("##SBATCH -t 5", "# SBATCH -t 6", "#SBATCH -J a", "", "#SBATCH -a 1-2",
                   "echo hi", "#SBATCH -t 7")
    assert reading.values == {"name": "a", "array": "1-2"}


def test_a_later_line_wins_as_in_sbatch_and_mail_types_add_up():
    reading = read("#SBATCH -t 5", "#SBATCH --time=6", "#SBATCH --mail-type=END",
                   "#SBATCH --mail-type=FAIL")
    assert (reading.values["time"], reading.values["notify"]) == ("6", "end")


@pytest.mark.parametrize("line, said", [
    ("#SBATCH -N 2", "job.sh:2: -N 2 asks for nodes iadeep cannot give"),
    ("#SBATCH --nodes=3-4", "--nodes 3-4 asks for nodes"),
    ("#SBATCH --ntasks=4", "job.sh:2: --ntasks 4 asks for tasks"),
    ("#SBATCH --ntasks-per-node=8", "--ntasks-per-node 8 asks for tasks"),
    ("#SBATCH --mem-per=1", "job.sh:2: --mem-per is ambiguous (--mem-per-cpu, --mem-per-gpu)"),
    ("#SBATCH --nope", "sbatch has no option --nope"), ("#SBATCH -y", "sbatch has no option -y"),
    ("#SBATCH -d after:12", "iadeep has afterok, afterany, afternotok and singleton only"),
    ("#SBATCH -d afterok:1?afterok:2", "iadeep has no '?'"),
    ("#SBATCH -t soon", "-t 'soon' is not a time limit"),
    ("#SBATCH --ti=5", "--ti is ambiguous (--time, --time-min)"),
    ("#SBATCH --signal=KILL@5", "is not [B:]SIGNAL"),
    ("#SBATCH --export-file=f", "iadeep has no --export-file"),
    ("#SBATCH --wrap='ls'", "on the command line only"), ("#SBATCH -t", "-t needs a value"),
    ("#SBATCH --hold=yes", "--hold takes no value"), ("#SBATCH train.py", "is not an option"),
    ("#SBATCH --gres=gpu:99", "asks for 99 GPUs"), ("#SBATCH --array=5-1", "ascending"),
    ("#SBATCH --mail-type=SOMETIMES", "is not a mail type"),
    ("#SBATCH --job-name 'open", "No closing quotation"),
])
def test_what_iadeep_cannot_give_is_refused_naming_the_line(line, said):
    problems = read(line).problems
    assert len(problems) == 1 and said in problems[0], problems


def test_gpu_counts_that_disagree_are_one_problem_naming_both_lines():
    problems = read("#SBATCH --gres=gpu:2", "#SBATCH --gpus-per-node=4").problems
    assert problems == ["the GPU counts disagree: 2 at job.sh:2 (--gres); 4 at job.sh:3 "
                        "(--gpus-per-node) (one node: give one count)"]


def test_one_task_per_gpu_with_several_gpus_is_several_tasks():
    assert "one task per GPU with 4 GPUs is 4 tasks" in read(
        "#SBATCH --gpus=4 --ntasks-per-gpu=1").problems[0]
    assert read("#SBATCH --gpus=1 --ntasks-per-gpu=1").problems == []


def test_export_names_with_values_go_to_env():
    reading = read("#SBATCH --export=ALL,LR=0.1")
    assert (reading.values["export"], reading.values["env"]) == ("ALL", ["LR=0.1"])
    only = read("#SBATCH --export=LR=0.1")
    assert (only.values["export"], only.values["env"]) == ("NONE", ["LR=0.1"])


def test_hold_and_singleton_are_kept_apart_from_the_options():
    reading = read("#SBATCH -H --dependency=singleton")
    assert reading.hold and reading.singleton and "hold" not in reading.values


def test_hostlists_expand_with_their_zero_padding():
    assert sbatch.expand_hostlist("gpu[008-010],cpu1", "-w") == ["gpu008", "gpu009", "gpu010",
                                                                "cpu1"]
    with pytest.raises(InputError, match="not a host list"):
        sbatch.expand_hostlist("n[a-b]", "-w")


NOW = datetime.datetime(2026, 12, 3, 14, 0, 0).timestamp()


@pytest.mark.parametrize("text, expected", [
    ("now", NOW), ("now+60", NOW + 60), ("now+1hour", NOW + 3600), ("now+2hours", NOW + 7200),
    ("now+3days", NOW + 3 * 86400), ("now+10minutes", NOW + 600),
    ("16:00", datetime.datetime(2026, 12, 3, 16, 0).timestamp()),
    ("10:30", datetime.datetime(2026, 12, 4, 10, 30).timestamp()),
    ("teatime", datetime.datetime(2026, 12, 3, 16, 0).timestamp()),
    ("midnight", datetime.datetime(2026, 12, 4, 0, 0).timestamp()),
    ("tomorrow", datetime.datetime(2026, 12, 4, 0, 0).timestamp()),
    ("2026-12-24T09:00", datetime.datetime(2026, 12, 24, 9, 0).timestamp()),
    ("2027-01-02", datetime.datetime(2027, 1, 2).timestamp()),
    ("12/25", datetime.datetime(2026, 12, 25).timestamp()),
])
def test_begin_times_as_sbatch_writes_them(text, expected):
    assert sbatch.parse_begin(text, NOW) == expected


def test_a_begin_time_that_is_none_is_refused():
    with pytest.raises(InputError, match="is not a time sbatch takes"):
        sbatch.parse_begin("whenever", NOW)
