"""A lab installs iadeep from a built wheel, not from a clone: build the wheel from the source
files, install it into a fresh virtualenv outside the repository (its dependencies from the
package index, as pip or pipx would), and run the installed `iadeep` from a directory that is
not the repository. It finds its shipped data, the monitor's stylesheet and the web page's
files inside the wheel.

Cost on the 2-core machine: 55-82 s in four runs under other load (docs/administration.md),
most of it pip unpacking numpy and scipy into the new environment.
"""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import iadeep_cli

# One environment for the module's tests: under xdist they all run in the same worker.
pytestmark = pytest.mark.xdist_group("wheel_install")

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "iadeep_cli"
# The sim's policies, in its table's order (iadeep_cli/sim/policies.py DEFAULT_POLICIES)
POLICIES = ["exclusive", "packing", "random", "tiresias", "gandiva", "lucid", "iadeep", "oracle"]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, (f"{cmd[:4]}... exit {r.returncode}\n{r.stdout[-2000:]}\n"
                              f"{r.stderr[-4000:]}")
    return r


def _package_files() -> list[str]:
    """Every file the package holds that is not Python source: what it reads at run time."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*") if p.is_file()
                  and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the fresh environment's bin directory, an environment for running it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # The source as an sdist would carry it (no .git, no .venv, no build leftovers).
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(PACKAGE, src / "iadeep_cli",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "-q", "--no-deps", str(src), "-w", str(tmp / "dist")])
    wheels = list((tmp / "dist").glob("iadeep-*.whl"))
    assert [w.name for w in wheels] == [f"iadeep-{iadeep_cli.__version__}-py3-none-any.whl"]

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    # this pip installs into it (--python): the new environment gets only iadeep and what it
    # declares; no .pyc compiled for numpy and scipy, which is most of the install's time
    _run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile",
          str(wheels[0])])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(tmp), IADEEP_HOME=str(tmp / "state"), PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    return venv / "bin", env


def _in_fresh_venv(installed, *args: str) -> subprocess.CompletedProcess:
    bin_dir, env = installed
    return _run([str(bin_dir / args[0]), *args[1:]], cwd=env["HOME"], env=env)


def test_installed_copy_is_the_wheels_not_the_repository(installed):
    r = _in_fresh_venv(installed, "python", "-c",
                       "import iadeep_cli, importlib.metadata as m; print(iadeep_cli.__file__); "
                       "print(m.version('iadeep'))")
    where, version = r.stdout.split()
    assert Path(where).is_relative_to(installed[0].parent) and not Path(where).is_relative_to(REPO)
    assert version == iadeep_cli.__version__
    # every data file and stylesheet of the package is in the installed copy
    site = Path(where).parent
    assert [f for f in _package_files() if not (site / f).is_file()] == []
    assert {"data/h200/pairs.csv", "tui/monitor.tcss", "web/static/page.html",
            "web/static/page.js", "web/static/page.css"} <= set(_package_files())


def test_version_from_the_installed_wheel(installed):
    r = _in_fresh_venv(installed, "iadeep", "--version")
    assert r.stdout == f"iadeep {iadeep_cli.__version__}\n" and r.stderr == ""


def test_sim_runs_on_the_shipped_data_from_the_installed_wheel(installed):
    r = _in_fresh_venv(installed, "iadeep", "sim")
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:2 + len(POLICIES)]] == POLICIES
    # the model was fitted on the H200 measurements shipped inside the wheel
    with (PACKAGE / "data" / "h200" / "pairs.csv").open() as f:
        pairs = sum(1 for row in csv.reader(f) if row and not row[0].startswith("#")) - 1
    with (PACKAGE / "data" / "h200" / "profiles.csv").open() as f:
        workloads = sum(1 for row in csv.reader(f) if row and not row[0].startswith("#")) - 1
    assert (f"300 jobs, load 1.2, seed 0; 8 GPUs; model: fitted on {pairs} distinct pairs "
            f"of {workloads} workloads (NVIDIA H200)") in r.stdout
    assert "iadeep's average JCT: " in lines[-1]


def test_monitor_starts_with_its_stylesheet_from_the_installed_wheel(installed):
    """The monitor, headless (Textual's run_test), from the installed copy: its stylesheet is
    the wheel's monitor.tcss and applies (the queue's round border is set only there)."""
    script = textwrap.dedent("""
        import asyncio
        from iadeep_cli.tui.app import MonitorApp

        async def main():
            app = MonitorApp(auto_refresh=False)
            async with app.run_test() as pilot:
                await pilot.pause()
                print(app.query_one("#queue").styles.border_top[0])
                print("\\n".join(sorted({str(path) for path, _ in app.stylesheet.source})))

        asyncio.run(main())
    """)
    r = _in_fresh_venv(installed, "python", "-c", script)
    border, *sources = r.stdout.splitlines()
    assert border == "round"
    assert [s for s in sources if s.endswith("monitor.tcss")] == [
        str(installed[0].parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
            / "site-packages" / "iadeep_cli" / "tui" / "monitor.tcss")]


def test_installed_dependencies_are_consistent(installed):
    """pip's own check: every installed package's requirements are met in the new environment."""
    bin_dir, env = installed
    _run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "check"],
         cwd=env["HOME"], env=env)
