"""The monitor app: cluster cards and the queue, refreshed from the controller in a thread.

Attributes down, messages up: a thread worker calls ``fetch`` (socket or database, never SSH)
every poll interval and hands the result to ``apply`` on the UI thread; ``apply`` builds the
pure view model and updates widgets in place (cards are rebuilt only when the node set
changes). Actions go through the controller (``act``), which checks who may do what. Every
dependency is injected (fetch, act, clock, user), so tests run the real app on seeded stores
with a fixed clock and no timer.
"""
from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input, Static

from .. import messages as m
from ..errors import IadeepError
from . import source, viewmodel as vm
from .source import MonitorData
from .widgets import ConfirmScreen, HelpScreen, JobDetailScreen, NodeCardWidget

Fetch = Callable[[], MonitorData]
Act = Callable[[m.JobsRequest], list[m.JobActionResult]]


def _set(widget, attr: str, value: str) -> None:
    """Assign a title only when it changed (each assignment repaints the widget)."""
    if getattr(widget, attr) != value:
        setattr(widget, attr, value)


class QueueTable(DataTable):
    """The queue; Enter opens the selected job (shown in the footer, unlike DataTable's).
    Its columns follow the terminal's width (``fit``)."""

    BINDINGS = [Binding("enter", "select_cursor", "Details")]
    rows_shown: tuple[vm.JobRow, ...] = ()

    def on_resize(self) -> None:
        self.fit()

    def fit(self) -> None:
        """Column widths for what the rows show on this width (``vm.fit_widths``), set as
        DataTable sets its own (render widths, virtual size, caches) only when they change."""
        room = self.scrollable_content_region.width - 2 * self.cell_padding
        if room <= 0:
            return
        widths = vm.fit_widths(self.rows_shown, room)
        columns = list(self.columns.values())
        if [c.width for c in columns] == list(widths):
            return
        for column, width in zip(columns, widths):
            column.width, column.auto_width = width, False
        height = self.virtual_size.height
        self.virtual_size = Size(sum(c.get_render_width(self) for c in columns)
                                 + self._row_label_column_width, height)
        self._clear_caches()
        self.refresh()


