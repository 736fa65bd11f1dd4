"""What a job's sbatch-like options mean, beyond checking them (``jobs.validate_spec``): which
nodes ``--constraint``/``--nodelist``/``--exclude`` allow, where a job runs (``--chdir``, the
shared submission directory, or its job directory), where ``--output``/``--error`` go
(``%j``-style patterns), which variables ``--export`` carries, and the ``#IADEEP`` directives a
script's top may hold.
"""
from __future__ import annotations

import re
import shlex
import typing

from . import checks
from .errors import InputError
from .jobs import NODE_WORD, Job, JobSpec, check_env_names, unsafe_env


def parse_names(option: str, text: str, sep: str = ",") -> tuple[str, ...]:
    """``--nodelist n1,n2`` / ``--exclude n3`` / ``--constraint a&b`` into names, refusing an
    empty one (``n1,,n2``) and Slurm's operators iadeep does not have (``|``, ``*``, ``[]``,
    brackets): a constraint silently read differently would put a job on the wrong nodes."""
    parts = tuple(p.strip() for p in text.split(sep))
    example = "--constraint a100&nvlink" if sep == "&" else f"{option} n1,n2"
    for part in parts:
        if not part or not NODE_WORD.fullmatch(part):
            what = "LABEL[&LABEL...] (all of them)" if sep == "&" else "NAME[,NAME...]"
            raise InputError(f"{option} {text[:80]!r} is not {what}",
                             hint=f"e.g. {example}; iadeep has no |, [] or * in these")
    return tuple(dict.fromkeys(parts))


def node_allowed(spec: JobSpec, name: str, labels: tuple[str, ...] | frozenset[str]) -> bool:
    """Whether a job may run on node ``name`` with ``labels``: every --constraint label, in
    --nodelist when it gives one, not in --exclude (the one rule placement and submission
    checks share)."""
    return (all(label in labels for label in spec.constraint)
            and (not spec.nodelist or name in spec.nodelist) and name not in spec.exclude)


def node_rules(spec: JobSpec) -> str:
    """The job's node rules as the options that made them (for reasons), '' if none."""
    parts = [f"--{opt} {sep.join(names)}" for opt, sep, names in (
        ("constraint", "&", spec.constraint), ("nodelist", ",", spec.nodelist),
        ("exclude", ",", spec.exclude)) if names]
    return " ".join(parts)


def run_dir(spec: JobSpec, shared_paths: tuple[str, ...]) -> str | None:
    """The working directory of a job on a node sharing ``shared_paths``: --chdir, else the
    directory it was submitted from when the node shares that path (an NFS home: as sbatch),
    else None (the job's own directory there, which always exists)."""
    if spec.workdir:
        return spec.workdir
    sub = spec.submit_dir
    if sub and any(sub == p.rstrip("/") or sub.startswith(p.rstrip("/") + "/") or p == "/"
                   for p in shared_paths):
        return sub
    return None


def run_dir_note(spec: JobSpec, node: str, shared_paths: tuple[str, ...]) -> str:
    """Where the job runs on ``node`` and why, for ``queue why`` and the job's events."""
    where = run_dir(spec, shared_paths)
    if spec.workdir:
        return f"in {where} (--chdir)"
    if where:
        return f"in {where} (the submission directory, shared on {node})"
    if spec.submit_dir:
        return (f"in its job directory ({spec.submit_dir} is not in {node}'s shared_paths)")
    return "in its job directory"


_PATTERN = re.compile(r"%(\d*)(.)")
NO_ARRAY = 4294967294   # what Slurm puts for %a in a job that is not an array's task


