"""`iadeep --version` prints the installed version, which is the package's own."""
import subprocess
import sys
from importlib import metadata

import iadeep_cli


def test_version_prints_the_installed_version():
    r = subprocess.run([sys.executable, "-m", "iadeep_cli", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"iadeep {metadata.version('iadeep')}\n", "")
    # pyproject.toml takes the version from the package, so the two never disagree
    assert metadata.version("iadeep") == iadeep_cli.__version__


def test_version_is_in_the_help():
    r = subprocess.run([sys.executable, "-m", "iadeep_cli", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--version" in r.stdout
