"""Inventory validation: every mistake names the file, the line and the field."""
import re
from pathlib import Path

import pytest

from iadeep_cli.errors import ConfigError
from iadeep_cli.inventory import load_inventory, parse_inventory

ROOT = Path(__file__).resolve().parents[2]


def test_example_inventory_is_valid_and_complete():
    inv = load_inventory(ROOT / "nodes.yaml.example")
    assert [n.name for n in inv.nodes] == ["head", "gpu1", "gpu2"]
    head, gpu1, _ = inv.nodes
    assert head.local and head.gpus == (0, 1)
    assert gpu1.port == 22 and gpu1.user == "iadeep-jobs" and gpu1.max_jobs_per_gpu == 3
    assert inv.admins == ("pi", "sysadmin")
    assert inv.policy.share_threshold == 1.1 and inv.policy.max_jobs_per_gpu == 3
    assert inv.policy.reserve_after_s == 3600
    assert inv.user_limits["student1"].max_gpus == 4
    assert inv.is_admin("pi") and not inv.is_admin("student1")


def test_example_inventory_shares_no_home_where_jobs_run_as_the_ssh_account():
    """A job submitted below a shared path runs there (and its relative --output lands
    there): on a node whose jobs run as its SSH account, users' homes are not that account's
    to write, so a lab copying the example must not get /home shared on such a node (its
    members' --output would fail every job)."""
    def covers_home(path: str) -> bool:
        return path == "/" or path.rstrip("/") == "/home" or path.startswith("/home/")

    inv = load_inventory(ROOT / "nodes.yaml.example")
    wrong = {n.name: n.shared_paths for n in inv.nodes
             if not n.submitter and any(covers_home(p) for p in n.shared_paths)}
    assert wrong == {}
    assert [n.name for n in inv.nodes if not n.submitter] == ["head", "gpu1"]


def test_example_inventory_shows_every_field():
    """nodes.yaml.example is the reference for the inventory: every field the parser knows is
    in it (a new field must be documented there), and nothing it shows is unknown."""
    import yaml

    from iadeep_cli import inventory

    data = yaml.safe_load((ROOT / "nodes.yaml.example").read_text())
    shown = {
        "lab": set(data["lab"]), "lab.policy": set(data["lab"]["policy"]),
        "lab.user_limits.*": set().union(*map(set, data["lab"]["user_limits"].values())),
        "nodes[*]": set().union(*map(set, data["nodes"])),
        "lab.notify": set(data["lab"]["notify"]),
        "lab.policy.fairshare": set(data["lab"]["policy"]["fairshare"]),
        "lab.metrics": set(data["lab"]["metrics"]),
    }
    text = (ROOT / "nodes.yaml.example").read_text()
    # the keys self-tuning may change are shown commented out (written, they are pinned)
    shown["lab.policy"] |= set(re.findall(r"^    # (\w+): ", text, re.M)) & set(
        inventory.TUNABLE_KEYS)
    # files only the lab's machine has are shown commented out too (written, they must exist)
    shown["lab.notify"] |= set(re.findall(r"^    # (\w+): ", text, re.M)) & {"login_file",
                                                                            "ca_file"}
    assert shown == {"lab": set(inventory._LAB_FIELDS), "lab.policy": set(inventory._POLICY_FIELDS),
                     "lab.notify": set(inventory._NOTIFY_FIELDS),
                     "lab.policy.fairshare": set(inventory._FAIRSHARE_FIELDS),
                     "lab.metrics": set(inventory._METRICS_FIELDS),
                     "lab.user_limits.*": set(inventory._LIMIT_FIELDS),
                     "nodes[*]": set(inventory._NODE_FIELDS)}
    assert "WORKDIR/<install id>/<node>/jobs/<id>/" in text   # runtime._scoped_workdirs
    assert "WORKDIR/jobs/ID" not in text


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_inventory(text, Path("lab/nodes.yaml"))
    return info.value.message


