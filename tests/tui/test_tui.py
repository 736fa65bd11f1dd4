"""`iadeep monitor`: the pure view model, and the real app driven with Textual's Pilot.

The app reads seeded state databases through the real client (the controller's socket when a
real controller runs in a thread, else the database fallback) and sends actions through a real
controller, so permission checks and state changes are the controller's own.
"""
from __future__ import annotations

import asyncio
import functools
import getpass
import subprocess
import sys
import threading

import pytest

from helpers import seed
from iadeep_cli import messages as m
from iadeep_cli.errors import StoreError
from iadeep_cli.jobs import ACTIVE, PENDING, Job, JobSpec, JobState
from iadeep_cli.settings import Inventory
from iadeep_cli.store import Store, jobrows
from iadeep_cli.tui import source, viewmodel as vm
from iadeep_cli.tui.source import MonitorData

NOW = seed.NOW


def run_async(test):
    """pytest-asyncio is not installed: run the coroutine test in a fresh event loop."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))
    return wrapper


# --------------------------------------------------------------------------- view model (pure)
def _job(id, state="queued", user="alice", priority=0, submitted_at=NOW - 60, **kw):
    spec = JobSpec("/home/j.sh", name=f"j{id}", priority=priority)
    return m.JobView.from_job(Job(id, user, spec, JobState(state), submitted_at, **kw))


def test_a_waiting_row_shows_the_expected_start_where_the_controller_forecast_one():
    import dataclasses

    from iadeep_cli.text import moment  # "14:20" today (its format: tests/unit/test_foresight)

    at = NOW + 20 * 60
    waiting = dataclasses.replace(_job(1), reason="all GPUs busy", expected_start=at)
    plain = dataclasses.replace(_job(2), reason="all GPUs busy")
    rows = {r.id: r for r in vm.job_rows([waiting, plain], NOW)}
    assert rows[1].cells[7] == f"all GPUs busy - expected ~{moment(at, NOW)}"
    assert rows[2].cells[7] == "all GPUs busy"


@pytest.mark.parametrize("predicted, observed, level", [
    (0.95, None, "ok"), (0.85, None, "ok"), (0.84, None, "warn"), (0.6, None, "warn"),
    (0.59, None, "bad"), (None, None, "none"), (0.95, 0.4, "bad"), (0.3, 0.9, "ok")])
def test_speed_level_prefers_observed_speed(predicted, observed, level):
    assert vm.speed_level(predicted, observed) == level


def test_queue_order_is_priority_plus_ageing_then_age():
    # ageing is 1 point per hour: job 1 waited 3 h at priority 0 (3.0) beats job 2 at
    # priority 2 submitted just now (2.0); job 3 (priority 5) beats both.
    jobs = [_job(2, priority=2, submitted_at=NOW), _job(1, submitted_at=NOW - 3 * 3600),
            _job(3, priority=5, submitted_at=NOW), _job(4, state="held"),
            _job(5, state="running", node="n1", gpu_indices=(0,), started_at=NOW - 120)]
    rows = vm.job_rows(jobs, NOW)
    assert [r.id for r in rows] == [3, 1, 2, 4, 5]
    assert [r.cells[0] for r in rows] == ["1", "2", "3", "-", "-"]
    assert rows[1].cells[6] == "3h00m"          # waiting time from the injected clock
    assert rows[4].cells[6] == "2m" and rows[4].cells[7] == "on n1:0"


def test_queue_order_counts_the_fair_share_points_as_the_scheduler_does():
    """With fair share on, the monitor numbers the queue as plan() orders it: the last round's
    points per user (from `status`) count in the effective priority."""
    from iadeep_cli.scheduler.priority import order_queue
    from iadeep_cli.settings import Policy

    points = {"alice": 0.5, "bob": 9.0}
    jobs = [Job(1, "alice", JobSpec("/j.sh", priority=2), JobState.QUEUED, NOW - 3600),
            Job(2, "bob", JobSpec("/j.sh"), JobState.QUEUED, NOW - 60),
            Job(3, "carol", JobSpec("/j.sh", priority=1), JobState.QUEUED, NOW - 7200)]
    views = [m.JobView.from_job(j) for j in jobs]
    scheduled = [j.id for j in order_queue(jobs, Policy(), NOW, points)]
    assert [r.id for r in vm.job_rows(views, NOW, fairshare=points)] == scheduled == [2, 1, 3]
    assert [r.id for r in vm.job_rows(views, NOW)] == [3, 1, 2]   # the points moved bob up


def test_filter_by_user_keeps_real_queue_positions():
    jobs = [_job(1, user="bob", submitted_at=NOW - 30), _job(2, user="alice"),
            _job(3, user="bob", submitted_at=NOW - 10)]
    rows = vm.job_rows(jobs, NOW, "user:bob")
    # alice's job 2 (waiting 60 s) is first in the whole queue, so bob's are 2nd and 3rd
    assert [(r.cells[0], r.id) for r in rows] == [("2", 1), ("3", 3)]
    assert [r.id for r in vm.job_rows(jobs, NOW, "@alice")] == [2]
    assert [r.id for r in vm.job_rows(jobs, NOW, "j3")] == [3]
    assert vm.job_rows(jobs, NOW, "user:nobody") == ()


@pytest.mark.parametrize("stale, level", [(None, "live"), (0.0, "never"), (NOW - 300, "stale")])
def test_banner_says_whether_the_controller_runs(stale, level):
    status = m.StatusView(NOW, (), {}, m.ControllerView(poll_interval_s=5))
    banner = vm.banner(MonitorData(status, [], stale), NOW)
    assert banner.level == level
    if level == "stale":
        assert "5m ago" in banner.text


def test_node_age_comes_from_the_injected_clock_and_flags_stale_data():
    node = {"name": "n1", "taken_at": NOW - 45, "error": None, "down_since": None,
            "age_s": 999999, "state": "up", "gpus": []}
    card = vm.node_card(m.NodeView.from_dict(node), NOW, stale_s=30)
    assert card.age_s == 45 and card.stale          # 45 s > 30 s
    assert not vm.node_card(m.NodeView.from_dict(node), NOW, stale_s=60).stale


@pytest.mark.parametrize("age_s, state", [(45, "up"), (5, "removed")])
def test_stale_or_no_longer_polled_node_is_not_up_nor_down(age_s, state):
    from iadeep_cli.tui.widgets import card_text, card_titles

    node = {"name": "n1", "taken_at": NOW - age_s, "error": None, "down_since": None,
            "age_s": 999999, "state": state, "gpus": []}
    card = vm.node_card(m.NodeView.from_dict(node), NOW, stale_s=30)
    assert not card.up and card.stale and card.error is None
    title, subtitle = card_titles(card)
    assert "unknown" in title and "up" not in title and "DOWN" not in title
    assert "(stale)" in subtitle and "unreachable" not in card_text(card).plain
    fresh = m.NodeView.from_dict({**node, "taken_at": NOW - 5, "state": "up"})
    assert vm.node_card(fresh, NOW, stale_s=30).up


def test_a_drained_node_card_says_so_with_the_admins_reason_as_text():
    from iadeep_cli.tui.widgets import card_titles

    node = {"name": "n1", "taken_at": NOW - 5, "error": None, "down_since": None,
            "age_s": 5, "state": "up", "gpus": [],
            "drain": {"reason": "swap [b]disk[/b]", "by": "pi", "at": NOW - 60}}
    card = vm.node_card(m.NodeView.from_dict(node), NOW, stale_s=30)
    title, _ = card_titles(card)
    assert card.up and "drained" in title
    assert "swap \\[b]disk\\[/b] (pi)" in title   # markup typed by the admin stays text


def test_gpu_shows_foreign_processes_and_jobs_that_left():
    gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "utilization_gpu": None,
           "memory_used_mib": 10.0, "memory_total_mib": 100.0,
           "jobs": [{"id": 7, "user": "bob", "name": "x", "state": "running",
                     "predicted_speed": 0.5, "observed_speed": None}],
           "processes": [{"pid": 1, "used_memory_mib": 5.0, "name": "jupyter", "job_id": None},
                         {"pid": 2, "used_memory_mib": 5.0, "name": "python", "job_id": 7},
                         {"pid": 3, "used_memory_mib": 5.0, "name": "python", "job_id": 9}]}
    line = vm._gpu_line(m.GpuView.from_dict(gpu), "")
    assert [f.pid for f in line.foreign] == [1]
    assert line.gone == (9,)
    assert line.jobs[0].level == "bad"


def test_a_reserved_gpu_says_for_whom_and_until_when():
    from iadeep_cli.text import clock
    from iadeep_cli.tui.widgets import card_text

    gpu = {"index": 1, "uuid": "GPU-1", "name": "H200", "memory_total_mib": 100.0, "jobs": []}
    node = m.NodeView.from_dict({"name": "n1", "taken_at": NOW - 1, "error": None,
                                 "down_since": None, "state": "up", "age_s": 1,
                                 "gpus": [{**gpu, "index": 0, "uuid": "GPU-0"}, gpu]})
    held = m.ReservationView(3, "alice", 1, "n1", NOW - 60, NOW + 3600, "root", ("n1:1",))
    status = m.StatusView(NOW, (node,), {}, m.ControllerView(poll_interval_s=5),
                          reservations=(held,))
    [card] = vm.build_view(MonitorData(status, [], None), NOW).nodes
    assert [g.reserved for g in card.gpus] == ["", f"reserved for alice until "
                                                   f"{clock(NOW + 3600)} (#3)"]
    assert card_text(card).plain.splitlines()[1].endswith(f"until {clock(NOW + 3600)} (#3)")
    assert "reserved" not in card_text(card).plain.splitlines()[0]


# --------------------------------------------------------------------------- seeded stores
_seed = seed.seed_state_dir


def _jobs_in_store(states) -> list:
    store = Store(readonly=True)
    try:
        with store.tx() as conn:
            return jobrows.select(conn, states=states)
    finally:
        store.close()


def _job_state(job_id: int) -> JobState:
    store = Store(readonly=True)
    try:
        with store.tx() as conn:
            return jobrows.get(conn, job_id).state
    finally:
        store.close()


@pytest.fixture
def controller(home):
    """A real controller on the seeded state directory, serving its socket in a thread."""
    from iadeep_cli.controller.runtime import Controller

    _seed("busy")
    ctl = Controller(Inventory(nodes=()), home, clock=lambda: NOW)
    ready = threading.Event()
    thread = threading.Thread(target=ctl.run, args=(ready.set,), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield ctl
    ctl.stop()
    thread.join(10)


def _app(**kw):
    from iadeep_cli.tui.app import MonitorApp

    class Recording(MonitorApp):
        """The real app, remembering the notifications it showed."""

        def notify(self, message, **kwargs):
            self.messages.append(str(message))
            return super().notify(message, **kwargs)

    app = Recording(now=lambda: NOW, auto_refresh=False, **kw)
    app.messages = []
    return app


async def _settle(pilot, rounds: int = 4) -> None:
    """Let thread workers finish and their results reach the UI (a chain: act -> refresh)."""
    for _ in range(rounds):
        await pilot.pause()
        await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def _select(app, job_id: int) -> None:
    row = next(i for i, r in enumerate(app._rows) if r.id == job_id)
    app.query_one("#queue").move_cursor(row=row, animate=False)
    assert app.selected_job_id() == job_id


async def _act(pilot, job_id: int, *keys: str) -> None:
    """Select job ``job_id`` in the queue, press ``keys``, and let the action (a worker) and the
    refresh it causes reach the UI."""
    _select(pilot.app, job_id)
    await pilot.press(*keys)
    await _settle(pilot)


def _find(name: str) -> int:
    return next(j.id for j in _jobs_in_store(None) if j.name == name)


# --------------------------------------------------------------------------- Pilot
@run_async
async def test_first_refresh_runs_in_a_worker_and_reads_the_database(home):
    _seed("down")
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        unfinished = _jobs_in_store([s for s in JobState if s.value in
                                     ("queued", "held", "starting", "running", "lost")])
        table = app.query_one("#queue")
        assert table.row_count == len(unfinished) > 0
        assert sorted(app._cards) == ["gpu-a", "gpu-b", "gpu-c"]
        assert app._cards["gpu-c"].has_class("down")
        assert not app._cards["gpu-a"].has_class("down")
        assert app.view.banner.level == "stale"           # no controller: database fallback
        assert "NOT running" in str(app.query_one("#banner").content)


@run_async
async def test_live_controller_banner_and_tab_switches_panes(controller):
    app = _app()
    async with app.run_test(size=(100, 30)) as pilot:
        await _settle(pilot)
        assert app.view.banner.level == "live"
        assert app.focused.id == "queue"
        await pilot.press("tab")
        assert app.focused.id == "cluster"
        await pilot.press("tab")
        assert app.focused.id == "queue"


@run_async
async def test_filter_by_user_then_escape_clears(home):
    _seed("long_queue")
    app = _app(initial=source.fetch())
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        everyone = app.query_one("#queue").row_count
        await pilot.press("slash", *"user:bob", "enter")
        bobs = [j for j in _jobs_in_store(PENDING | ACTIVE | {JobState.LOST})
                if j.owner == "bob"]
        assert {r.owner for r in app._rows} == {"bob"}
        assert app.query_one("#queue").row_count == len(bobs) < everyone
        await pilot.press("slash", "escape")
        assert app.query_text == ""
        assert app.query_one("#queue").row_count == everyone


@run_async
async def test_filter_caption_follows_every_keystroke(home):
    """The queue's caption names the filter as typed, also when a keystroke leaves the matching
    rows unchanged ("user:b" and "user:bo" both match nobody)."""
    _seed("long_queue")
    app = _app(initial=source.fetch())
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        table, box = app.query_one("#queue"), app.query_one("#filter")
        await pilot.press("slash")
        unchanged = 0
        for key in "user:bob":
            before = app._rows
            await pilot.press(key)
            unchanged += app._rows == before
            assert table.border_subtitle == f"{table.row_count} jobs matching {box.value!r}"
        assert unchanged and box.value == "user:bob" and table.row_count > 0
        await pilot.press("backspace", *"b")     # fast: two keys, one pause
        assert table.border_subtitle.endswith("matching 'user:bob'")


@run_async
async def test_cancel_asks_first_and_goes_through_the_controller(controller):
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        job = _find("new-model")
        _select(app, job)
        await pilot.press("c")
        assert type(app.screen).__name__ == "ConfirmScreen"
        await pilot.press("n")
        await _settle(pilot)
        assert _job_state(job) is JobState.QUEUED
        await _act(pilot, job, "c", "y")
        assert _job_state(job) is JobState.CANCELLED
        assert job not in [r.id for r in app._rows]       # the refresh dropped it
        store = Store(readonly=True)
        with store.tx() as conn:
            last = jobrows.events(conn, job)[-1]
        store.close()
        assert last["actor"] == getpass.getuser()     # the socket's user, not the TUI's claim


@run_async
async def test_hold_and_release_through_the_controller(controller):
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        job = _find("vgg16-aug")
        await _act(pilot, job, "h")
        assert _job_state(job) is JobState.HELD
        await _act(pilot, job, "r")
        assert _job_state(job) is JobState.QUEUED
        assert any(f"job {job}: queued" in m for m in app.messages)


@run_async
async def test_controller_refusal_is_shown_not_raised(controller):
    """Holding a running job is an invalid transition: the controller's message is shown."""
    app = _app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _settle(pilot)
        job = _find("mlp-base")
        await _act(pilot, job, "h")
        assert _job_state(job) is JobState.RUNNING
        assert any("cannot become held" in m for m in app.messages), app.messages