def expand_pattern(pattern: str, job_id: int, user: str, name: str,
                   array_id: int | None = None, array_index: int | None = None,
                   node: str | None = None) -> str:
    """An --output/--error file name with sbatch's patterns filled in: ``%j`` and ``%J`` (the
    job id: the batch step's has no step number), ``%A`` (the array's id; the job's own
    outside an array), ``%a`` (the task's index; 4294967294 outside an array, as Slurm),
    ``%b`` (the index modulo 10), ``%x`` (name), ``%u`` (user), ``%N`` (the node, once known),
    ``%n``/``%t`` (node and task number: 0), ``%s`` (the step: ``batch``), ``%%``; a number
    after ``%`` zero-pads a number (``%4a``: 0007). A name holding ``\\`` is taken as
    written, without the backslashes (sbatch's rule); other ``%`` letters stay as written."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    index = NO_ARRAY if array_index is None else array_index
    numbers: dict[str, int] = {"j": job_id, "J": job_id, "A": array_id or job_id, "a": index,
                               "b": index % 10, "n": 0, "t": 0}
    words = {"x": name, "u": user, "s": "batch", "%": "%"}
    if node is not None:
        words["N"] = node.split(".")[0]

    def fill(m: re.Match[str]) -> str:
        pad, letter = m.group(1), m.group(2)
        if letter in numbers:
            return str(numbers[letter]).zfill(min(int(pad or 0), 10))
        if letter in words and not pad:
            return words[letter]
        return m.group(0)
    return _PATTERN.sub(fill, pattern)


def stream_path(job: Job, stream: str, default_output: str, base: str,
                home: str | None = None) -> str:
    """The path of the job's ``stream`` ("output" or "error"), for both backends: --output /
    --error with %j/%u/%x filled in, a relative name anchored at ``base`` (the directory the
    job runs in), ``default_output`` for the output without --output (an SSH node's job log,
    Slurm's ``iadeep-<id>.out``). ``~`` is expanded with ``home`` when given (read on the
    controller), else left for the node's shell. The error stream without --error goes with
    the output (InputError: nothing separate to read)."""
    pattern = job.spec.output if stream == "output" else job.spec.error
    if pattern is None:
        if stream == "output":
            return default_output
        raise InputError(f"job {job.id} has no separate stderr: it goes with its stdout",
                         hint=f"iadeep logs {job.id} shows both; submit with --error FILE "
                              "to keep them apart")
    name = expand_pattern(pattern, job.id, job.owner, job.name, job.array_id, job.array_index,
                          job.node)
    if home is not None and (name == "~" or name.startswith("~/")):
        name = home.rstrip("/") + name[1:]
    if name.startswith("/") or name == "~" or name.startswith("~/"):
        return name
    return f"{base.rstrip('/')}/{name}"


# --export: what the default carries, and what ALL leaves out: the session's own variables
# (the node's login sets them for the account the job runs as) and iadeep's.
EXPORT_DEFAULT = ("PATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")
EXPORT_NEVER = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "_",
                          "MAIL", "TERM", "DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR",
                          "XDG_SESSION_ID", "DBUS_SESSION_BUS_ADDRESS", "CUDA_VISIBLE_DEVICES",
                          "OMPI_MCA_orte_precondition_transports"})


def exported_env(mode: str | None, environ: typing.Mapping[str, str]
                 ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The variables ``--export MODE`` takes from the submitting shell's ``environ``:
    ``None`` (the default) the small set EXPORT_DEFAULT, ``NONE`` nothing, ``ALL`` everything
    but EXPORT_NEVER, ``SSH_*``, ``IADEEP_*`` and the unsafe (``unsafe_env``), ``NAME[,NAME...]``
    those (each must be set, none unsafe). Returns (the pairs, the names ALL skipped because
    their value is not printable text or they are unsafe)."""
    text = (mode or "").strip()
    if mode is None:
        names = [n for n in EXPORT_DEFAULT if n in environ]
    elif text.upper() == "NONE":
        names = []
    elif text.upper() == "ALL":
        names = sorted(n for n in environ if n not in EXPORT_NEVER and n.isidentifier()
                       and n.isascii() and not n.startswith(("SSH_", "IADEEP_")))
    else:
        names = list(parse_names("--export", text))
        for n in names:
            if not (n.isidentifier() and n.isascii()):
                raise InputError(f"--export {n[:80]!r} is not a variable name",
                                 hint="--export NONE, ALL or NAME[,NAME...]; values: --env")
            if n not in environ:
                raise InputError(f"--export {n}: {n} is not set here",
                                 hint=f"set it first, or pass a value with --env {n}=VALUE")
        check_env_names(((n, "") for n in names), "--export")
    pairs, skipped = [], []
    for n in names:
        value = environ[n]
        if mode is not None and text.upper() == "ALL" and (not _printable(value)
                                                           or unsafe_env(n)):
            skipped.append(n)
            continue
        pairs.append((n, value))
    return tuple(pairs), tuple(skipped)


def _printable(value: str) -> bool:
    return checks.UNSAFE_IN_VALUES.search(value) is None


DIRECTIVE = "#IADEEP"
MAX_DIRECTIVE_SCAN = 64 * 1024     # bytes of a script's top read for directives


def directive_lines(text: str, prefix: str) -> list[tuple[int, str]]:
    """The ``prefix`` lines (``#IADEEP``, ``#SBATCH``) at a script's top, as sbatch reads them:
    after the ``#!`` line, up to the first line neither blank nor a comment; each as (its line
    number, the rest of the line)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if (number == 1 and stripped.startswith("#!")) or not stripped:
            continue
        if not stripped.startswith("#"):
            break
        rest = stripped[len(prefix):]
        if stripped.startswith(prefix) and (not rest or rest[0].isspace()):
            found.append((number, rest))
    return found


def directives(text: str) -> list[tuple[int, list[str]]]:
    """The ``#IADEEP`` lines at the top of a script (``directive_lines``), each as (its line
    number, its words split as a shell would, a trailing ``# comment`` left out). A line whose
    quotes do not close is an InputError naming it."""
    found = []
    for number, rest in directive_lines(text, DIRECTIVE):
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as exc:
            raise InputError(f"line {number}: {(DIRECTIVE + rest)[:120]}: {exc}",
                             hint="quote #IADEEP values as on a command line") from None
        found.append((number, words))
    return found