@pytest.mark.parametrize("text, expected", [
    ("nodes:\n  - name: a\n    host: h\n    prot: 22\n",
     "lab/nodes.yaml:4: nodes[0].prot: unknown key 'prot'"),
    ("nodes:\n  - name: a\n    host: h\n    port: twenty\n",
     "lab/nodes.yaml:4: nodes[0].port: expected an integer, got 'twenty'"),
    ("nodes:\n  - name: a\n    host: h\n  - name: a\n    host: i\n",
     "lab/nodes.yaml:4: nodes[1].name: duplicate node name 'a' (also nodes[0])"),
    ("nodes:\n  - host: h\n", "lab/nodes.yaml:2: nodes[0].name: missing"),
    ("lab:\n  admins: alice\n", "lab/nodes.yaml:2: lab.admins: expected a list of strings"),
    ("lab:\n  policy:\n    min_speed: -1\n", "lab/nodes.yaml:3: lab.policy.min_speed: expected"),
    ("lab:\n  poll_interval: yes\n", "lab/nodes.yaml:2: lab.poll_interval: expected a number"),
    ("nodes:\n  - name: a\n    host: h\n    gpus: [0, x]\n", "lab/nodes.yaml:4: nodes[0].gpus[1]"),
    ("nodes:\n  - name: a\n    host: h\n    local: 1\n",
     "lab/nodes.yaml:4: nodes[0].local: expected true or false"),
    ("clusters: []\n", "lab/nodes.yaml:1: clusters: unknown key"),
    ("nodes: [\n", "lab/nodes.yaml:2: not valid YAML"),
    ("nodes:\n  - name: a\n    host: h\n    port: !!int abc\n",
     "lab/nodes.yaml:4: nodes[0].port: cannot read value 'abc'"),
    ("nodes:\n  - name: a\n    host: h\n    port: !custom 1\n",
     "lab/nodes.yaml:4: nodes[0].port: cannot read value '1'"),
])
def test_bad_inventory_names_file_line_and_field(text, expected):
    assert _error(text).startswith(expected)


def _node(**fields) -> str:
    """One node's YAML with ``fields`` added to a valid name and host (line 4 onwards)."""
    extra = "".join(f"    {k}: {v}\n" for k, v in fields.items())
    return f"nodes:\n  - name: a\n    host: h\n{extra}"


