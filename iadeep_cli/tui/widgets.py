"""Widgets of the monitor: node cards, the confirmation, help and job-detail screens.

Cards render a whole node as one ``Static`` (one widget per node, not per GPU), so a refresh of
64 nodes x 8 GPUs is 64 cheap ``update`` calls, and a card whose value did not change is skipped.
"""
from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import Button, Footer, Static

from .. import messages as m
from ..checks import terminal_safe
from ..errors import IadeepError
from ..text import clock, duration, field_text, gib, when
from . import viewmodel as vm

LEVEL_STYLE = {"ok": "green", "warn": "yellow", "bad": "bold red", "none": "cyan"}
BAR_WIDTH = 8


def bar(fraction: float | None, width: int = BAR_WIDTH) -> Text:
    """A text bar; a metric the driver did not report is drawn as '?' rather than as zero."""
    if fraction is None:
        return Text("?".center(width, "·"), style="dim")
    filled = round(max(0.0, min(1.0, fraction)) * width)
    style = "red" if fraction >= 0.9 else "yellow" if fraction >= 0.6 else "green"
    return Text.assemble(("█" * filled, style), ("░" * (width - filled), "dim"))


def _speed(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _gib(mib: float | None) -> str:
    return gib(mib, compact=True)


WIDE = 110          # card width from which a GPU's jobs fit on its own line


def _chips(gpu: vm.GpuLine) -> list[Text]:
    """The GPU's jobs (coloured by slowdown) and foreign processes, one Text each."""
    out = []
    for chip in gpu.jobs:
        style = LEVEL_STYLE[chip.level] + ("" if chip.match else " dim")
        out.append(Text(f"#{chip.id} {chip.owner}/{chip.name} "
                        f"{_speed(chip.predicted)}/{_speed(chip.observed)}"
                        + (" IDLE" if chip.idle else ""), style=style))
    for proc in gpu.foreign:
        out.append(Text(f"foreign pid {proc.pid} {proc.name} {_gib(proc.mem_mib)}G",
                        style="magenta"))
    for job_id in gpu.gone:
        out.append(Text(f"#{job_id} (last seen here, not running)", style="dim"))
    if gpu.reserved:
        out.append(Text(gpu.reserved, style="cyan"))
    return out or [Text("idle", style="dim")]


def gpu_text(gpu: vm.GpuLine, wide: bool = True) -> Text:
    """One GPU: index, utilisation and memory bars, then its jobs and foreign processes.

    In a narrow card each job after the first goes on its own indented line, so a shared GPU
    never hides its second job behind the right edge.
    """
    mem = (gpu.mem_used_mib / gpu.mem_total_mib
           if gpu.mem_used_mib is not None and gpu.mem_total_mib else None)
    util = "  n/a" if gpu.util is None else f" {gpu.util:3.0f}%"
    head = Text.assemble((f"{gpu.index:>2} ", "bold"),
                         bar(None if gpu.util is None else gpu.util / 100), util, " ", bar(mem),
                         f" {_gib(gpu.mem_used_mib):>4}/{_gib(gpu.mem_total_mib)}G  ")
    chips = _chips(gpu)
    if wide:
        return head + Text(" ").join(chips)
    pad = Text(" " * head.cell_len)
    return Text("\n").join([head + chips[0]] + [pad + c for c in chips[1:]])


def card_text(card: vm.NodeCard, wide: bool = True) -> Text:
    lines = [gpu_text(g, wide) for g in card.gpus] or [Text("no GPUs recorded", style="dim")]
    if card.error is not None:
        lines.insert(0, Text(f"unreachable: {card.error}", style="bold red"))
    return Text("\n").join(lines)


def card_titles(card: vm.NodeCard) -> tuple[str, str]:
    """Border title (name, state, GPU model) and subtitle (how old the data is)."""
    models = sorted({g.name for g in card.gpus if g.name})
    what = f"{len(card.gpus)}x {models[0]}" if len(models) == 1 else f"{len(card.gpus)} GPUs"
    if card.up:
        state = f"[b]{card.name}[/b] [green]up[/] · {what}"
    elif card.error is None:   # stale: not known to be up, nor to be down
        state = f"[b]{card.name}[/b] [yellow]unknown[/] · {what}"
    else:
        state = f"[b]{card.name}[/b] [bold red]DOWN[/] for {duration(card.down_for_s)} · {what}"
    if card.drained is not None:   # no new jobs; escaped: an admin typed the reason
        state += f" · [yellow]drained[/]: {escape(card.drained)}"
    age = f"data {duration(card.age_s)} old"
    return state, (f"[yellow]{age} (stale)[/]" if card.stale else age)


class NodeCardWidget(Widget):
    """One node. ``show`` only stores the new value and marks the card dirty: the text is built
    in ``render``, which Textual calls for cards on screen, so a refresh of 64 nodes costs
    little more than the few cards in view (and nothing for a card whose value is unchanged).
    """

    DEFAULT_CSS = "NodeCardWidget { height: auto; }"

    def __init__(self, card: vm.NodeCard) -> None:
        super().__init__(classes="card")
        self.card: vm.NodeCard | None = None
        self.wide = True
        self.show(card)

    def show(self, card: vm.NodeCard) -> None:
        if card == self.card:
            return
        old, self.card = self.card, card
        self.border_title, self.border_subtitle = card_titles(card)
        self.set_class(card.error is not None, "down")
        self.set_class(card.stale, "stale")
        if self.display != card.visible:
            self.display = card.visible
        self.refresh(layout=not _same_height(old, card))

    def render(self) -> Text:
        return card_text(self.card, self.wide) if self.card else Text()

    def on_resize(self, event) -> None:
        wide = event.size.width >= WIDE
        if wide != self.wide:
            self.wide = wide
            self.refresh(layout=True)


def _same_height(old: vm.NodeCard | None, new: vm.NodeCard) -> bool:
    """Same number of lines in both layouts, so the screen need not be laid out again."""
    if (old is None or (old.error is None) != (new.error is None)   # the "unreachable" line
            or len(old.gpus) != len(new.gpus) or not new.gpus):
        return False
    return all((len(a.jobs), len(a.foreign), len(a.gone)) == (len(b.jobs), len(b.foreign),
                                                            len(b.gone))
               for a, b in zip(old.gpus, new.gpus))


class ConfirmScreen(ModalScreen[bool]):
    """Yes/no before anything destructive (cancel)."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No"),
                Binding("escape", "answer(False)", "No", show=False)]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (n)", id="no", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


HELP = """\
[b]iadeep monitor[/b]: what the controller recorded, refreshed every poll interval.

  [b]q[/b]        quit
  [b]Tab[/b]      switch between cluster and queue
  [b]/[/b]        filter: text, or user:NAME (or @NAME); Esc clears
  [b]Enter[/b]    job details: fields, events, the tail of its log
  [b]c[/b]        cancel the selected job (asks first; owners and admins may)
  [b]h[/b] / [b]r[/b]    hold / release the selected job
  [b]Ctrl+R[/b]   refresh now
  [b]?[/b]        this help

Job colours: speed relative to running alone (observed if measured, else
predicted; shown as predicted/observed):
  [green]>= 0.85 barely slowed[/]   [yellow]0.60-0.85 slowed[/]   [bold red]< 0.60 badly slowed[/]
  [cyan]no estimate[/]   [magenta]foreign[/]: a process iadeep did not start
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)


