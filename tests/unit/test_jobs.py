"""Job options as a user writes them: ``--time`` in Slurm's formats, checked and printed back."""
from __future__ import annotations

import pytest

from iadeep_cli import jobopts as O, jobs as J
from iadeep_cli.errors import InputError
from iadeep_cli.jobs import JobSpec, parse_signal, parse_time_limit, validate_spec
from iadeep_cli.text import hms


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("0:30", 30), ("90:30", 5430), ("2:00:00", 7200), ("1:02:03", 3723),
    ("3-0", 3 * 86400), ("1-12", 86400 + 12 * 3600), ("1-12:30", 86400 + 12 * 3600 + 1800),
    ("1-0:0:5", 86405), (" 45 ", 2700),
])
def test_time_limits_in_sbatch_formats(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "1x", "-5", "1:2:3:4", "1-", "2.5", "1-2-3", "h"])
def test_a_time_limit_that_is_not_one_names_the_formats(text):
    with pytest.raises(InputError) as err:
        parse_time_limit(text)
    assert "is not a time limit" in err.value.message and "2:00:00" in err.value.hint


@pytest.mark.parametrize("text, seconds", [
    ("8d", 8 * 86400), ("12h", 43200), ("30m", 1800), ("90s", 90), ("1d12h", 129600),
    ("2w", 14 * 86400), ("1.5h", 5400), ("8D", 8 * 86400),
])
def test_one_duration_format_for_time_since_and_nodes_yaml(text, seconds):
    """What nodes.yaml takes (7d), --time takes too, and report's --since goes back as far."""
    from pathlib import Path

    from iadeep_cli.cli.report import parse_time
    from iadeep_cli.inventory import parse_inventory

    assert parse_time_limit(text) == seconds
    lab = parse_inventory(f"lab:\n  max_time_limit: {text}\n", Path("nodes.yaml"))
    assert lab.max_time_limit_s == seconds
    assert parse_time(text, "--since", 1e9) == 1e9 - seconds
    for sbatch, s in (("2:00:00", 7200), ("3-0", 3 * 86400), ("1-12:30", 131400)):
        assert parse_inventory(f"lab:\n  max_time_limit: '{sbatch}'\n",
                               Path("nodes.yaml")).max_time_limit_s == s
        assert parse_time(sbatch, "--since", 1e9) == 1e9 - s


@pytest.mark.parametrize("seconds", [0, -1, 366 * 86400])
def test_a_time_limit_out_of_range_is_refused(seconds):
    with pytest.raises(InputError, match="--time must be more than 0"):
        validate_spec(JobSpec(script="/x.sh", time_limit_s=seconds))


def test_time_limits_print_as_slurm_prints_them():
    assert [hms(s) for s in (None, 59, 7200, 3723, 86400, 3 * 86400 + 5)] == \
        ["-", "0:00:59", "2:00:00", "1:02:03", "1-00:00:00", "3-00:00:05"]


@pytest.mark.parametrize("text, parsed", [
    ("USR1", ("USR1", 60)), ("usr2@120", ("USR2", 120)), ("SIGTERM@0", ("TERM", 0)),
    ("HUP@5", ("HUP", 5)), ("B:USR1@60", ("B:USR1", 60)), ("b:SIGINT", ("B:INT", 60)),
])
def test_signals_as_sbatch_takes_them(text, parsed):
    assert parse_signal(text) == parsed


@pytest.mark.parametrize("text", ["KILL@60", "STOP", "USR1@", "USR1@-5", "USR1@1.5", "9", ""])
def test_a_signal_a_job_cannot_catch_or_a_bad_one_is_refused(text):
    with pytest.raises(InputError, match=r"is not \[B:\]SIGNAL"):
        validate_spec(JobSpec(script="/x.sh", time_limit_s=60, signal=text))
def test_notify_takes_only_its_four_words():
    for when in ("end", "fail", "all", "none"):
        validate_spec(JobSpec(script="/x.sh", notify=when))
    with pytest.raises(InputError, match="--notify must be one of end, fail, all, none, got 'END'"):
        validate_spec(JobSpec(script="/x.sh", notify="END"))


# --------------------------------------------------------------------------- like sbatch


