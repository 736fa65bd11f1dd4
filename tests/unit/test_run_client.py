"""`iadeep run`'s client while the controller does not answer: said once, retried, and given
up after a bound with the job's id (the end to end test restarts a real controller; this one
checks the bound, which a test cannot wait out at its real length)."""
from __future__ import annotations

import pytest

from iadeep_cli.cli import run
from iadeep_cli.errors import ControllerUnavailable


def _down():
    raise ControllerUnavailable("the iadeep controller is not running (no answer on x.sock)")


def test_a_controller_that_stays_down_ends_the_wait_with_the_job_id(monkeypatch, capsys):
    monkeypatch.setattr(run, "RECONNECT_S", 0.2)
    monkeypatch.setattr(run, "POLL_S", 0.01)
    waiter = run._Waiter(42, run._Status(), run._Interrupts())
    with pytest.raises(ControllerUnavailable) as raised:
        waiter.ask(_down)
    assert raised.value.message == ("the controller has not answered for 0 s; job 42 is still "
                                    "in its queue (or running)")
    assert "iadeep queue show 42" in (raised.value.hint or "")
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith("iadeep run: the controller is not answering "
                                                 "(the iadeep controller is not running")


def test_a_controller_that_answers_again_is_said_and_the_answer_used(monkeypatch, capsys):
    monkeypatch.setattr(run, "POLL_S", 0.01)
    answers = iter([_down, _down, lambda: "ok"])
    waiter = run._Waiter(7, run._Status(), run._Interrupts())
    assert waiter.ask(lambda: next(answers)()) == "ok"
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and "not answering" in said[0]
    assert said[1] == "iadeep run: the controller answers again; following job 7"


def test_the_job_script_execs_the_words_exactly():
    script = run.command_script(["python", "a b.py", "$(id)", "it's"]).decode()
    assert script == "#!/bin/sh\nexec python 'a b.py' '$(id)' 'it'\"'\"'s'\n"


def test_keys_refused_by_the_controller_are_said_once_while_the_job_runs(
        monkeypatch, capsys, tmp_path):
    """The keys' thread stops on the controller's refusal; `iadeep run` says why once, not
    again at each later round of the job still running."""
    import os
    import sys
    from types import SimpleNamespace

    from iadeep_cli.cli import runpty
    from iadeep_cli.jobs import JobState

    monkeypatch.setenv("IADEEP_HOME", str(tmp_path))   # no controller there: refused
    read, write = os.pipe()
    os.write(write, b"ls\r")
    os.close(write)
    monkeypatch.setattr(sys, "stdin", os.fdopen(read))
    keys = runpty.Keys(9)
    keys._pump()                                        # one read, refused: stops
    keys.thread = SimpleNamespace()                     # started (the terminal stays as is)
    states = iter([JobState.RUNNING] * 3 + [JobState.SUCCEEDED])

    def job(_job_id, _place=True):
        view = SimpleNamespace(id=9, state=next(states), attempts=1, exit_code=0, reason=None)
        return view, [view]

    monkeypatch.setattr(run, "_job", job)
    monkeypatch.setattr(run, "_drain_quietly", lambda log, out: False)
    monkeypatch.setattr(run, "PTY_POLL_S", 0.0)
    monkeypatch.setattr(run._Interrupts, "install", lambda self: None)
    assert run.wait_for(9, False, False, keys) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "input not sent" in x]
    assert len(said) == 1 and "controller is not running" in said[0], said
    assert keys.take_error() is None


def test_a_running_jobs_client_asks_for_the_job_not_the_whole_queue(monkeypatch):
    """The queue's whole list (10,000 tasks of an array cost the controller a full read each)
    is asked for only while the job waits, for its place; once it runs, the client (ten asks
    a second with --pty) asks for its own job only."""
    from types import SimpleNamespace

    from iadeep_cli.jobs import JobState

    states = iter([JobState.QUEUED] + [JobState.RUNNING] * 3 + [JobState.SUCCEEDED])
    asked: list[str] = []

    def ask(request):
        asked.append(type(request).__name__)
        view = SimpleNamespace(id=9, state=next(states), attempts=1, exit_code=0, reason=None,
                               priority=0, owner="alice", submitted_at=0.0,
                               expected_start=None)   # JobView: no forecast here
        return [view] if asked[-1] == "ListRequest" else SimpleNamespace(job=view)

    monkeypatch.setattr(run, "client", SimpleNamespace(ask=ask))
    monkeypatch.setattr(run, "_drain_quietly", lambda log, out: False)
    monkeypatch.setattr(run, "POLL_S", 0.0)
    monkeypatch.setattr(run._Interrupts, "install", lambda self: None)
    assert run.wait_for(9, False, False) == 0
    assert asked == ["ListRequest", "ListRequest"] + ["ShowRequest"] * 3, asked


def test_run_places_a_waiting_job_where_the_placer_and_the_monitor_do():
    """`iadeep run`'s "#N of M waiting" ranks by the one rule (``scheduler.priority``): a
    low-priority job that has waited long outranks a newer one of higher priority."""
    from iadeep_cli import messages as m
    from iadeep_cli.jobs import Job, JobSpec, JobState
    from iadeep_cli.scheduler.priority import queue_key, recorded_aging
    from iadeep_cli.tui import viewmodel

    now = 1_000_000.0

    def job(job_id: int, priority: int, waited_h: float) -> m.JobView:
        spec = JobSpec("/home/j.sh", name=f"j{job_id}", priority=priority)
        return m.JobView.from_job(Job(job_id, "alice", spec, JobState.QUEUED,
                                      now - waited_h * 3600))

    jobs = [job(1, 0, 48.0), job(2, 5, 0.1), job(3, 0, 0.5)]
    per_hour = recorded_aging(None)
    order = sorted(jobs, key=lambda j: queue_key(j.priority, j.owner, j.submitted_at, j.id,
                                                 now, per_hour))
    assert order[0].id == 1 and per_hour * 48 > 5   # aging outranks priority 5
    assert [run._position(jobs, j, now) for j in order] == [(1, 3), (2, 3), (3, 3)]
    assert [r.id for r in viewmodel.job_rows(jobs, now)] == [j.id for j in order]