@run_async
async def test_actions_without_a_controller_say_so(home):
    _seed("busy")
    app = _app(initial=source.fetch())
    async with app.run_test(size=(120, 40)) as pilot:
        job = _find("vgg16-aug")
        await _act(pilot, job, "h")
        assert _job_state(job) is JobState.QUEUED
        assert any("controller is not running" in m for m in app.messages), app.messages


@run_async
async def test_enter_opens_job_details_with_events_and_log_note(home):
    _seed("busy")
    app = _app(initial=source.fetch())
    async with app.run_test(size=(120, 40)) as pilot:
        job = _find("ablation-7")
        await _act(pilot, job, "enter")
        assert type(app.screen).__name__ == "JobDetailScreen"
        fields = str(app.screen.query_one("#fields").content)
        assert "ablation-7" in fields and "held by dana" in fields and "submitted" in fields
        values = {line.split(": ", 1)[1] for line in fields.split("events")[0].splitlines()
                  if ": " in line}                       # as `queue show` prints them
        assert not {"None", "False", "True", "[]", "{}", "null"} & values, values
        assert not any(v.startswith(("[", "{")) for v in values), values
        assert "controller is not running" in str(app.screen.query_one("#log").content)
        await pilot.press("escape")
        assert type(app.screen).__name__ != "JobDetailScreen"