def test_directives_are_read_from_the_top_only_as_sbatch_does():
    text = ("#!/bin/bash\n"
            "# a comment\n\n"
            "#IADEEP --gpus 2 --time 2:00:00   # two GPUs\n"
            "#IADEEP --name 'lr 3'\n"
            "#IADEEPX --not-ours\n"
            "#SBATCH --gpus 8\n"
            "python train.py\n"
            "#IADEEP --gpus 4\n")
    assert O.directives(text) == [(4, ["--gpus", "2", "--time", "2:00:00"]),
                                  (5, ["--name", "lr 3"])]
    assert O.directives("echo hi\n#IADEEP --gpus 2\n") == []


def test_a_directive_with_an_open_quote_names_its_line():
    with pytest.raises(InputError, match="line 2: #IADEEP --name 'x"):
        O.directives("#!/bin/sh\n#IADEEP --name 'x\n")


@pytest.mark.parametrize("text,sep,names", [
    ("n1,n2", ",", ("n1", "n2")), ("n1, n2,n1", ",", ("n1", "n2")),
    ("a100&nvlink", "&", ("a100", "nvlink")), ("h200", "&", ("h200",))])
def test_node_names_and_labels_parse(text, sep, names):
    assert O.parse_names("--x", text, sep) == names


@pytest.mark.parametrize("text,sep", [("n1,,n2", ","), ("a|b", "&"), ("n[1-3]", ","),
                                      ("", ","), ("a&", "&")])
def test_slurm_syntax_iadeep_lacks_is_refused_not_misread(text, sep):
    with pytest.raises(InputError):
        O.parse_names("--x", text, sep)


def test_node_allowed_combines_constraint_nodelist_and_exclude():
    spec = JobSpec("/s", constraint=("a100", "nvlink"), nodelist=("n1", "n2"), exclude=("n2",))
    assert O.node_allowed(spec, "n1", ("a100", "nvlink", "x"))
    assert not O.node_allowed(spec, "n1", ("a100",))            # a label missing
    assert not O.node_allowed(spec, "n2", ("a100", "nvlink"))   # excluded
    assert not O.node_allowed(spec, "n3", ("a100", "nvlink"))   # not in the list
    assert O.node_allowed(JobSpec("/s"), "any", ())


def test_run_dir_chdir_then_shared_submission_dir_then_job_dir():
    assert O.run_dir(JobSpec("/s", workdir="/w", submit_dir="/home/a/p"), ("/home",)) == "/w"
    shared = JobSpec("/s", submit_dir="/home/a/p")
    assert O.run_dir(shared, ("/data", "/home/")) == "/home/a/p"
    assert O.run_dir(shared, ("/home/a/p",)) == "/home/a/p"
    assert O.run_dir(shared, ("/home/a/pp", "/hom")) is None     # path prefixes, not strings
    assert O.run_dir(shared, ()) is None
    assert "not in n1's shared_paths" in O.run_dir_note(shared, "n1", ())
    assert "submission directory, shared on n1" in O.run_dir_note(shared, "n1", ("/home",))


def test_output_patterns_fill_job_id_user_and_name():
    assert O.expand_pattern("out-%j-%u-%x.%%j.%q", 7, "alice", "lr3") == "out-7-alice-lr3.%j.%q"


# sbatch(1) "filename pattern": %A %a %J %j %N %n %s %t %u %x %b %%, %<digits> zero-pads, and a
# name holding a backslash is taken as written without it.
@pytest.mark.parametrize("pattern, expected", [
    ("slurm-%A_%a.out", "slurm-12_3.out"), ("%x.%J.out", "lr3.15.out"),
    ("task-%4a-%5j.log", "task-0003-00015.log"), ("%N-%n-%t-%s-%u.txt", "gpu1-0-0-batch-alice.txt"),
    ("%b/%%a", "3/%a"), ("lit\\%j", "lit%j"),
])
def test_every_sbatch_filename_pattern_in_an_array_task(pattern, expected):
    assert O.expand_pattern(pattern, 15, "alice", "lr3", 12, 3, "gpu1.lab") == expected


def test_outside_an_array_a_is_slurms_no_value_and_A_the_job_id():
    assert O.expand_pattern("%A_%a", 9, "u", "n") == "9_4294967294"


