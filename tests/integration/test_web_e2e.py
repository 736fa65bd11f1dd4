"""`iadeep web` in a real headless browser (Debian's Chromium driven by Selenium), in front of
a real controller with real sshd nodes: the page shows the nodes, a running job on its GPU, a
queued job with its reason and the impact factor, escapes what users typed, and follows the
cluster without being reloaded (a finished job leaves, the waiting one takes its GPU, a stopped
controller is said).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.controllers import (
    IADEEP,
    cli,
    env_for,
    fake_gpu_lab,
    jobs_by_id,
    queue_add,
    wait_jobs,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
NASTY = "<script>alert(1)</script>"

webdriver = pytest.importorskip("selenium.webdriver")
pytestmark = pytest.mark.skipif(
    not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (`make chromium` installs them)")


def _browser(profile: Path):
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def _web(home: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*IADEEP, "web", "--listen", "127.0.0.1:0"], env=env_for(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()     # "serving http://127.0.0.1:PORT/ (...)"
    assert line.startswith("serving http://"), (line, proc.stderr and proc.stderr.read())
    return proc, line.split()[1]


@pytest.fixture
def lab(sshd_cluster, tmp_path):
    with fake_gpu_lab(sshd_cluster, tmp_path, nodes=2) as ctl:
        yield ctl


def test_the_page_shows_the_cluster_escapes_names_and_follows_it(lab, tmp_path):
    home = lab.home
    long_job = str(ROOT / "jobs/steps_progress.sh")
    first = queue_add(home, long_job, "600", "0.1", "--exclusive", "--name", NASTY,
                      "--env", "SECRET=hunter2")
    second = queue_add(home, long_job, "600", "0.1", "--exclusive", "--name", "second")
    wait_jobs(home, lambda js: js[first]["state"] == js[second]["state"] == "running")
    waiting = queue_add(home, long_job, "600", "0.1", "--exclusive", "--name", "waiter")
    reason = wait_jobs(home, lambda js: js[waiting]["reason"])[waiting]["reason"]

    proc, url = _web(home)
    browser = _browser(tmp_path / "chromium-profile")
    try:
        raw = urllib.request.urlopen(url + "api/view").read().decode()
        assert "hunter2" not in raw and "SECRET" not in raw      # no env values, ever
        browser.get(url)
        by = webdriver.common.by.By

        def text_of(css: str) -> str:
            """The element's text, "" while the page has not drawn it (yet). The page redraws
            itself every few seconds: an element found just before a redraw is gone when its
            text is read (StaleElementReferenceException), which is "not yet" too."""
            from selenium.common.exceptions import StaleElementReferenceException

            found = browser.find_elements(by.CSS_SELECTOR, css)
            try:
                return found[0].text if found else ""
            except StaleElementReferenceException:
                return ""

        wait_until(lambda: all(text_of(f'[data-node="{n}"]') for n in lab.cluster.nodes))
        node_of = {j["id"]: j["node"] for j in json.loads(
            cli(home, "queue", "list", "--json", check=True).stdout)}
        chip = wait_until(lambda: text_of(f'[data-gpu="{node_of[first]}:0"] [data-job="{first}"]'))
        assert NASTY in chip            # shown as the characters typed, not run as markup
        assert len(browser.find_elements(by.TAG_NAME, "script")) == 1
        assert browser.execute_script("return document.querySelectorAll('.job script').length") \
            == 0
        assert "second" in wait_until(
            lambda: text_of(f'[data-gpu="{node_of[second]}:0"] [data-job="{second}"]'))
        def row_with_reason() -> str:
            """The waiter's row once it shows the job's reason of that moment (it changes as
            the round learns: a first reason of "no profile yet" goes once the label has one)."""
            now = jobs_by_id(home)[waiting]["reason"]
            row = text_of(f'#queue tr[data-job="{waiting}"]')
            return row if now and now in row else ""
        row = wait_until(row_with_reason)
        assert "waiter" in row and "queued" in row and reason
        assert wait_until(lambda: "last hour" in text_of("#impact"))     # the impact factor
        assert "impact" not in text_of("#banner")                        # ... once
        assert re.fullmatch(r"updated \d\d:\d\d:\d\d", text_of("#updated"))  # 24-hour
        assert "hunter2" not in browser.page_source
        if os.environ.get("IADEEP_WEB_SCREENSHOT"):       # docs/img/web.png is made this way
            browser.save_screenshot(os.environ["IADEEP_WEB_SCREENSHOT"])

        refreshed = int(browser.find_element(by.TAG_NAME, "body").get_attribute(
            "data-refreshed"))
        cli(home, "queue", "cancel", str(first), check=True)     # the page follows, unreloaded
        wait_until(lambda: not browser.find_elements(by.CSS_SELECTOR,
                                                     f'.gpu [data-job="{first}"]'), limit=120)
        wait_until(lambda: browser.find_elements(by.CSS_SELECTOR,
                                                 f'.gpu [data-job="{waiting}"]'), limit=120)
        assert int(browser.find_element(by.TAG_NAME, "body").get_attribute(
            "data-refreshed")) > refreshed

        lab.stop()                                   # the controller down: said, last state kept
        wait_until(lambda: "controller NOT running" in text_of("#banner"), limit=120)
        assert browser.find_elements(by.CSS_SELECTOR, f'.gpu [data-job="{waiting}"]')
    finally:
        browser.quit()
        proc.terminate()
        proc.wait(timeout=30)


def test_the_server_answers_only_reads(tmp_path):
    """No controller at all: the view says so; writes and unknown addresses are refused."""
    home = tmp_path / "state"
    home.mkdir()
    proc, url = _web(home)
    try:
        page = urllib.request.urlopen(url)
        assert "Content-Security-Policy" in page.headers
        assert "script-src 'sha256-" in page.headers["Content-Security-Policy"]
        view = json.loads(urllib.request.urlopen(url + "api/view").read())
        assert view["banner"]["level"] == "never" and view["nodes"] == []
        for method, path, code in (("POST", "api/view", 405), ("GET", "etc/passwd", 404)):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url + path, method=method,
                                                              data=b"" if method == "POST"
                                                              else None))
            assert err.value.code == code
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_bad_listen_address_is_one_line(tmp_path):
    proc = cli(tmp_path, "web", "--listen", "nowhere")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: --listen 'nowhere' is not HOST:PORT (hint:")