FIELDS = ("id", "name", "owner", "state", "reason", "script", "args", "workdir", "gpus",
          "mem_gib", "workload", "priority", "exclusive", "retries", "attempts", "node",
          "gpu_indices", "remote_pid", "exit_code", "predicted_speed", "observed_speed")


def job_text(detail: m.JobDetail, now: float) -> Text:
    """Every field, labelled as the JSON has it, valued as `queue show` prints it
    (``text.field_text``), then the times and the events."""
    out, job = Text(), detail.job
    for name in FIELDS:
        out.append(f"{m.JobView.key(name):>16}: ", style="dim")
        out.append(f"{field_text(name, getattr(job, name))}\n")
    for name in ("submitted_at", "started_at", "ended_at"):
        out.append(f"{name:>16}: ", style="dim")
        out.append(f"{when(getattr(job, name), now)}\n")
    out.append("\nevents\n", style="bold")
    for ev in detail.events:
        old = "-" if ev.old_state is None else ev.old_state.value
        out.append(f"  {clock(ev.at)}  {old:>9} -> {ev.new_state.value:<9}"
                   f" {ev.actor}: {ev.reason}\n")
    return out


def log_text(log: str, lines: int) -> Text:
    """The last ``lines`` lines of a job's log as the monitor shows them: its colours kept, a
    line rewritten with carriage returns (a progress bar) as its last state, and every other
    escape sequence or control character shown escaped (``checks.terminal_safe``), so nothing
    a job wrote reaches the terminal as a command (OSC title or clipboard, cursor moves,
    clears)."""
    safe = terminal_safe(log.replace("\r\n", "\n"), keep="\t\n\r")
    tail = "\n".join(safe.split("\n")[-lines - 1:]).strip("\n")
    return Text.from_ansi(tail) if tail else Text("(empty)")


class JobDetailScreen(Screen[None]):
    """Fields, events and the log tail of one job, loaded in a thread (never blocks the UI)."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Back"),
                Binding("ctrl+r", "reload", "Reload")]
    LOG_LINES = 40

    def __init__(self, job_id: int,
                 load_job: Callable[[int], tuple[m.JobDetail, float | None]],
                 load_log: Callable[[int], str], now: Callable[[], float]) -> None:
        super().__init__()
        self.job_id = job_id
        self.load_job = load_job
        self.load_log = load_log
        self.now = now

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(f"loading job {self.job_id}...", id="fields")
            yield Static("", id="log")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#detail").border_title = f"job {self.job_id}"
        self.action_reload()

    def action_reload(self) -> None:
        self.run_worker(self._load, thread=True, group="detail")

    def _load(self) -> None:
        try:
            job, _stale = self.load_job(self.job_id)
            fields = job_text(job, self.now())
        except IadeepError as exc:
            fields = Text(f"cannot show job {self.job_id}: {exc.message}", style="red")
        try:
            log = Text.assemble(("log (tail)\n", "bold"),
                                log_text(self.load_log(self.job_id), self.LOG_LINES))
        except IadeepError as exc:
            log = Text.assemble(("log (tail)\n", "bold"), (f"unavailable: {exc.message}",
                                                            "yellow"))
        self.app.call_from_thread(self._show, fields, log)

    def _show(self, fields: Text, log: Text) -> None:
        self.query_one("#fields", Static).update(fields)
        self.query_one("#log", Static).update(log)