@pytest.mark.parametrize("text, expected", [
    # every field's range; the message says what is allowed
    (_node(port=99999), "4: nodes[0].port: expected a port number from 1 to 65535, got 99999"),
    (_node(port=0), "4: nodes[0].port: expected a port number from 1 to 65535, got 0"),
    ("nodes:\n  - name: a/b\n    host: h\n", "2: nodes[0].name: expected a name of letters"),
    ("nodes:\n  - name: ..\n    host: h\n", "2: nodes[0].name: expected a name of letters"),
    ("nodes:\n  - name: a\n    host: ''\n", "3: nodes[0].host: expected a non-empty value"),
    ("nodes:\n  - name: a\n    host: a b\n", "3: nodes[0].host: expected a non-empty value"),
    ("nodes:\n  - name: a\n    host: -oProxyCommand=x\n", "3: nodes[0].host: expected"),
    (_node(user="''"), "4: nodes[0].user: expected a non-empty value without spaces"),
    (_node(identity_file="''"), "4: nodes[0].identity_file: expected a path to a private key"),
    (_node(gpus="[-1]"), "4: nodes[0].gpus[0]: expected a GPU index >= 0, got -1"),
    (_node(gpus="[0, 1, 0]"), "4: nodes[0].gpus[2]: 0 is listed twice"),
    (_node(gpus=0), "4: nodes[0].gpus: expected a list of GPU indices"),
    (_node(labels="[h200, h200]"), "4: nodes[0].labels[1]: 'h200' is listed twice"),
    (_node(labels="['']"), "4: nodes[0].labels[0]: expected a non-empty value"),
    (_node(max_jobs_per_gpu=0), "4: nodes[0].max_jobs_per_gpu: expected a whole number >= 1, "
                                "got 0"),
    (_node(workdir="~alice/x"), "4: nodes[0].workdir: expected a directory path (absolute, "
                                "~/..., or relative to the node's home), got '~alice/x'"),
    (_node(workdir="''"), "4: nodes[0].workdir: expected a directory path"),
    ("lab:\n  admins: [pi, pi]\n", "2: lab.admins[1]: 'pi' is listed twice"),
    ("lab:\n  admins: ['a b']\n", "2: lab.admins[0]: expected a non-empty value without"),
    ("lab:\n  poll_interval: 0\n", "2: lab.poll_interval: expected seconds >= 0.1, got 0"),
    ("lab:\n  poll_interval: 0.05\n", "2: lab.poll_interval: expected seconds >= 0.1, got 0.05"),
    ("lab:\n  node_grace: 0\n", "2: lab.node_grace: expected seconds > 0, got 0"),
    ("lab:\n  poll_interval: 30\n  node_grace: 20\n",
     "3: lab.node_grace: expected seconds >= lab.poll_interval (30), got 20"),
    ("lab:\n  poll_interval: 90\n",        # the default grace is 60 s
     "2: lab.poll_interval: expected seconds <= lab.node_grace (60), got 90"),
    ("lab:\n  default_retries: -1\n", "2: lab.default_retries: expected a whole number >= 0, "
                                       "got -1"),
    ("lab:\n  policy:\n    sharing: fast\n",
     "3: lab.policy.sharing: expected one of jct, threshold (how sharing is judged), got"),
    ("lab:\n  policy:\n    share_threshold: 0.9\n",
     "3: lab.policy.share_threshold: expected a number >= 1.0"),
    ("lab:\n  policy:\n    min_speed: 5\n",
     "3: lab.policy.min_speed: expected a speed in (0, 1] (1.0: never slowed), got 5"),
    ("lab:\n  policy:\n    min_speed: 0\n", "3: lab.policy.min_speed: expected a speed in (0, 1]"),
    ("lab:\n  policy: {max_jobs_per_gpu: 0}\n",
     "2: lab.policy.max_jobs_per_gpu: expected a whole number >= 1, got 0"),
    ("lab:\n  policy:\n    memory_margin_gib: -1\n",
     "3: lab.policy.memory_margin_gib: expected a number >= 0, got -1"),
    ("lab:\n  policy:\n    aging_per_hour: -0.5\n",
     "3: lab.policy.aging_per_hour: expected a number >= 0, got -0.5"),
    ("lab:\n  policy:\n    reserve_after_s: -1\n",
     "3: lab.policy.reserve_after_s: expected a number >= 0, got -1"),
    ("lab:\n  policy:\n    preemption: always\n",
     "3: lab.policy.preemption: expected one of off, las (whether plan() may preempt --requeue "
     "jobs), got 'always'"),
    ("lab:\n  policy:\n    preemption: yes\n",
     "3: lab.policy.preemption: expected one of off, las"),
    ("lab:\n  policy:\n    preempt_grace: 0\n",
     "3: lab.policy.preempt_grace: expected a duration from 1 s to 1 day, got 0"),
    ("lab:\n  policy:\n    preempt_grace: 2d\n",
     "3: lab.policy.preempt_grace: expected a duration from 1 s to 1 day, got 172800"),
    ("lab:\n  policy:\n    cold_start: sometimes\n",
     "3: lab.policy.cold_start: expected one of share, alone (how a program with no profile "
     "yet is profiled), got"),
    ("lab:\n  user_limits:\n    'a b': {max_gpus: 1}\n",
     "3: lab.user_limits: expected a non-empty value without spaces"),
    ("lab:\n  user_limits:\n    alice: {max_gpus: -1}\n",
     "3: lab.user_limits.alice.max_gpus: expected a whole number >= 0, got -1"),
    ("lab:\n  user_limits:\n    alice: {max_jobs: 1.5}\n",
     "3: lab.user_limits.alice.max_jobs: expected an integer, got 1.5"),
])
def test_out_of_range_values_are_refused(text, expected):
    assert _error(text).startswith(f"lab/nodes.yaml:{expected}")


