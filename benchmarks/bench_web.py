"""How long `iadeep web` takes for 64 nodes x 8 GPUs and 2,000 queued jobs (the monitor's
"large" state, tests/helpers/seed.py).

Server side: one ``/api/view`` body (the monitor's view model plus its JSON), against the view
model alone (``tui.viewmodel.build_view``, what the terminal monitor computes every refresh) in
the same run. Browser side, when Debian's chromium, chromium-driver and Selenium are there: the
page's ``render`` of that body in headless Chromium (the DOM rebuilt, then laid out), against
rendering the empty cluster's body.

Usage: ``.venv/bin/python benchmarks/bench_web.py [--repeats 15]``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # helpers.seed


def _seeded(scenario: str):
    os.environ["IADEEP_HOME"] = tempfile.mkdtemp(prefix=f"bench-web-{scenario}-")
    from helpers import seed
    from iadeep_cli.tui import source

    seed.seed_state_dir(scenario)
    return source.fetch()


def _ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _browser_ms(bodies: dict[str, str], repeats: int) -> dict[str, float] | None:
    """Median ms of the page's render() per body, in headless Chromium; None without one."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    from iadeep_cli.web.server import serve

    server = serve("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = Options()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={tempfile.mkdtemp(prefix='bench-web-chromium-')}"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options,
                               service=Service(shutil.which("chromedriver")))
    try:
        browser.set_script_timeout(600)
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/")
        out = {}
        for name, body in bodies.items():
            times = browser.execute_script("""
                const v = JSON.parse(arguments[0]), n = arguments[1], out = [];
                for (let i = 0; i < n; i++) {
                  const t0 = performance.now();
                  render(v);
                  document.body.offsetHeight;          // force the layout
                  out.push(performance.now() - t0);
                }
                return out;""", body, repeats)
            out[name] = statistics.median(times)
        return out
    finally:
        browser.quit()
        server.shutdown()
        server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    from helpers import seed
    from iadeep_cli.tui import viewmodel as vm
    from iadeep_cli.web import view as webview

    large, empty = _seeded("large"), _seeded("empty")
    print(f"{len(large.status.nodes)} nodes, "
          f"{sum(len(n.gpus) for n in large.status.nodes)} GPUs, {len(large.jobs)} jobs")
    view_s, body_s = [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        vm.build_view(large, seed.NOW + i)
        t1 = time.perf_counter()
        body = json.dumps(webview.snapshot(large, seed.NOW + i))
        body_s.append(time.perf_counter() - t1)
        view_s.append(t1 - t0)
    print(f"view model alone (baseline): {_ms(view_s):7.1f} ms")
    print(f"/api/view body:              {_ms(body_s):7.1f} ms "
          f"({_ms(body_s) / _ms(view_s):.2f}x the view model; {len(body) / 1e6:.2f} MB)")
    bodies = {"empty": json.dumps(webview.snapshot(empty, seed.NOW)), "large": body}
    rendered = _browser_ms(bodies, args.repeats)
    if rendered is None:
        print("browser render: skipped (needs chromium, chromium-driver and selenium)")
    else:
        print(f"browser render, empty cluster (baseline): {rendered['empty']:7.1f} ms")
        print(f"browser render, large:                    {rendered['large']:7.1f} ms")


if __name__ == "__main__":
    main()
