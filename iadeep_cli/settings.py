"""The lab's settings as values: ``Inventory`` (the nodes and the lab's settings that
``nodes.yaml`` gives, ``inventory.parse_inventory`` validates) and its parts: ``Node``,
``Policy`` (how placement decides) with ``FairShare`` and ``AdaptPolicy``, ``UserLimit``,
``NotifySettings``, ``SlurmSettings``, ``MetricsSettings``, ``IdleSettings``. Immutable; every
default here is the lab's default.
"""
from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, NotFoundError


class BackendKind(str, enum.Enum):
    """How a node's jobs are run (``Node.backend``): ``nodes.backend`` has one implementation
    per kind (docs/backends.md)."""

    SSH = "ssh"       # a shell over SSH (or the controller's own machine): nodes/shell/
    SLURM = "slurm"   # sbatch into a Slurm partition: nodes/slurm/

    def __str__(self) -> str:  # so f-strings print 'ssh', not 'BackendKind.SSH'
        return self.value


@dataclass(frozen=True)
class Node:
    """One GPU server. ``local`` marks the controller's own machine (polled through NVML)."""

    name: str
    host: str
    port: int | None = None          # None: take it from ~/.ssh/config, else 22
    user: str | None = None          # None: from ~/.ssh/config, else the controller's user
    identity_file: str | None = None
    gpus: tuple[int, ...] | None = None   # None: every GPU the node reports
    max_jobs_per_gpu: int | None = None   # None: the lab default
    labels: tuple[str, ...] = ()
    local: bool = False
    workdir: str = "~/.iadeep"       # where job directories are created on the node
    # Whose account a job runs as (docs/security.md): "account" (the SSH account, as
    # always) or "submitter" (the submitting user's account of the same name, through sudo),
    # who may be run as (the names listed, or members of the group on the node), and the
    # installation's part of a job directory's path (set by the controller; see
    # ``nodes.runas.user_workdir``).
    run_as: str = "account"
    allowed_users: tuple[str, ...] = ()
    allowed_group: str | None = None
    scope: str = ""
    # Directories the node sees as the submitting machine does (NFS homes, a shared /data): a
    # job submitted from below one runs there by default, as with sbatch (``jobopts.run_dir``).
    shared_paths: tuple[str, ...] = ()
    # "ssh" (this file's nodes) or "slurm" (found in the ``slurm:`` partition at start and
    # reload; its jobs go through sbatch, see ``nodes.slurm``): which ``nodes.backend.Backend``
    # controls its jobs.
    backend: BackendKind = BackendKind.SSH
    # A Slurm node also listed under ``nodes:`` (same name): its GPUs' telemetry (utilisation,
    # memory, processes) is read with nvidia-smi over SSH, as for an SSH node; its jobs still
    # go through Slurm. False: Slurm's GRES and the profiles alone.
    ssh_telemetry: bool = False
    # Its host RAM (MiB) and CPUs, where the lab counts jobs' --mem and --cpus-per-task on it
    # (scheduler/hostres.py); None: not counted
    host_mem_mib: int | None = None
    cpus: int | None = None

    @property
    def submitter(self) -> bool:
        return self.run_as == "submitter"


@dataclass(frozen=True)
class FairShare:
    """``lab.policy.fairshare``: a user's recent GPU use lowers their waiting jobs' priority.

    Slurm's classic fair-share factor (docs/scheduling.md "Fair share"):
    F = 2^(-usage_norm/share_norm), worth ``weight * F`` priority points. Usage is GPU-seconds
    held, decayed with ``half_life_days``; a user not in ``shares`` has share
    ``DEFAULT_SHARE``. Kept as a tuple of pairs, not a dict, so the policy stays a hashable
    value."""

    half_life_days: float = 7.0
    weight: float = 10.0
    shares: tuple[tuple[str, float], ...] = ()

    DEFAULT_SHARE = 1.0

    @property
    def half_life_s(self) -> float:
        return self.half_life_days * 86400.0

    def share(self, user: str) -> float:
        return dict(self.shares).get(user, self.DEFAULT_SHARE)


