"""``iadeep nodes``: check that every node answers, and trust a node's SSH host key."""
from __future__ import annotations

import os
import pwd
import shlex

import typer

from ..errors import ConfigError, IadeepError
from ..paths import StateDir, iadeep_home_set
from ..snapshot import to_dict
from . import complete, render

app = typer.Typer(help="Check nodes and trust their SSH host keys.", no_args_is_help=True)

INVENTORY = typer.Option(None, "--inventory", "-i", help="nodes.yaml (default: $IADEEP_INVENTORY "
                                                          "or the state dir's nodes.yaml)")


def _gpu_json(g) -> dict:
    d = to_dict(g)
    d["processes"] = len(g.processes)
    return d


@app.command("check")
def check(inventory: str | None = INVENTORY,
          as_json: bool = typer.Option(False, "--json", help="print a JSON array, one object "
                                                             "per node"),
          timeout: float = typer.Option(5.0, "--timeout", help="connect timeout per node (s)")):
    """Poll every node once: reachable or why not, round-trip time, driver, GPUs.

    A ``run_as: submitter`` node is also asked to run ``true`` as one allowed user through
    sudo, and says whether that works.

    Exit status: 0 if every node answered (and run_as works), 1 if not (so cron/CI can alert).
    """
    from ..inventory import load_inventory  # YAML and the inventory: loaded when used
    from ..nodes.check import check_nodes, check_run_as

    _as_the_controllers_account("iadeep nodes check")
    inv = load_inventory(inventory)
    snap = check_nodes(inv, connect_timeout=timeout)
    run_as = check_run_as(inv, connect_timeout=timeout)
    if as_json:
        render.as_json([{
            "name": n.name, "ok": n.ok, "error": n.error, "rtt_s": n.rtt_s,
            "driver_version": n.driver_version, "gpus": [_gpu_json(g) for g in n.gpus],
            **({"run_as": {"user": run_as[n.name][0], "ok": run_as[n.name][1] is None,
                           "error": run_as[n.name][1]}} if n.name in run_as else {}),
        } for n in snap.nodes])
    else:
        for n in snap.nodes:
            if n.ok:
                gpus = ", ".join(f"{g.index}:{g.name} {g.memory_total_mib or 0:.0f}MiB"
                                 for g in n.gpus) or "no GPUs"
                typer.echo(f"{n.name:<16} ok    {(n.rtt_s or 0) * 1000:6.0f} ms  driver "
                           f"{n.driver_version or '-'}  {len(n.gpus)} GPU(s): {gpus}")
            else:
                typer.echo(f"{n.name:<16} FAIL  {n.error}")
            if n.name in run_as:
                user, why = run_as[n.name]
                typer.echo(f"{'':<16} run_as: submitter "
                           + (f"ok (sudo -n -u {user} works)" if why is None else f"FAIL  {why}"))
    if not all(n.ok for n in snap.nodes) or any(why for _, why in run_as.values()):
        raise typer.Exit(1)


def _as_the_controllers_account(command: str) -> None:
    """`nodes check` and `nodes trust` use the SSH keys, ~/.ssh/config and known_hosts of the
    account that runs them: run by an admin whose own account it is not, they test (or
    record) the wrong ones. Refused with the line to run instead, where the state directory
    (IADEEP_HOME) belongs to another account."""
    state = StateDir.default()
    try:
        owner = state.root.stat().st_uid
    except OSError:
        return   # no state directory yet: nothing to compare with
    if owner == os.getuid():
        return
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = str(owner)
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        me = str(os.getuid())
    raise ConfigError(
        f"`{command}` uses the SSH keys and known_hosts of the account that runs it, and the "
        f"controller's state directory {state.root} belongs to {name}, not {me}",
        hint=f"run it as the controller's account: sudo -u {name} sh -lc "
             f"{shlex.quote(command)}")


def _controllers_state_dir(command: str) -> None:
    """Refuse to write where no controller reads: without IADEEP_HOME the state directory is
    this account's own default, which a lab's controller (IADEEP_HOME=/var/lib/iadeep) never
    reads. One that holds a controller's database or an inventory is someone's own: fine."""
    if iadeep_home_set():
        return
    state = StateDir.default()
    if state.install_id.exists() or state.inventory.exists():
        return
    raise ConfigError(
        f"IADEEP_HOME is not set, and no controller uses this account's default state "
        f"directory {state.root}: what this records there would never be read",
        hint=f"run it as the controller's account in a login shell, which reads IADEEP_HOME and "
             f"IADEEP_INVENTORY from /etc/profile.d/iadeep.sh: sudo -u iadeep sh -lc "
             f"{shlex.quote(command)} (docs/administration.md 'Running the controller on the "
             "head node'); for a controller of your own, set IADEEP_HOME")