HOSTILE_LOG = ("epoch 1 loss 0.9\n"
               "\x1b]52;c;cm0gLXJmIH4vKg==\x07"     # OSC 52: the clipboard (rm -rf ~/*)
               "\x1b]0;root@head: ~\x07"              # OSC 0: the window title
               "\x1bPqhostile-dcs\x1b\\"             # DCS
               "\x1b_hostile-apc\x1b\\"              # APC
               "\x1b[2J\x1b[7;3H\x1b[3A\x1b[K"       # clear screen, cursor moves, clear line
               "fake: job finished OK\n"
               "\x1b[1;31mcolourful-loss\x1b[0m 0.12\n"
               "step 1/3\rstep 2/3\rstep 3/3\n")
ATTACKS = ("\x1b]52;", "\x1b]0;", "\x1bP", "\x1b_", "\x1b[2J", "\x1b[7;3H", "\x1b[3A",
           "\x1b[K", "\x07")


@run_async
async def test_a_log_tail_with_terminal_escapes_reaches_the_screen_inert_with_its_colours(home):
    """The job detail's log tail holds OSC 52 (clipboard), OSC 0 (title), DCS, APC, a screen
    clear and cursor moves: none of them is in what Textual writes to the terminal (the whole
    screen rendered as terminal output), each shown as visible text instead, while the
    job's colours and its progress bar's last state survive."""
    _seed("busy")
    app = _app(initial=source.fetch(), load_log=lambda job_id: HOSTILE_LOG)
    async with app.run_test(size=(160, 50)) as pilot:
        await _act(pilot, _find("ablation-7"), "enter")
        assert type(app.screen).__name__ == "JobDetailScreen"
        terminal = app.screen._compositor.render_full_update().render_segments(app.console)
        for attack in ATTACKS:
            assert attack not in terminal, attack
        assert "\\x1b]52;c;cm0gLXJmIH4vKg==\\x07" in terminal    # shown, inert
        assert "\\x1b[2J\\x1b[7;3H" in terminal
        assert "step 3/3" in terminal and "step 2/3" not in terminal
        log = app.screen.query_one("#log")
        colours = [seg.style.color for strip in log.render_lines(log.region.reset_offset)
                   for seg in strip if "colourful-loss" in seg.text and seg.style]
        assert colours and colours[0] is not None and colours[0].name != "default"