@dataclass(frozen=True)
class AdaptPolicy:
    """``lab.policy.adapt``: when a running shared GPU counts as gone wrong, and what is done
    about it (docs/scheduling.md 'Adapting at run time').  The defaults are conservative: a
    surprise must last ``observe_s`` *and* ``polls`` consecutive polls, and the margins are
    several times the +-2% spread of the shipped measurements, so ordinary jitter never acts on
    a job."""

    enabled: bool = True
    observe_s: float = 300.0        # how long a surprise must last before anything is done
    polls: int = 5                  # ... and over at least this many consecutive polls
    margin: float = 0.15            # observed below predicted by more than this: underperforms
    serial_margin: float = 0.05     # observed speeds summing below 1.0 - this: worse than serial
    # Off by default (only the phase refresh below acts): on the simulator's phase-shift grid
    # suspending the last joiner and closing GPUs cost more than they saved, 2.8% of the
    # exclusive JCT at load 1.5 without any phase shift (docs/simulator.md).
    stop_partners: bool = False     # no new partners join a GPU whose jobs underperform
    suspend: bool = False           # worse than serial: the job that joined last is suspended
    # an --opportunistic job yields its GPU (suspended or checkpointed) to a regular job that
    # waits for it: AntMan's idea, and what --opportunistic asks for; not tied to ``suspend``
    yield_opportunistic: bool = True
    window_s: float = 60.0          # progress rate measured over this much recent progress
    # A job's own report acts on others only as far as the node agrees: a GPU busy less than
    # this (%, nvidia-smi's utilization.gpu) is not what slows its jobs, so nobody is suspended;
    # and no job spends more than max_suspend_s suspended for its partners in all.
    busy_util: float = 50.0
    max_suspend_s: float = 3600.0
    # Phase change of a job (alone: its rate or GPU signature; sharing, where the poll has
    # per-process figures: its utilisation alone estimated from its SM share and speed) moved
    # away from how it started and from its workload's profile: its workload's profile is
    # refreshed with a "phase" sample.
    phase: bool = True
    phase_threshold: float = 0.25   # relative change of the progress rate (0.25: +-25%)
    phase_util: float = 20.0        # change of GPU/memory utilisation, percentage points
    phase_persist_s: float = 600.0  # how long the change must last (and over `polls` polls)


SHARING_RULES = ("jct", "threshold")   # Policy.sharing (scheduler/sharing.py)
PREEMPTION_RULES = ("off", "las")      # Policy.preemption (scheduler/placement.py)
COLD_START_RULES = ("share", "alone")  # Policy.cold_start (controller/round/steps/profile.py)


@dataclass(frozen=True)
class Policy:
    """Placement settings; see docs/scheduling.md 'How placement decides'."""

    # how sharing is judged (scheduler/sharing.py): "jct", by the rate jobs finish (speeds x
    # completion indexes from run times); "threshold", by combined speed >= share_threshold
    sharing: str = "threshold"
    share_threshold: float = 1.1     # predicted combined speed needed before two jobs share
    # default floor for any job's predicted speed when sharing, and jobs per GPU: groups of
    # three, each job at 0.3 or more, cut the mean JCT by 8-13% against pairs at 0.5 under load
    # (leave-one-workload-out, seeds 10-19: docs/simulator.md)
    min_speed: float = 0.3
    max_jobs_per_gpu: int = 3
    memory_margin_gib: float = 2.0   # added to a profile's peak memory (CUDA context, cache)
    aging_per_hour: float = 1.0      # priority points a waiting job gains per hour
    reserve_after_s: float = 3600.0  # a blocked whole-GPU job then reserves GPUs (no starvation)
    # whether plan() may checkpoint and requeue running jobs that declared --requeue
    # (PREEMPTION_RULES; docs/scheduling.md "Preemption"): "off" never; "las" lets a job that has
    # had little GPU time take the GPUs of requeueable jobs that have had much
    preemption: str = "off"
    fairshare: FairShare | None = None   # None: off, priority is base + aging alone
    adapt: AdaptPolicy = field(default_factory=AdaptPolicy)   # acting on running jobs
    # Self-tuning (steps/tune.py): the controller replays its recent history under other
    # values of sharing, min_speed and max_jobs_per_gpu and adopts a clearly better one. A key
    # written in nodes.yaml is ``pinned``: never changed. self_tune: false turns it off.
    self_tune: bool = True
    tune_every_s: float = 6 * 3600.0   # at most this often
    tune_days: float = 14.0            # on the jobs submitted in the last this many days
    pinned: tuple[str, ...] = ()       # set by the parser: the tunable keys nodes.yaml gives
    # how long a --requeue job asked to checkpoint (preempted, `queue requeue`) may take to
    # save and exit before it is stopped (and requeued all the same)
    preempt_grace_s: float = 300.0
    # A program with no profile yet (COLD_START_RULES; docs/scheduling.md "New programs"):
    # "share", where the nodes' poll gives per-process figures (NVML, nvidia-smi pmon) it may
    # start beside others under a provisional profile as heavy as the heaviest the lab knows,
    # and is profiled from its own figures while it shares (elsewhere as "alone"); "alone", it
    # waits for an empty GPU and is profiled there. The simulator's cold-start scenario (30%
    # new programs, 10 seeds): share 0.481 vs alone 0.491 of exclusive's mean JCT at load 1.2,
    # 0.485 vs 0.509 at 1.5 (docs/simulator.md "Cold start and labels").
    cold_start: str = "share"