def _confirmed(question: str) -> bool:
    """Ask yes/no; end of input (no terminal, Ctrl-D) or Ctrl-C count as no."""
    try:
        return typer.confirm(question)
    except typer.Abort:
        typer.echo()      # end the prompt's line
        return False


@app.command("trust")
def trust(node: str = typer.Argument(..., help="node name from the inventory",
                                    autocompletion=complete.node_names),
          inventory: str | None = INVENTORY,
          yes: bool = typer.Option(False, "--yes", "-y", help="record without asking")):
    """Show NODE's SSH host key fingerprint and record it in iadeep's known_hosts.

    A key that CHANGED is never replaced: remove the old line first (the error says how).
    """
    from ..inventory import load_inventory
    from ..nodes.check import scan_node_key, trust_key

    _as_the_controllers_account(f"iadeep nodes trust {node}")
    _controllers_state_dir(f"iadeep nodes trust {node}")
    scanned = scan_node_key(load_inventory(inventory), node)
    typer.echo(f"{scanned.node} ({scanned.known_hosts_name}): {scanned.key_type} "
               f"{scanned.fingerprint}")
    if scanned.status == "trusted":
        typer.echo("already trusted")
        return
    if scanned.status == "new" and not yes and not _confirmed("Trust this key?"):
        raise IadeepError(f"host key of {scanned.node} not trusted; nothing was recorded",
                          hint="answer y once the fingerprint matches the node's own "
                               "(`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` there), "
                               "or pass --yes")
    path = trust_key(scanned)
    typer.echo(f"recorded in {path}")


@app.command("fence")
def fence(node: str = typer.Argument(..., help="node name from the inventory",
                                    autocompletion=complete.node_names),
          yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
          force: bool = typer.Option(False, "--force", help="fence a node heard from within "
                                                            "node_grace too")):
    """Declare NODE's jobs dead (admins): the node is powered off or gone for good.

    A node the controller heard from within ``node_grace`` is refused (its jobs most likely
    still run) unless --force; the refusal lists the jobs fencing would requeue or fail.

    Jobs lost on a silent node are never started again while their first attempt might still
    run there. Fencing says it cannot: they are requeued (if they allow retries) or failed, and
    should NODE come back, their old attempts are stopped before anything new starts there.
    """
    from .. import messages as m
    from ..controller.client import ask

    if not yes and not _confirmed(f"Is {node} really powered off? A job still running there "
                                  "would run twice"):
        raise IadeepError(f"node {node} not fenced; nothing changed",
                          hint="fence a node only once it is powered off or its jobs are dead")
    result = ask(m.FenceRequest(node, force=force or None))
    ids = ", ".join(map(str, result.jobs)) or "none"
    typer.echo(f"node {result.node} fenced; its jobs requeued or failed: {ids}")


@app.command("drain")
def drain(node: str = typer.Argument(..., help="node name from the inventory",
                                    autocompletion=complete.node_names),
          reason: str = typer.Option(..., "--reason", help="why (shown in status, the monitor "
                                                           "and the web page)")):
    """Drain NODE (admins): no new jobs start there; the jobs running there finish.

    For maintenance that can wait for them (a driver update, a disk swap), as Slurm's drain
    state. `iadeep nodes resume NODE` undoes it; `nodes fence` is for nodes that are dead.
    """
    from .. import messages as m
    from ..controller.client import ask

    result = ask(m.DrainRequest(node, reason=reason))
    running = ", ".join(map(str, result.running))
    was = "" if result.changed else " (it was drained already; the reason is updated)"
    typer.echo(f"node {result.node} drained{was}: no new jobs start there; "
               + (f"running there until they finish: {running}" if running
                  else "no job runs there: it is free for maintenance now"))


@app.command("resume")
def resume(node: str = typer.Argument(..., help="node name from the inventory",
                                     autocompletion=complete.node_names)):
    """Undo `nodes drain NODE` (admins): new jobs may start there again."""
    from .. import messages as m
    from ..controller.client import ask

    result = ask(m.DrainRequest(node, resume=True))
    typer.echo(f"node {result.node} resumed: new jobs may start there"
               if result.changed else f"node {result.node} was not drained; nothing changed")