def test_values_at_the_edges_of_their_ranges_are_accepted():
    inv = parse_inventory(
        "lab:\n  poll_interval: 0.1\n  node_grace: 0.1\n  default_retries: 0\n"
        "  policy: {share_threshold: 1, min_speed: 1, max_jobs_per_gpu: 1, memory_margin_gib: 0,"
        " aging_per_hour: 0, reserve_after_s: 0}\n"
        "  user_limits: {guest: {max_gpus: 0, max_jobs: 0}}\n"
        "nodes:\n  - {name: A-1.x_y, host: '::1', port: 1, gpus: [], workdir: '~'}\n"
        "  - {name: b, host: h, port: 65535, max_jobs_per_gpu: 1, workdir: scratch/w}\n",
        Path("n.yaml"))
    assert inv.poll_interval_s == inv.node_grace_s == 0.1
    assert inv.policy.min_speed == 1 and inv.user_limits["guest"].max_gpus == 0
    assert [n.port for n in inv.nodes] == [1, 65535] and inv.nodes[0].gpus == ()


def test_preemption_is_off_by_default_and_read_as_written():
    default = parse_inventory("lab: {}\nnodes: []\n", Path("n.yaml")).policy
    assert (default.preemption, default.preempt_grace_s) == ("off", 300.0)
    for text, expected in (("off", ("off", 300.0)), ("las", ("las", 300.0))):
        policy = parse_inventory(f"lab:\n  policy:\n    preemption: {text}\n"
                                 "    preempt_grace: 90s\nnodes: []\n", Path("n.yaml")).policy
        assert (policy.preemption, policy.preempt_grace_s) == (expected[0], 90.0)
    example = load_inventory(ROOT / "nodes.yaml.example").policy
    assert (example.preemption, example.preempt_grace_s) == ("off", 300.0)


def test_cold_start_shares_by_default_and_alone_is_read_as_written():
    default = parse_inventory("lab: {}\nnodes: []\n", Path("n.yaml")).policy
    assert default.cold_start == "share"
    alone = parse_inventory("lab:\n  policy:\n    cold_start: alone\nnodes: []\n",
                            Path("n.yaml")).policy
    assert alone.cold_start == "alone"


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_inventory(tmp_path / "nodes.yaml")
    assert "inventory file not found" in info.value.message
    assert "--inventory" in info.value.hint


def test_unreadable_file(tmp_path):
    (tmp_path / "dir.yaml").mkdir()  # readable by nobody as a file, even root
    with pytest.raises(ConfigError, match="cannot read inventory"):
        load_inventory(tmp_path / "dir.yaml")