@dataclass(frozen=True)
class UserLimit:
    max_gpus: int | None = None
    max_jobs: int | None = None


@dataclass(frozen=True)
class NotifySettings:
    """``lab.notify``: how a job's owner hears that it ended, and the default for ``--notify``.

    E-mail needs the SMTP server and a way to find a user's address: the per-user map first,
    else the pattern. The webhook (Slack, Mattermost, anything taking a JSON POST) gets every
    notification, whoever the owner."""

    default: str = "none"                 # --notify when a job does not say
    smtp: tuple[str, int] | None = None   # (host, port)
    # how the relay is reached: "none" (plain, a lab relay), "starttls" (submission, port 587)
    # or "tls" (implicit TLS, port 465); the server's certificate is always verified
    smtp_tls: str = "none"
    smtp_login_file: str | None = None    # "USER\nPASSWORD", readable by the controller alone
    smtp_ca_file: str | None = None       # CA certificates for the relay; None: the system's
    sender: str | None = None             # From:; None: iadeep@<the controller's host>
    address: str | None = None            # e.g. "{user}@lab.example.org"
    addresses: dict[str, str] = field(default_factory=dict)   # user -> address, first
    webhook: str | None = None            # http(s) URL
    # the chat service's own message form: slack (also Mattermost's), discord, teams, ntfy,
    # json (the fields alone), or auto: told by the URL's host (else slack's form)
    webhook_format: str = "auto"

    def email_for(self, user: str) -> str | None:
        """The user's address, or None when e-mail is not set up or does not reach them."""
        if self.smtp is None:
            return None
        if user in self.addresses:
            return self.addresses[user]
        return self.address.format(user=user) if self.address else None

    def reaches(self, user: str) -> bool:
        """Whether any channel would carry a message about ``user``'s job."""
        return self.webhook is not None or self.email_for(user) is not None


@dataclass(frozen=True)
class SlurmSettings:
    """``slurm:``: a Slurm partition whose nodes iadeep places jobs on (docs/slurm.md).

    Nodes and GPUs come from Slurm; GPU ``K`` of a node must be the typed GRES ``gpu:<prefix>K``
    (and ``shard:<prefix>K`` for sharing), so that a job can be pinned to the GPU iadeep chose.
    Slurm does not report GPU memory, so placement takes ``gpu_memory_gib`` per GPU."""

    partition: str
    shards_per_gpu: int = 4          # Count= of each GPU's shard line in gres.conf
    gpu_type_prefix: str = "g"       # GPU K is gres type f"{prefix}{K}"
    gpu_memory_gib: float = 80.0
    conf: str | None = None          # SLURM_CONF for the Slurm commands; None: the default
    account: str | None = None       # sbatch --account; None: each user's default


