"""The documentation stays true to the code: the command reference is the CLI's own, the Grafana
dashboard asks only for series the controller exports, and the README stays a front page
(short, no internal issue numbers) with every page of the docs site one link away."""
from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest
import typer

from cli_reference import (
    COMMAND,
    REFERENCE,
    generate,
    outline_of_cli,
    outline_of_reference,
    recorded_version,
)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_cli_reference_matches_the_cli(tmp_path):
    """Word for word, with the typer version that wrote the checked-in file (its first line)."""
    checked_in = REFERENCE.read_text()
    version = recorded_version(checked_in)
    if version != typer.__version__:
        pytest.skip(f"exact text not compared: docs/reference/cli.md was written by typer "
                    f"{version} and this environment has typer {typer.__version__}, whose "
                    f"generator words the same CLI differently; its commands, arguments and "
                    f"options are still compared (test_cli_reference_lists_the_cli). Run "
                    f"`{COMMAND}` with the project's typer to compare the text")
    fresh = tmp_path / "cli.md"
    generate(fresh)
    assert fresh.read_text() == checked_in, (
        f"docs/reference/cli.md is out of date with the CLI: run `{COMMAND}` and commit it")


def test_cli_reference_lists_the_cli():
    """Whatever typer is installed: every command, argument and option of the CLI is in the
    reference, and nothing the CLI no longer has."""
    documented = outline_of_reference(REFERENCE.read_text())
    actual = outline_of_cli()
    assert len(actual) > 30 and sum(len(c["options"]) for c in actual.values()) > 100
    empty: dict[str, set[str]] = {}
    stale = {name: {k: sorted(documented.get(name, empty).get(k, set())
                              ^ actual.get(name, empty).get(k, set()))
                    for k in ("arguments", "options", "commands")}
             for name in documented.keys() | actual.keys()
             if documented.get(name) != actual.get(name)}
    assert stale == {}, (f"docs/reference/cli.md is out of date with the CLI (differences per "
                         f"command): run `{COMMAND}` and commit it")


def _exported_series() -> set[str]:
    source = (REPO / "iadeep_cli" / "controller" / "requests" / "metrics.py").read_text()
    return set(re.findall(r'"(iadeep_[a-z_]+)"', source))


def test_grafana_dashboard_uses_only_exported_series():
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|sum|count|total)$", "", name)   # a counter's family: no _total
            for e in exprs for name in re.findall(r"\biadeep_[a-z_]+", e)}
    exported = _exported_series()
    assert len(exported) > 20   # the collector's names were found at all
    assert used - exported == set()
    assert not {n for n in used if n.endswith("_hours")}   # base units (promtool's rule)
    # every family the collector exports has a panel, except those a table reads better and
    # the deprecated GPU-hour twins of the *_gpu_seconds gauges (lab.metrics.legacy_hours)
    assert exported - used <= {"iadeep_controller_start_time_seconds", "iadeep_gpu_info",
                               "iadeep_node_state", "iadeep_node_reachable",
                               "iadeep_work_gpu_hours", "iadeep_busy_gpu_hours",
                               "iadeep_idle_gpu_hours"}


def test_readme_is_a_front_page_linking_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "make demo" in readme and "make test" in readme   # CI and the quick start use them
    pages = {p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md")} - {"docs/index.md"}
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", readme))
    assert pages - linked == set()



def test_site_front_page_is_the_readme():
    """docs/index.md is README.md with its links made relative to docs/ (`docs/x.md` ->
    `x.md`), nothing else: a copy edited by hand drifts."""
    readme = (REPO / "README.md").read_text()
    expected = re.sub(r"\]\(docs/", "](", readme)
    index = (DOCS / "index.md").read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(keepends=True),
                                        index.splitlines(keepends=True),
                                        "README.md (links rewritten)", "docs/index.md", n=1))
    assert index == expected, (
        "docs/index.md differs from README.md; edit README.md, then run "
        f"`sed 's#](docs/#](#g' README.md > docs/index.md`:\n{diff}")


def test_monitor_screenshot_is_a_current_snapshot():
    """docs/monitor.svg is a copy of one of the monitor's snapshot SVGs as they are now (they
    change with the rendering; a screenshot drawn once goes stale)."""
    shot = (DOCS / "monitor.svg").read_bytes()
    snapshots = {p.name: p.read_bytes()
                 for p in (REPO / "tests" / "tui" / "__snapshots__").rglob("*.svg")}
    assert snapshots, "no monitor snapshots found"
    assert shot in snapshots.values(), (
        "docs/monitor.svg is none of tests/tui/__snapshots__/*/*.svg: copy "
        "test_busy_cluster_shared_gpus_120x40.svg over it (see docs/getting-started.md)")

@pytest.mark.parametrize("path", ["README.md", *sorted(
    p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md"))])
def test_no_internal_issue_numbers(path):
    text = (REPO / path).read_text()
    found = re.findall(r"(?i)\b(?:issue|ticket) #?\d+|\bthe issue\b|\bas the issue\b", text)
    assert found == [], f"{path}: {found}"