def test_lookup_order(tmp_path, monkeypatch):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "nodes.yaml").write_text("nodes:\n  - name: fromstate\n    host: h\n")
    (tmp_path / "env.yaml").write_text("nodes:\n  - name: fromenv\n    host: h\n")
    monkeypatch.setenv("IADEEP_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("IADEEP_INVENTORY", raising=False)
    assert load_inventory().nodes[0].name == "fromstate"
    monkeypatch.setenv("IADEEP_INVENTORY", str(tmp_path / "env.yaml"))
    assert load_inventory().nodes[0].name == "fromenv"
    explicit = tmp_path / "x.yaml"
    explicit.write_text("nodes:\n  - name: explicit\n    host: h\n")
    assert load_inventory(explicit).nodes[0].name == "explicit"


def test_empty_inventory_is_an_empty_cluster(tmp_path):
    assert parse_inventory("", tmp_path / "n.yaml").nodes == ()


@pytest.mark.parametrize("text, expected", [
    (_node(run_as="sudo"), "lab/nodes.yaml:4: nodes[0].run_as: expected account or submitter"),
    (_node(run_as="submitter"), "lab/nodes.yaml:2: nodes[0].run_as: run_as: submitter needs "
                                "allowed_users or allowed_group"),
    (_node(run_as="submitter", local="true", allowed_group="lab"),
     "lab/nodes.yaml:2: nodes[0].run_as: run_as: submitter is not supported for a local node"),
    ("lab:\n  allowed_users: [alice, root]\n", "lab/nodes.yaml:2: lab.allowed_users[1]: "
                                               "expected an account name"),
    ("lab:\n  allowed_group: root\n", "lab/nodes.yaml:2: lab.allowed_group: expected an "
                                      "account name"),
    ("lab:\n  allowed_users: ['a;b']\n", "lab/nodes.yaml:2: lab.allowed_users[0]: expected"),
])
def test_bad_run_as_settings_are_refused(text, expected):
    assert _error(text).startswith(expected)


def test_run_as_defaults_come_from_the_lab_and_nodes_override_them():
    inv = parse_inventory(
        "nodes:\n  - name: a\n    host: h\n  - name: b\n    host: h\n    run_as: account\n"
        "  - name: c\n    host: h\n    allowed_users: [carol]\n"
        "lab:\n  run_as: submitter\n  allowed_users: [alice, bob]\n  allowed_group: gpu-lab\n",
        Path("n.yaml"))
    a, b, c = inv.nodes
    assert (a.submitter, a.allowed_users, a.allowed_group) == (True, ("alice", "bob"), "gpu-lab")
    assert not b.submitter and c.submitter and c.allowed_users == ("carol",)
    assert not parse_inventory(_node(), Path("n.yaml")).nodes[0].submitter   # as before
def _notify(**fields) -> str:
    """A lab.notify section with ``fields`` (line 3 onwards)."""
    return "lab:\n  notify:\n" + "".join(f"    {k}: {v}\n" for k, v in fields.items())


MAIL = {"smtp": "mail:25", "address": "'{user}@lab.example.org'"}


@pytest.mark.parametrize("text, expected", [
    (_notify(default="sometimes"), "3: lab.notify.default: expected one of end, fail, all, "
                                   "none, got 'sometimes'"),
    (_notify(smtp="mail"), "3: lab.notify.smtp: expected host:port of an SMTP server"),
    (_notify(smtp="mail:0"), "3: lab.notify.smtp: expected host:port"),
    (_notify(smtp="mail:smtp"), "3: lab.notify.smtp: expected host:port"),
    (_notify(smtp="'a b:25'"), "3: lab.notify.smtp: expected host:port"),
    (_notify(smtp="mail:25"), "3: lab.notify.smtp: e-mail needs users' addresses"),
    (_notify(address="'{user}@x.org'"), "3: lab.notify.address: e-mail settings need the SMTP "
                                        "server"),
    (_notify(smtp="m:25", address="'{name}@x.org'"),
     "4: lab.notify.address: expected an address pattern with {user} as its only field"),
    (_notify(smtp="m:25", address="alice@x.org"), "4: lab.notify.address: expected an address "
                                                  "pattern"),
    (_notify(smtp="m:25", address="'{user}'"), "4: lab.notify.address: expected an address"),
    (_notify(smtp="m:25", address="'{user'"), "4: lab.notify.address: cannot read pattern"),
    (_notify(smtp="m:25", addresses="{bob: 'not an address'}"),
     "4: lab.notify.addresses.bob: expected one e-mail address"),
    (_notify(smtp="m:25", addresses="{bob: 'a@x.org, c@y.org'}"),
     "4: lab.notify.addresses.bob: expected one e-mail address"),
    (_notify(smtp="m:25", addresses="[bob]"), "4: lab.notify.addresses: expected a mapping"),
    (_notify(**MAIL, **{"from": "'x <y@z>'"}), "5: lab.notify.from: expected one e-mail address"),
    (_notify(webhook="ftp://x/y"), "3: lab.notify.webhook: expected an http:// or https:// URL"),
    (_notify(webhook="hooks.slack.com/x"), "3: lab.notify.webhook: expected an http"),
    (_notify(webhook="'http://x:99999/'"), "3: lab.notify.webhook: expected an http"),
    (_notify(default="end"), "3: lab.notify.default: a default other than none needs a channel"),
    (_notify(sms="yes"), "3: lab.notify.sms: unknown key 'sms' (allowed: address, addresses, "
                         "ca_file, default, from, login_file, smtp, tls, webhook, "
                         "webhook_format)"),
    (_notify(**MAIL, tls="ssl"), "5: lab.notify.tls: "),
    (_notify(webhook_format="teams"), "3: lab.notify.webhook_format: needs webhook: URL"),
])
def test_bad_notify_settings_name_file_line_and_field(text, expected):
    assert _error(text).startswith(f"lab/nodes.yaml:{expected}")


def test_notify_settings_find_each_users_address():
    inv = parse_inventory(_notify(default="fail", smtp="'[::1]:2525'",
                                  address="'{user}@lab.example.org'",
                                  addresses="{pi: boss@example.org}", **{"from": "q@lab.org"}),
                          Path("n.yaml"))
    n = inv.notify
    assert (n.default, n.smtp, n.sender, n.webhook) == ("fail", ("::1", 2525), "q@lab.org", None)
    assert n.email_for("alice") == "alice@lab.example.org"
    assert n.email_for("pi") == "boss@example.org"   # the map first
    only_map = parse_inventory(_notify(smtp="m:25", addresses="{pi: p@x.org}"), Path("n.yaml"))
    assert only_map.notify.email_for("alice") is None and not only_map.notify.reaches("alice")
    hook = parse_inventory(_notify(default="all", webhook="http://127.0.0.1:8080/hook"),
                           Path("n.yaml")).notify
    assert hook.reaches("anyone") and hook.email_for("anyone") is None
    assert parse_inventory("nodes: []\n", Path("n.yaml")).notify.default == "none"


def test_shared_paths_per_node_or_from_the_lab():
    inv = parse_inventory("lab:\n  shared_paths: [/home, /data]\nnodes:\n"
                          "  - {name: a, host: a}\n  - {name: b, host: b, shared_paths: []}\n"
                          "  - {name: c, host: c, shared_paths: [/nfs]}\n", Path("n.yaml"))
    assert [n.shared_paths for n in inv.nodes] == [("/home", "/data"), (), ("/nfs",)]
    with pytest.raises(ConfigError, match=r"n.yaml:3: nodes\[0\].shared_paths\[0\]: expected "
                                          "an absolute directory path"):
        parse_inventory("nodes:\n  - name: a\n    shared_paths: [home]\n    host: a\n",
                        Path("n.yaml"))


@pytest.mark.parametrize("line, expected", [
    ("idle_action: kill", "lab/nodes.yaml:2: lab.idle_action: expected notify or requeue or "
                          "cancel, got 'kill'"),
    ("idle_after: 0", "lab/nodes.yaml:2: lab.idle_after: expected a duration > 0 (e.g. 30m), "
                      "got 0"),
    ("idle_util: 100", "lab/nodes.yaml:2: lab.idle_util: expected a GPU utilisation in % "
                       "(0-99), got 100"),
])
def test_idle_settings_are_checked_where_written(line, expected):
    assert _error(f"lab:\n  {line}\nnodes: []\n") == expected


def test_idle_settings_default_and_parse():
    inv = parse_inventory("nodes: []\n", Path("n.yaml"))
    assert (inv.idle.after_s, inv.idle.action, inv.idle.util) == (1800.0, "notify", 5.0)
    inv = parse_inventory("lab:\n  idle_after: 2h\n  idle_action: requeue\n  idle_util: 1\n"
                          "nodes: []\n", Path("n.yaml"))
    assert (inv.idle.after_s, inv.idle.action, inv.idle.util) == (7200.0, "requeue", 1.0)


def test_the_example_pins_nothing_so_a_copied_inventory_is_self_tuned():
    """A lab that copies nodes.yaml.example as it is gets self-tuning: the keys it may change
    are shown commented out, since a key written there is pinned."""
    policy = load_inventory(ROOT / "nodes.yaml.example").policy
    assert policy.self_tune and policy.pinned == ()