@run_async
async def test_help_screen_opens_and_closes(home):
    _seed("empty")
    app = _app(initial=source.fetch())
    async with app.run_test() as pilot:
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert type(app.screen).__name__ == "Screen"


@run_async
async def test_a_failing_refresh_keeps_the_last_data_and_says_why(home):
    _seed("busy")
    first = source.fetch()

    def broken():
        raise StoreError("iadeep.db: database is locked", hint="try again")

    app = _app(initial=first, fetch=broken)
    async with app.run_test(size=(120, 40)) as pilot:
        rows = app.query_one("#queue").row_count
        await pilot.press("ctrl+r")
        await _settle(pilot)
        assert "database is locked" in str(app.query_one("#banner").content)
        assert app.query_one("#queue").row_count == rows > 0
        await pilot.press("q")
    assert app.return_code == 0


def test_cli_imports_textual_only_inside_the_command():
    code = ("import sys; import iadeep_cli.cli.main; "
            "assert 'textual' not in sys.modules, 'textual imported at start-up'; "
            "from iadeep_cli.cli.main import app; "
            "import typer.main; names = [c.name for c in app.registered_commands]; "
            "assert 'monitor' in names, names")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_array_tasks_read_as_in_the_cli_and_a_rerun_task_is_labelled_once():
    task = {"array_id": 12}
    old = _job(14, "cancelled", array_index=3, **task)
    rerun = _job(20, "queued", array_index=3, **task)
    other = _job(15, "queued", array_index=4, **task)
    rows = {r.id: r.cells[1] for r in vm.job_rows([old, rerun, other], NOW)}
    assert rows == {20: "12_3", 15: "12_4"}               # finished ones are not in the queue
    from iadeep_cli.text import job_label, newest_runs
    assert job_label(old, newest_runs([old, rerun])) == "14"


def test_queue_columns_grow_and_shrink_with_the_terminal():
    jobs = [m.JobView.from_job(Job(1, "a-long-user-name", JobSpec("/j.sh", name="n" * 40),
                                   JobState.QUEUED, NOW - 60, reason="r" * 90))]
    rows = vm.job_rows(jobs, NOW)
    wide = vm.fit_widths(rows, 200)
    assert (wide[2], wide[3], wide[7]) == (16, 40, 90)    # nothing cut on 200 columns
    narrow = vm.fit_widths(rows, 80)
    assert sum(narrow) + vm.CELL_GAP * (len(narrow) - 1) <= 80
    assert narrow[3] < 40 and narrow[7] < 90 and narrow[7] >= 12
