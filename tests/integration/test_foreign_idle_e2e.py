"""Foreign idle GPU holders end to end: a real sshd node whose stand-in nvidia-smi lists a
process iadeep did not start on an idle GPU, a real controller process, a real webhook sink.
Held idle past ``idle_after``, it is reported to the admins once per spell and `status` shows
it until the GPU is busy again; it is never stopped.
"""
from __future__ import annotations

import json
import time

from helpers.controllers import cli, rounds_after, start_lab, wait_until
from helpers.sinks import HookSink

HOLDER = (4242, 1, 20480, "/opt/torch/.venv/bin/python3")   # pid, GPU, MiB, executable
LINE = "node01:1 held idle by pid 4242 (python3, 20.0 GiB) for "


def _foreign_notices(hook: HookSink) -> list[dict]:
    return [b for b in hook.got()[1] if b.get("event") == "foreign_idle"]


def test_a_foreign_process_holding_a_gpu_idle_is_reported_once_a_spell(sshd_cluster,
                                                                        tmp_path):
    cluster = sshd_cluster(1)
    node = cluster.node("node01")
    node.set_fake(gpus=2, util=0, foreign=[HOLDER])
    inventory = tmp_path / "nodes.yaml"
    with HookSink() as hook:
        inventory.write_text(
            f"lab:\n  poll_interval: 0.3\n  node_grace: 30\n  idle_after: 2\n"
            f"  admins: [{cluster.user}]\n  notify:\n    webhook: {hook.url}\n"
            + cluster.inventory_yaml())
        ctl = start_lab(cluster, tmp_path, inventory)
        try:
            home = ctl.home
            wait_until(lambda: _foreign_notices(hook), limit=120)
            first = _foreign_notices(hook)[0]
            assert first["text"].startswith("GPU " + LINE)
            assert first["text"].endswith("not an iadeep job (iadeep does not stop it)")
            assert first["gpu"]["node"] == "node01" and first["gpu"]["index"] == 1
            assert first["gpu"]["pid"] == 4242 and first["gpu"]["idle_s"] >= 2
            status = cli(home, "status", check=True).stdout
            assert LINE in status and status.count("held idle by") == 1
            assert "+1 foreign" in status            # the GPU line still counts it
            # many more idle polls: still one message for this spell
            rounds_after(home, time.time() + 4)
            assert len(_foreign_notices(hook)) == 1
            shown = json.loads(cli(home, "status", "--json", check=True).stdout)
            assert [(h["node"], h["gpu"], h["pid"]) for h in shown["foreign_idle"]] == [
                ("node01", 1, 4242)]
            # a restarted controller goes on with the recorded spell: not reported again
            ctl.stop()
            ctl.start()
            rounds_after(home, time.time() + 4)
            assert len(_foreign_notices(hook)) == 1
            assert LINE in cli(home, "status", check=True).stdout
            # busy again: the spell ends and status no longer shows it
            node.set_fake(gpus=2, util=60, foreign=[HOLDER])
            wait_until(lambda: "held idle by" not in cli(home, "status", check=True).stdout,
                       limit=120)
            assert len(_foreign_notices(hook)) == 1
            # idle again: a new spell, told once more after idle_after
            node.set_fake(gpus=2, util=0, foreign=[HOLDER])
            wait_until(lambda: len(_foreign_notices(hook)) == 2, limit=120)
            assert LINE in cli(home, "status", check=True).stdout
        finally:
            ctl.stop()