def test_export_default_names_all_and_none():
    env = {"PATH": "/opt/bin:/bin", "LANG": "C.UTF-8", "SECRET": "s", "HOME": "/home/a",
           "SSH_AUTH_SOCK": "/tmp/x", "IADEEP_HOME": "/x", "PS1": "\x1b[1m$ ",
           "BASH_FUNC_f%%": "() { :; }"}
    assert O.exported_env(None, env) == ((("PATH", "/opt/bin:/bin"), ("LANG", "C.UTF-8")), ())
    assert O.exported_env("NONE", env) == ((), ())
    assert O.exported_env("SECRET,LANG", env) == ((("SECRET", "s"), ("LANG", "C.UTF-8")), ())
    pairs, skipped = O.exported_env("ALL", env)
    assert dict(pairs) == {"PATH": "/opt/bin:/bin", "LANG": "C.UTF-8", "SECRET": "s"}
    assert skipped == ("PS1",)
    with pytest.raises(InputError, match="NOPE is not set here"):
        O.exported_env("NOPE", env)


def test_variables_that_change_how_programs_load_are_refused_everywhere():
    """--env and --export refuse the loader's, the shells' start-up and the interpreters'
    code-path variables (a job's environment must never steer a privileged program); Python's
    behaviour switches and ordinary variables pass; ALL leaves the refused ones out, saying so,
    and the default set no longer carries PYTHONPATH."""
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES",
                 "BASH_ENV", "ENV", "SHELLOPTS", "PS4", "IFS", "PYTHONPATH", "PYTHONSTARTUP",
                 "PYTHONHOME", "PERL5OPT", "NODE_OPTIONS", "OPENSSL_CONF"):
        assert J.unsafe_env(name), name
        with pytest.raises(InputError, match=f"^--env {name}: iadeep does not pass variables"):
            validate_spec(JobSpec("/s", env=((name, "/home/m/x"),)))
        with pytest.raises(InputError, match=f"^--export {name}: "):
            validate_spec(JobSpec("/s", exported=((name, "/home/m/x"),)))
        with pytest.raises(InputError, match=f"--export {name}: "):
            O.exported_env(name, {name: "/home/m/x"})
    for name in ("PATH", "LR", "PYTHONUNBUFFERED", "PYTHONHASHSEED", "CUDA_LAUNCH_BLOCKING",
                 "LDFLAGS", "TMPDIR", "OMP_NUM_THREADS"):
        assert not J.unsafe_env(name), name
        validate_spec(JobSpec("/s", env=((name, "1"),), exported=((name, "1"),)))
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/cuda/lib64", "PYTHONPATH": "/src",
           "PYTHONUNBUFFERED": "1"}
    pairs, skipped = O.exported_env("ALL", env)
    assert dict(pairs) == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}
    assert set(skipped) == {"LD_LIBRARY_PATH", "PYTHONPATH"}
    assert O.exported_env(None, env) == ((("PATH", "/bin"),), ())


def test_spec_checks_the_new_fields():
    with pytest.raises(InputError, match="--constraint"):
        validate_spec(JobSpec("/s", constraint=("a b",)))
    with pytest.raises(InputError, match="--output"):
        validate_spec(JobSpec("/s", output="out\x1b"))
    with pytest.raises(InputError, match="submission directory"):
        validate_spec(JobSpec("/s", submit_dir="rel"))
    with pytest.raises(InputError, match="'1X': not a valid variable name"):
        validate_spec(JobSpec("/s", exported=(("1X", "v"),)))
    validate_spec(JobSpec("/s", submit_dir="/h", output="o-%j", error="e-%j",
                          constraint=("a",), nodelist=("n1",), exclude=("n2",),
                          exported=(("PATH", "/bin"),)))


def test_a_requeue_job_checkpoints_on_usr1_unless_it_names_its_signal():
    assert J.checkpoint_signal_of(JobSpec(script="/a")) is None
    assert J.checkpoint_signal_of(JobSpec(script="/a", requeue=True)) == "USR1"
    assert J.checkpoint_signal_of(JobSpec(script="/a", requeue=True,
                                          checkpoint_signal="TERM")) == "TERM"
    assert J.checkpoint_signal_of(JobSpec(script="/a", checkpoint_signal="USR2")) == "USR2"
    spec = J.SubmitSpec.of(JobSpec(script="/a", requeue=True))
    assert spec.to_dict()["requeue"] is True
    assert J.SubmitSpec.from_dict(spec.to_dict()).spec.requeue is True


def test_an_interactive_job_cannot_be_requeued():
    with pytest.raises(InputError, match=r"an interactive job \(run --pty\) cannot be requeued"):
        validate_spec(JobSpec(script="/a", requeue=True, interactive=True))