@dataclass(frozen=True)
class MetricsSettings:
    """``lab.metrics``: where the controller serves Prometheus metrics (``listen``: host and
    port; None: off, the default). The series name users, jobs and nodes, so an address other
    than loopback needs ``allow_remote: true`` written in the lab's own file."""

    listen: tuple[str, int] | None = None
    allow_remote: bool = False
    # also serve the GPU-hour gauges that the *_gpu_seconds ones replaced (0.x: deprecated;
    # for dashboards not yet moved to seconds, docs/accounting.md "Metrics ...")
    legacy_hours: bool = False


def parse_listen(value: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6, ``:PORT`` for every interface, a bare ``PORT``
    for 127.0.0.1) as (host, port); port 0 picks a free one. None if it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (any(c.isspace() or c in "[]/@" for c in host) or not port.isdigit()
            or not 0 <= int(port) <= 65535):
        return None
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (no name is looked up: a name other
    than localhost may resolve to anything)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def metrics_address(settings: MetricsSettings, flag: str | None = None
                    ) -> tuple[str, int] | None:
    """Where to serve metrics: ``--metrics`` (``flag``) if given, else ``lab.metrics.listen``;
    None: off. An address other than loopback is refused unless the lab allows it."""
    listen = settings.listen
    if flag is not None:
        listen = parse_listen(flag)
        if listen is None:
            raise ConfigError(f"--metrics {flag!r}: expected HOST:PORT, e.g. 127.0.0.1:9464",
                              hint="give a host and a port from 0 (any free one) to 65535")
    if listen is not None and not settings.allow_remote and not is_loopback(listen[0]):
        shown = f"{listen[0] or '*'}:{listen[1]}"
        raise ConfigError(f"metrics address {shown} is not loopback: whoever reaches it would "
                          "see the lab's users, jobs and nodes",
                          hint="serve on 127.0.0.1:PORT, or set lab.metrics.allow_remote: true "
                               "in the inventory if the lab wants that")
    return listen


IDLE_ACTIONS = ("notify", "requeue", "cancel")


@dataclass(frozen=True)
class IdleSettings:
    """A running job whose GPUs all stay at or below ``util`` % for ``after_s`` is idle: it is
    marked, its owner told once, and ``action`` taken (controller/round/steps/idle.py)."""

    after_s: float = 1800.0
    action: str = "notify"       # IDLE_ACTIONS
    util: float = 5.0


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    admins: tuple[str, ...] = ()
    poll_interval_s: float = 10.0
    node_grace_s: float = 60.0       # silence after which a node is marked down, its jobs lost
    policy: Policy = field(default_factory=Policy)
    user_limits: dict[str, UserLimit] = field(default_factory=dict)
    default_retries: int = 0
    job_dir_retention_s: float = 7 * 86400   # finished jobs' directories on nodes kept this long
    default_time_limit_s: float | None = None   # a job's --time when it gives none
    max_time_limit_s: float | None = None       # the longest --time accepted (and the default
                                                # when default_time_limit is not set)
    interactive_time_limit_s: float = 8 * 3600.0   # --time of an `iadeep run --pty` job
    interactive_grace_s: float = 60.0   # a --pty job whose client is gone this long is ended
    reservation_ahead_s: float = 30 * 86400.0   # the furthest ahead a reservation may start
    script_copies_gib: float = 1.0   # every member's script copies together (store/scripts.py)
    kill_grace_s: float = 10.0       # a stopped job's TERM -> KILL wait (cancel, time limit)
    max_priority: int = 10           # the highest --priority a member may set (admins: any)
    notify: NotifySettings = field(default_factory=NotifySettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    idle: IdleSettings = field(default_factory=IdleSettings)   # idle_after, idle_action, idle_util
    path: Path | None = None
    slurm: SlurmSettings | None = None

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def require_node(self, name: str) -> Node:
        """The node of that name, or the one-line NotFoundError that lists the known ones
        (what every pool's ``node()`` answers, SSH or Slurm, so both say the same)."""
        node = self.node(name)
        if node is None:
            known = ", ".join(n.name for n in self.nodes) or "none"
            raise NotFoundError(f"no node named {name!r} in the inventory (known: {known})",
                                hint="check the name with `iadeep nodes check`")
        return node

    def is_admin(self, user: str) -> bool:
        return user in self.admins or user == "root"


EMPTY = Inventory(nodes=())