class MonitorApp(App[None]):
    CSS_PATH = str(Path(__file__).with_name("monitor.tcss"))  # absolute: subclasses too
    TITLE = "iadeep monitor"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("slash", "filter", "Filter"),
        Binding("tab", "switch_pane", "Pane", priority=True),
        Binding("enter", "details", "Details"),
        Binding("c", "cancel", "Cancel"),
        Binding("h", "hold", "Hold"),
        Binding("r", "release", "Release"),
        Binding("question_mark", "help", "Help"),
        Binding("ctrl+r", "refresh_now", "Refresh", show=False),
    ]

    def __init__(self, *, fetch: Fetch = source.fetch, act: Act = source.act,
                 load_job=source.show, load_log=source.log_tail,
                 now: Callable[[], float] = time.time, user: str | None = None,
                 initial: MonitorData | None = None, auto_refresh: bool = True) -> None:
        super().__init__()
        self.fetch = fetch
        self.act = act
        self.load_job = load_job
        self.load_log = load_log
        self.now = now
        self.user = user or getpass.getuser()
        self.refresh_timer_on = auto_refresh
        self.data = initial
        self.view: vm.View | None = None
        self.query_text = ""
        self._cards: dict[str, NodeCardWidget] = {}
        self._card_names: list[str] | None = None     # None: nothing drawn yet
        self._rows: tuple[vm.JobRow, ...] | None = None
        self._slot_keys: list = []          # RowKey of table row i (rows are positional)
        self._column_keys: list = []
        self._fetching = False
        self._timer: Timer | None = None
        self._interval = 0.0

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static("loading...", id="banner")
        yield VerticalScroll(id="cluster")
        table = QueueTable(id="queue", cursor_type="row", zebra_stripes=True)
        self._column_keys = [table.add_column(label, width=width, key=key)
                             for (label, width), key in zip(vm.COLUMNS_WIDTHS, vm.COLUMN_KEYS)]
        yield table
        yield Input(placeholder="filter: text, or user:NAME — Enter keeps it, Esc clears",
                    id="filter")
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#cluster").border_title = "Cluster"
        self.query_one("#queue").border_title = "Queue"
        self.query_one("#queue").focus()
        if self.data is not None:
            self.apply(self.data)
        else:
            self.action_refresh_now()

    # ------------------------------------------------------------------ refreshing
    def action_refresh_now(self) -> None:
        """Fetch in a thread; a refresh still running (slow disk, busy controller) is not
        doubled up, so a slow store never piles work onto the UI."""
        if self._fetching:
            return
        self._fetching = True
        self.run_worker(self._fetch_in_thread, thread=True, group="refresh")

    def _fetch_in_thread(self) -> None:
        try:
            data = self.fetch()
        except IadeepError as exc:
            self.call_from_thread(self._fetch_failed, exc)
            return
        self.call_from_thread(self.apply, data)

    def _fetch_failed(self, exc: IadeepError) -> None:
        self._fetching = False
        banner = self.query_one("#banner", Static)
        self._banner: vm.Banner | None = None   # the next good refresh redraws the banner
        banner.set_classes("error")
        banner.update(f"cannot read the controller's data: {exc.message}"
                      + (f" ({exc.hint})" if exc.hint else "") + "; retrying")
        self._schedule(self._interval or vm.DEFAULT_POLL_S)

    def _schedule(self, interval: float) -> None:
        if not self.refresh_timer_on or interval == self._interval:
            return
        if self._timer is not None:
            self._timer.stop()
        self._interval = interval
        self._timer = self.set_interval(interval, self.action_refresh_now)

    def apply(self, data: MonitorData) -> None:
        """New data from the controller: rebuild the view model and update widgets in place."""
        self._fetching = False
        self.data = data
        self.render_view()
        self._schedule(self.view.poll_interval_s if self.view else vm.DEFAULT_POLL_S)

    def render_view(self) -> None:
        if self.data is None:
            return
        view = vm.build_view(self.data, self.now(), self.query_text)
        self.view = view
        banner = self.query_one("#banner", Static)
        if view.banner != getattr(self, "_banner", None):
            banner.set_classes(view.banner.level)
            banner.update(view.banner.text)
            self._banner = view.banner
        down = sum(n.error is not None for n in view.nodes)
        _set(self.query_one("#queue"), "border_title", f"Queue · {view.summary}")
        _set(self.query_one("#cluster"), "border_title",
             f"Cluster · {len(view.nodes)} nodes" + (f" ([b red]{down} DOWN[/])" if down else "")
             + f" · you are {self.user}")
        self._update_cards(view.nodes)
        self._update_table(view.rows)

    def _update_cards(self, nodes: tuple[vm.NodeCard, ...]) -> None:
        pane = self.query_one("#cluster", VerticalScroll)
        names = [n.name for n in nodes]
        if names != self._card_names:
            self._card_names = names
            pane.remove_children()
            self._cards = {n.name: NodeCardWidget(n) for n in nodes}
            if self._cards:
                pane.mount_all(self._cards.values())
            else:
                empty = Static("no nodes recorded yet (the controller has not polled any)",
                               classes="empty")
                pane.mount(empty)
            return
        for card in nodes:
            self._cards[card.name].show(card)

    def _update_table(self, rows: tuple[vm.JobRow, ...]) -> None:
        """Show ``rows``, keeping the cursor on the same job if it is still listed.

        Table rows are *slots* keyed by position, and only cells whose text changed are
        rewritten (fixed column widths, so nothing is re-measured): a DataTable measures every
        newly added row, which for 3,000 rows costs far more than the poll interval allows.
        """
        table = self.query_one("#queue", DataTable)
        # The caption names the filter as typed now, also when a keystroke leaves the matching
        # rows as they were and the early return below skips the table.
        _set(table, "border_subtitle", f"{len(rows)} jobs" + (
            f" matching {self.query_text!r}" if self.query_text else ""))
        if rows == self._rows:
            return
        keep = self.selected_job_id()
        old = self._rows or ()
        self._rows = rows
        if isinstance(table, QueueTable):
            table.rows_shown = rows
        keys, slots = self._column_keys, self._slot_keys
        # DataTable.update_cell repaints per call (~20 us): 20,000 changed cells when the
        # queue's head leaves would cost 400 ms. Write the cells into the table's data and
        # repaint once; if a future Textual stores cells differently, use the public API.
        cells: Any = getattr(table, "_data", None)
        bulk = isinstance(cells, dict) and isinstance(getattr(table, "_update_count", None), int)
        changed = False
        for slot in range(min(len(old), len(rows))):
            before, after = old[slot].cells, rows[slot].cells
            if before == after:
                continue
            row_key = slots[slot]
            target = cells.get(row_key) if bulk else None
            for key, was, now in zip(keys, before, after):
                if was == now:
                    continue
                if target is not None and key in target:
                    target[key] = now
                    changed = True
                else:
                    table.update_cell(row_key, key, now)
        if changed:
            table._update_count += 1     # invalidates DataTable's row render caches
            table.refresh()
        for _ in range(len(old) - 1, len(rows) - 1, -1):
            table.remove_row(slots.pop())
        for slot in range(len(old), len(rows)):
            slots.append(table.add_row(*rows[slot].cells, key=str(slot)))
        if isinstance(table, QueueTable):
            table.fit()
        if keep is not None:
            at = next((i for i, r in enumerate(rows) if r.id == keep), None)
            if at is not None and at != table.cursor_row:
                table.move_cursor(row=at, animate=False)

    # ------------------------------------------------------------------ selection and actions
    def selected_job_id(self) -> int | None:
        """The job under the queue's cursor (rows are positional slots, see _update_table)."""
        table = self.query_one("#queue", DataTable)
        rows = self._rows or ()
        if not rows or not 0 <= table.cursor_row < len(rows):
            return None
        return rows[table.cursor_row].id

    def _selected_row(self) -> vm.JobRow | None:
        job_id = self.selected_job_id()
        if job_id is None:
            self.notify("no job selected (move to the queue with Tab)", severity="warning")
            return None
        return (self._rows or ())[self.query_one("#queue", DataTable).cursor_row]

    def action_cancel(self) -> None:
        row = self._selected_row()
        if row is None:
            return
        question = f"Cancel job {row.id} ({row.owner}/{row.name}, {row.state})?"
        if row.owner != self.user:
            question += (f"\n\nIt belongs to {row.owner}: the controller refuses unless "
                         f"you ({self.user}) are a lab admin.")

        def answered(yes: bool | None) -> None:
            if yes:
                self._send(m.CancelRequest((row.id,)))
        self.push_screen(ConfirmScreen(question), answered)

    def action_hold(self) -> None:
        row = self._selected_row()
        if row is not None:
            self._send(m.HoldRequest((row.id,)))

    def action_release(self) -> None:
        row = self._selected_row()
        if row is not None:
            self._send(m.ReleaseRequest((row.id,)))

    def _send(self, request: m.JobsRequest) -> None:
        self.run_worker(lambda: self._act_in_thread(request), thread=True, group="act")

    def _act_in_thread(self, request: m.JobsRequest) -> None:
        try:
            results = self.act(request)
        except IadeepError as exc:
            results = [m.JobActionResult(job_id, error=exc) for job_id in request.ids]
        self.call_from_thread(self._acted, request.op, results)

    def _acted(self, op: str, results: list[m.JobActionResult]) -> None:
        for r in results:
            if r.error is not None:
                self.notify(f"{op} job {r.id}: {r.error.message}", title="refused",
                            severity="error", timeout=8)
            else:
                self.notify(f"job {r.id}: {r.state}", title=op)
        self.action_refresh_now()

    def action_details(self) -> None:
        row = self._selected_row()
        if row is not None:
            self.push_screen(JobDetailScreen(row.id, self.load_job, self.load_log, self.now))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_details()

    # ------------------------------------------------------------------ panes, filter, help
    def action_switch_pane(self) -> None:
        if self.screen is not self.screen_stack[0]:
            self.screen.focus_next()
            return
        cluster, queue = self.query_one("#cluster"), self.query_one("#queue")
        (queue if self.focused is cluster else cluster).focus()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("visible")
        box.value = self.query_text
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.query_text = event.input.value   # the box's value now, not at the keystroke
            self.render_view()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_filter(keep=True)

    def on_key(self, event) -> None:
        if event.key == "escape" and self.focused is self.query_one("#filter"):
            self._close_filter(keep=False)
            event.stop()

    def _close_filter(self, keep: bool) -> None:
        box = self.query_one("#filter", Input)
        if not keep:
            box.value = ""
            self.query_text = ""
            self.render_view()
        if not self.query_text:
            box.remove_class("visible")
        self.query_one("#queue").focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())
