"""``#SBATCH`` lines (and sbatch's spellings on ``queue add``'s command line) read with Slurm's
meaning: each option sbatch takes is honoured (mapped to the ``queue add`` option that does
the same), noted (accepted, with one note saying what it does not do on one node) or refused
(one line naming it, its file and line). Every problem of a script is collected and reported
at once (``SbatchProblems``), never one per submission.

sbatch parses a line's words as its command line does (getopt_long): ``--opt=value`` or
``--opt value``, ``-t 10`` or ``-t10``, a long option abbreviated to any unique prefix
(``--out=log`` is ``--output``), several options on one line; reading stops at the first line
that is neither blank nor a comment (docs/submitting.md "Coming from Slurm").
"""
from __future__ import annotations

import datetime
import re
import shlex
import time as time_mod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InputError
from ..jobopts import directive_lines
from ..jobs import MAX_GPUS_PER_JOB, NOTIFY_WHEN, parse_array, parse_job_ids, parse_signal
from ..text import parse_duration

SBATCH = "#SBATCH"
# The lab's choice (exported to members by /etc/profile.d/iadeep.sh): "honour" (the default)
# reads #SBATCH lines with Slurm's meaning, "warn" leaves them unread and says so.
SETTING = "IADEEP_SBATCH"

REQ, NONE, OPT = "required", "none", "optional"   # an option's argument, as getopt_long's
# sbatch's long options (Slurm 23.x man page, sbatch(1)), with their argument kind and short
# letter: the whole list, so that an abbreviation is resolved against all of them as sbatch
# does (``--gpus-per-n`` is --gpus-per-node; ``--mem-per`` is ambiguous).
LONG: dict[str, tuple[str, str]] = {
    "account": (REQ, "A"), "acctg-freq": (REQ, ""), "array": (REQ, "a"), "batch": (REQ, ""),
    "bb": (REQ, ""), "bbf": (REQ, ""), "begin": (REQ, "b"), "chdir": (REQ, "D"),
    "cluster-constraint": (REQ, ""), "clusters": (REQ, "M"), "comment": (REQ, ""),
    "constraint": (REQ, "C"), "container": (REQ, ""), "container-id": (REQ, ""),
    "contiguous": (NONE, ""), "core-spec": (REQ, "S"), "cores-per-socket": (REQ, ""),
    "cpu-freq": (REQ, ""), "cpus-per-gpu": (REQ, ""), "cpus-per-task": (REQ, "c"),
    "deadline": (REQ, ""), "delay-boot": (REQ, ""), "dependency": (REQ, "d"),
    "distribution": (REQ, "m"), "error": (REQ, "e"), "exclude": (REQ, "x"),
    "exclusive": (OPT, ""), "export": (REQ, ""), "export-file": (REQ, ""), "extra": (REQ, ""),
    "extra-node-info": (REQ, "B"), "get-user-env": (OPT, ""), "gid": (REQ, ""),
    "gpu-bind": (REQ, ""), "gpu-freq": (REQ, ""), "gpus": (REQ, "G"),
    "gpus-per-node": (REQ, ""), "gpus-per-socket": (REQ, ""), "gpus-per-task": (REQ, ""),
    "gres": (REQ, ""), "gres-flags": (REQ, ""), "help": (NONE, "h"), "hint": (REQ, ""),
    "hold": (NONE, "H"), "ignore-pbs": (NONE, ""), "input": (REQ, "i"),
    "job-name": (REQ, "J"), "kill-on-invalid-dep": (REQ, ""), "licenses": (REQ, "L"),
    "mail-type": (REQ, ""), "mail-user": (REQ, ""), "mcs-label": (REQ, ""), "mem": (REQ, ""),
    "mem-bind": (REQ, ""), "mem-per-cpu": (REQ, ""), "mem-per-gpu": (REQ, ""),
    "mincpus": (REQ, ""), "network": (REQ, ""), "nice": (OPT, ""), "no-kill": (OPT, "k"),
    "no-requeue": (NONE, ""), "nodefile": (REQ, "F"), "nodelist": (REQ, "w"),
    "nodes": (REQ, "N"), "ntasks": (REQ, "n"), "ntasks-per-core": (REQ, ""),
    "ntasks-per-gpu": (REQ, ""), "ntasks-per-node": (REQ, ""), "ntasks-per-socket": (REQ, ""),
    "open-mode": (REQ, ""), "output": (REQ, "o"), "overcommit": (NONE, "O"),
    "oversubscribe": (NONE, "s"), "parsable": (NONE, ""), "partition": (REQ, "p"),
    "power": (REQ, ""), "prefer": (REQ, ""), "priority": (REQ, ""), "profile": (REQ, ""),
    "propagate": (OPT, ""), "qos": (REQ, "q"), "quiet": (NONE, "Q"), "reboot": (NONE, ""),
    "requeue": (NONE, ""), "reservation": (REQ, ""), "signal": (REQ, ""),
    "sockets-per-node": (REQ, ""), "spread-job": (NONE, ""), "switches": (REQ, ""),
    "test-only": (NONE, ""), "thread-spec": (REQ, ""), "threads-per-core": (REQ, ""),
    "time": (REQ, "t"), "time-min": (REQ, ""), "tmp": (REQ, ""), "tres-per-task": (REQ, ""),
    "uid": (REQ, ""), "usage": (NONE, ""), "use-min-nodes": (NONE, ""), "verbose": (NONE, "v"),
    "version": (NONE, "V"), "wait": (NONE, "W"), "wait-all-nodes": (REQ, ""),
    "wckey": (REQ, ""), "wrap": (REQ, ""),
}
SHORT = {letter: name for name, (_, letter) in LONG.items() if letter}

_MEM_NOTE = ("host RAM: a limit where the node can enforce it (a memory cgroup), counted "
             "where the inventory gives the node's host_mem")
# Accepted and named once in a note: what they do on a cluster, nothing on one node of a lab.
NOTED = {
    "account": "accounts: iadeep's fair share is per user",
    "qos": "QOS: iadeep has none (priority and fair share instead)",
    "partition": "partitions: iadeep places on any node that fits (--constraint chooses "
                 "labelled nodes)",
    "clusters": "clusters: one lab, one controller",
    "licenses": "licenses: iadeep does not count them",
    "open-mode": "open mode: output files are written afresh on each start",
    "comment": "comments: not kept", "tmp": "local disk (--tmp): not counted",
    "mem": _MEM_NOTE, "mem-per-cpu": _MEM_NOTE, "mem-per-gpu": _MEM_NOTE,
    "cpus-per-task": "CPUs: SLURM_CPUS_PER_TASK in the job, counted where the inventory "
                     "gives the node's cpus, not pinned",
    "mincpus": "CPUs (--mincpus): not counted",
    "cpus-per-gpu": "CPUs (--cpus-per-gpu): not counted",
    "time-min": "--time-min: the job keeps its --time",
    "kill-on-invalid-dep": "a dependency that can never be met always cancels the job",
    "get-user-env": "the job gets its account's login environment on its node",
    "nice": "--nice: use --priority", "wckey": "wckeys: none", "reservation":
        "Slurm reservations: iadeep's own are `iadeep reserve`",
    "hint": "--hint: no CPU binding", "distribution": "task distribution: one task",
    "mem-bind": "memory binding: none", "gpu-bind": "GPU binding: CUDA_VISIBLE_DEVICES",
    "cpu-freq": "CPU frequency: not set", "gpu-freq": "GPU frequency: not set",
    "acctg-freq": "accounting sampling: iadeep polls its nodes", "profile": "profiling: none",
    "propagate": "resource limits: the node's", "export-file": None,
    "threads-per-core": "CPU layout: not counted", "cores-per-socket": "CPU layout: not counted",
    "sockets-per-node": "CPU layout: not counted", "extra-node-info": "CPU layout: not counted",
    "ntasks-per-core": "one task", "ntasks-per-socket": "one task", "spread-job": "one node",
    "use-min-nodes": "one node", "contiguous": "one node", "switches": "one node",
    "wait-all-nodes": "one node", "overcommit": "one task", "oversubscribe":
        "iadeep decides GPU sharing itself (--exclusive keeps it alone)",
    "no-kill": "one node", "prefer": "--prefer: not used (--constraint is a requirement)",
    "gres-flags": "GRES flags: none", "power": "power options: none",
    "quiet": "", "verbose": "", "parsable": "`queue add` prints the job id alone anyway",
    "mcs-label": "MCS labels: none", "delay-boot": "nodes are not rebooted",
    "reboot": "nodes are not rebooted", "priority": "--priority: iadeep's own --priority "
                                                    "(a member's cap applies)",
    "deadline": "--deadline: not enforced", "network": "network options: none",
    "ignore-pbs": "", "uid": None, "gid": None, "thread-spec": "one node",
    "core-spec": "one node", "extra": "", "cluster-constraint": "one cluster",
    "tres-per-task": None, "bb": None, "bbf": None, "container": None, "container-id": None,
    "batch": None, "input": None, "nodefile": None, "wait": None, "test-only": None,
    "wrap": None, "help": None, "usage": None, "version": None,
}
# Refused whatever the value (None in NOTED): what iadeep cannot do, with how to go on.
REFUSED_WHY = {
    "export-file": "iadeep has no --export-file; use --export NAME[,NAME] or --env",
    "uid": "jobs run as their submitter", "gid": "jobs run as their submitter",
    "tres-per-task": "use --gpus N", "bb": "no burst buffers", "bbf": "no burst buffers",
    "container": "no OCI containers: start the container in the script",
    "container-id": "no OCI containers", "batch": "no batch features",
    "input": "jobs read no standard input", "nodefile": "use --nodelist",
    "wait": "`queue add` returns at once; use `iadeep wait ID`",
    "test-only": "use `iadeep queue why` after submitting", "wrap": "on the command line "
    "only (`queue add --wrap CMD`)", "help": "not on a #SBATCH line", "usage": "not on a "
    "#SBATCH line", "version": "not on a #SBATCH line",
}
# The mail types iadeep's --notify covers: BEGIN (and ALL) -> all, END -> end, FAIL -> fail;
# the others are named in a note.
MAIL_NOTED = {"REQUEUE", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT", "TIME_LIMIT_90",
              "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS"}
_MAIL_ORDER = {"none": 0, "fail": 1, "end": 2, "all": 3}


@dataclass
class Reading:
    """What the options read mean: ``values`` by ``queue add`` parameter name (the command
    line's override them), the notes to print once, and the problems (each "FILE:LINE: ...")."""

    values: dict[str, object] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)   # option -> what it does not do
    problems: list[str] = field(default_factory=list)
    hold: bool = False
    singleton: bool = False
    # GPU counts as given, by option (one node: all must agree)
    gpu_asks: dict[str, tuple[int, str]] = field(default_factory=dict)
    gpus_per_task: tuple[int, str] | None = None
    tasks_per_gpu: str | None = None   # where --ntasks-per-gpu 1 was given
    mem_per: tuple[str, int] | None = None   # ("cpu" or "gpu", MiB): --mem-per-cpu/-gpu


class SbatchProblems(InputError):
    """A script's options that cannot be honoured, all of them, one line each."""


def lines(text: str, prefix: str = SBATCH) -> list[tuple[int, str]]:
    """The ``prefix`` lines at a script's top, as sbatch reads them: (line number, the rest of
    the line); the same scan as ``#IADEEP`` lines (``jobopts.directive_lines``)."""
    return directive_lines(text, prefix)


def read_script(path: str, text: str) -> Reading:
    """Every ``#SBATCH`` line of ``text`` (the script at ``path``) read with sbatch's meaning."""
    reading = Reading()
    for number, rest in lines(text):
        where = f"{path}:{number}"
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as exc:
            reading.problems.append(f"{where}: {rest.strip()[:80]}: {exc} (quote values as "
                                    "on a command line)")
            continue
        read_words(words, where, reading)
    finish(reading)
    return reading


def read_words(words: list[str], where: str, reading: Reading) -> None:
    """sbatch's options in ``words`` (one line, or the command line: ``where`` names it) into
    ``reading``, as getopt_long parses them."""
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            given, eq, value = word[2:].partition("=")
            name = _long_name(given, where, reading)
            if name is None:
                continue
            kind = LONG[name][0]
            if kind == NONE and eq:
                reading.problems.append(f"{where}: --{name} takes no value (got {word!r})")
                continue
            if kind == REQ and not eq:
                if i >= len(words):
                    reading.problems.append(f"{where}: --{name} needs a value")
                    continue
                value, i = words[i], i + 1
            apply(name, value if (eq or kind == REQ) else None, f"--{given}", where, reading)
        elif word.startswith("-") and len(word) > 1:
            j = 1
            while j < len(word):
                letter = word[j]
                j += 1
                name = SHORT.get(letter)
                if name is None:
                    reading.problems.append(f"{where}: sbatch has no option -{letter}")
                    break
                if LONG[name][0] == REQ:
                    value = word[j:]
                    if not value:
                        if i >= len(words):
                            reading.problems.append(f"{where}: -{letter} needs a value")
                            break
                        value, i = words[i], i + 1
                    apply(name, value.removeprefix("=") if letter == "d" else value,
                          f"-{letter}", where, reading)
                    break
                apply(name, None, f"-{letter}", where, reading)
        else:
            reading.problems.append(f"{where}: {word[:60]!r} is not an option (#SBATCH lines "
                                    "hold options only; the script's arguments go on the "
                                    "command line)")


def _long_name(given: str, where: str, reading: Reading) -> str | None:
    """``--given`` resolved as getopt_long does: the option itself, else the one option it
    abbreviates; a problem when none or several."""
    if given in LONG:
        return given
    matches = [n for n in LONG if n.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        reading.problems.append(f"{where}: --{given} is ambiguous (--{', --'.join(matches[:4])})")
    else:
        reading.problems.append(f"{where}: sbatch has no option --{given}")
    return None


def _int(value: str, option: str, where: str, reading: Reading) -> int | None:
    if value.strip().isdigit():
        return int(value)
    reading.problems.append(f"{where}: {option} {value[:40]!r} is not a whole number")
    return None


Handler = Callable[[str, str, str, Reading], None]


def apply(name: str, value: str | None, option: str, where: str, reading: Reading) -> None:
    """One option (``option`` as written, ``name`` its full long name) into ``reading``."""
    handler = HANDLERS.get(name)
    if handler is not None:
        try:
            handler(value or "", option, where, reading)
        except InputError as exc:
            reading.problems.append(f"{where}: {exc.message}" + (f" ({exc.hint})"
                                                                 if exc.hint else ""))
        return
    if name in REFUSED_WHY:
        reading.problems.append(f"{where}: {option} is not something iadeep does: "
                                f"{REFUSED_WHY[name]}")
        return
    note = NOTED.get(name)
    if note:
        reading.notes.setdefault(f"--{name}", note)


def _set(key: str, value: object) -> Handler:
    def handler(text: str, option: str, where: str, reading: Reading) -> None:
        reading.values[key] = text if value is None else value
    return handler


def _time(text: str, option: str, where: str, reading: Reading) -> None:
    if text.strip().lower() in ("unlimited", "infinite"):
        reading.values.pop("time", None)
        reading.notes.setdefault("--time", "UNLIMITED: the lab's limits apply")
        return
    if parse_duration(text, bare_s=60) is None:
        raise InputError(f"{option} {text[:40]!r} is not a time limit",
                         hint="sbatch's forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S")
    reading.values["time"] = text.strip()


def _pattern(key: str) -> Handler:
    """--output/--error: kept as written; sbatch's %-patterns are filled in on the node
    (``jobopts.expand_pattern``)."""
    def handler(text: str, option: str, where: str, reading: Reading) -> None:
        if not text:
            raise InputError(f"{option} needs a file name", hint=f"e.g. {option}=%x-%j.out")
        reading.values[key] = text
    return handler


def _array(text: str, option: str, where: str, reading: Reading) -> None:
    parse_array(text)
    reading.values["array"] = text.strip()


def _gpu_count(text: str, option: str, where: str) -> int:
    """``N`` or ``TYPE:N`` (sbatch's --gpus forms); a type is named in a note by the caller."""
    count = text.rsplit(":", 1)[-1]
    if not count.isdigit() or not 1 <= int(count) <= MAX_GPUS_PER_JOB:
        raise InputError(f"{option} {text[:40]!r} is not [TYPE:]COUNT with a count from 1 to "
                         f"{MAX_GPUS_PER_JOB}", hint="e.g. --gpus=2 or --gpus=a100:2")
    return int(count)


def _gpu_type(text: str, reading: Reading) -> None:
    if ":" in text:
        kind = text.rsplit(":", 1)[0].split(":")[-1]
        reading.notes.setdefault("GPU type", f"{kind!r} is not matched: iadeep counts GPUs "
                                 "(--constraint LABEL chooses nodes labelled by model)")


def _gpus(key: str) -> Handler:
    def handler(text: str, option: str, where: str, reading: Reading) -> None:
        reading.gpu_asks[key] = (_gpu_count(text, option, where), f"{where} ({option})")
        _gpu_type(text, reading)
    return handler


def _gres(text: str, option: str, where: str, reading: Reading) -> None:
    for part in text.split(","):
        part = part.strip()
        if part in ("none", ""):
            continue
        m = re.fullmatch(r"gpu(?::([\w.-]+))?(?::(\d+))?", part)
        if m is None:
            reading.notes.setdefault("--gres", f"{part!r}: only gpu resources are counted")
            continue
        count = int(m[2]) if m[2] else (int(m[1]) if m[1] and m[1].isdigit() else 1)
        if not 1 <= count <= MAX_GPUS_PER_JOB:
            raise InputError(f"{option} {part!r} asks for {count} GPUs; one node has at most "
                             f"{MAX_GPUS_PER_JOB}")
        reading.gpu_asks["--gres"] = (count, f"{where} ({option})")
        if m[1] and not m[1].isdigit():
            _gpu_type(f"{m[1]}:{count}", reading)


def _gpus_per_task(text: str, option: str, where: str, reading: Reading) -> None:
    reading.gpus_per_task = (_gpu_count(text, option, where), f"{where} ({option})")
    _gpu_type(text, reading)


def _one(what: str, hint: str) -> Handler:
    """An option that must ask for one (node, task): accepted and noted then, else refused."""
    def handler(text: str, option: str, where: str, reading: Reading) -> None:
        value = text.strip()
        low = value.split("-")[0] if what == "nodes" else value
        if low == "1" or (what == "nodes" and re.fullmatch(r"1(-\d+)?", value)):
            reading.notes.setdefault(option if option.startswith("--") else f"{option} 1",
                                     "one node: every iadeep job runs on one" if what == "nodes"
                                     else "one task: the script runs once")
            if what == "tasks-per-gpu":
                reading.tasks_per_gpu = f"{where} ({option})"
            return
        raise InputError(f"{option} {value[:20]} asks for {what} iadeep cannot give: a job "
                         f"runs once, on one node", hint=hint)
    return handler


def _dependency(text: str, option: str, where: str, reading: Reading) -> None:
    if "?" in text:
        raise InputError(f"{option} {text[:60]!r}: iadeep has no '?' (any one of)",
                         hint="join the conditions with ',' (all of them)")
    kinds = {"afterok": "after", "afterany": "after_any", "afternotok": "after_fail"}
    for part in text.split(","):
        kind, _, ids = part.strip().partition(":")
        if kind == "singleton" and not ids:
            reading.singleton = True
            continue
        if kind not in kinds:
            raise InputError(f"{option} {part.strip()[:40]!r}: iadeep has afterok, afterany, "
                             "afternotok and singleton only",
                             hint="'after' (once started), 'aftercorr' and 'afterburstbuffer' "
                                  "have no equivalent: use afterok or afterany")
        if "+" in ids:
            raise InputError(f"{option} {part.strip()[:40]!r}: +TIME is only for 'after'")
        found = parse_job_ids(ids.replace(":", ","), f"{option} {kind}")
        key = kinds[kind]
        old = str(reading.values.get(key, ""))
        reading.values[key] = ",".join(x for x in (old, ",".join(map(str, found))) if x)


def _signal(text: str, option: str, where: str, reading: Reading) -> None:
    body = text.strip()
    prefix, colon, rest = body.partition(":")
    if colon and prefix.upper() in ("B", "R", "RB", "BR"):
        if "R" in prefix.upper():
            reading.notes.setdefault("--signal R:", "R: (reservation end) has no meaning here")
        body = ("B:" if "B" in prefix.upper() else "") + rest
    name, lead = parse_signal(body)
    reading.values["signal"] = f"{name}@{lead}"


def _mail_type(text: str, option: str, where: str, reading: Reading) -> None:
    when = "none"
    for kind in (t.strip().upper() for t in text.split(",")):
        mapped = {"NONE": "none", "BEGIN": "all", "END": "end", "FAIL": "fail",
                  "ALL": "all"}.get(kind)
        if mapped is None and kind in MAIL_NOTED:
            reading.notes.setdefault(f"--mail-type {kind}", "not sent (iadeep tells of a job's "
                                     "start, end and failure: --notify)")
            continue
        if mapped is None:
            raise InputError(f"{option} {kind[:30]!r} is not a mail type",
                             hint="NONE, BEGIN, END, FAIL, ALL, REQUEUE, TIME_LIMIT...")
        when = max(when, mapped, key=_MAIL_ORDER.__getitem__)
        if kind == "BEGIN":
            reading.notes.setdefault("--mail-type BEGIN", "iadeep tells of the start and the "
                                     "end (--notify all)")
    prev = str(reading.values.get("notify", "none"))
    reading.values["notify"] = max(prev, when, key=_MAIL_ORDER.__getitem__)
    assert reading.values["notify"] in NOTIFY_WHEN


def _mail_user(text: str, option: str, where: str, reading: Reading) -> None:
    reading.notes.setdefault("--mail-user", "messages go where the lab sends yours "
                             "(lab.notify: your address or the lab's webhook)")


def _exclusive(text: str, option: str, where: str, reading: Reading) -> None:
    if text and text not in ("user", "mcs", "topo"):
        raise InputError(f"{option}={text[:20]} is not user, mcs or topo")
    reading.values["exclusive"] = True
    reading.notes.setdefault("--exclusive", "its GPUs are not shared (the node's other GPUs "
                             "may run other jobs)")


def _nodes_words(option: str) -> Handler:
    def handler(text: str, o: str, where: str, reading: Reading) -> None:
        reading.values[option] = ",".join(expand_hostlist(text, o))
    return handler


def _export(text: str, option: str, where: str, reading: Reading) -> None:
    """``ALL``, ``NONE``/``NIL``, ``NAME[,NAME=VALUE...]`` (sbatch's): NAME=VALUE go to --env."""
    names, env = [], []
    for part in (p.strip() for p in text.split(",")):
        key, eq, value = part.partition("=")
        if eq:
            env.append(f"{key}={value}")
        elif part.upper() == "NIL":
            names.append("NONE")
        elif part:
            names.append(part)
    modes = [n for n in names if n.upper() in ("ALL", "NONE")]
    if modes and len(names) > 1:
        if modes[0].upper() == "ALL":
            names = ["ALL"]
        else:
            raise InputError(f"{option} {text[:60]!r}: NONE with names",
                             hint="--export=NAME,NAME or --export=NONE")
    # names alone (NAME=VALUE among them) export those only, as sbatch does
    reading.values["export"] = ",".join(names) if names else "NONE"
    if env:
        old = reading.values.get("env")
        reading.values["env"] = [*(old if isinstance(old, list) else []), *env]


def _begin(text: str, option: str, where: str, reading: Reading) -> None:
    reading.values["begin"] = parse_begin(text, time_mod.time())


def _cpus(text: str, option: str, where: str, reading: Reading) -> None:
    count = _int(text, option, where, reading)
    if count is not None:
        if not 1 <= count <= 4096:
            raise InputError(f"{option} {count}: give 1 to 4096 CPUs")
        reading.values["cpus_per_task"] = count
        reading.notes.setdefault("--cpus-per-task", NOTED["cpus-per-task"] or "")


_UNITS_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}


def mem_mib(text: str, option: str) -> int:
    """A size as sbatch's --mem takes it (``8000`` MB, ``8000M``, ``16G``, ``16GB``, ``1T``,
    ``512K``; Slurm's MB are MiB) in MiB, at least 1."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT])?B?", text.strip(), re.IGNORECASE)
    if m is None:
        raise InputError(f"{option} {text[:40]!r} is not a size",
                         hint="e.g. 16G or 8000M (host RAM, as in Slurm)")
    return max(1, round(float(m[1]) * _UNITS_MIB[(m[2] or "M").upper()]))


def _mem(text: str, option: str, where: str, reading: Reading) -> None:
    if text.strip() == "0":   # Slurm's: all of the node's memory
        reading.values.pop("host_mem_mib", None)
        reading.notes.setdefault("--mem=0", "no limit on host RAM")
        return
    reading.values["host_mem_mib"] = mem_mib(text, option)
    reading.mem_per = None
    reading.notes.setdefault("--mem", _MEM_NOTE)


def _mem_per(kind: str) -> Handler:
    def handler(text: str, option: str, where: str, reading: Reading) -> None:
        reading.mem_per = (kind, mem_mib(text, option))
        reading.values.pop("host_mem_mib", None)
        reading.notes.setdefault(f"--mem-per-{kind}", _MEM_NOTE)
    return handler


def _chdir(text: str, option: str, where: str, reading: Reading) -> None:
    reading.values["workdir"] = text


HANDLERS: dict[str, Handler] = {
    "job-name": _set("name", None), "time": _time, "output": _pattern("output"),
    "error": _pattern("error"), "array": _array, "gres": _gres, "gpus": _gpus("--gpus"),
    "gpus-per-node": _gpus("--gpus-per-node"), "gpus-per-socket": _gpus("--gpus-per-socket"),
    "gpus-per-task": _gpus_per_task, "nodes": _one("nodes", "use one node's GPUs, or split "
                                                   "the work into jobs (an --array)"),
    "ntasks": _one("tasks", "iadeep runs the script once; for CPU cores use --cpus-per-task"),
    "ntasks-per-node": _one("tasks", "iadeep runs the script once; for CPU cores use "
                                     "--cpus-per-task"),
    "ntasks-per-gpu": _one("tasks-per-gpu", "iadeep runs the script once (torchrun can "
                                            "start one process per GPU)"),
    "dependency": _dependency, "signal": _signal, "mail-type": _mail_type,
    "mail-user": _mail_user, "requeue": _set("requeue", True),
    "no-requeue": _set("requeue", False), "hold": _set("hold", True), "begin": _begin,
    "nodelist": _nodes_words("nodelist"), "exclude": _nodes_words("exclude"),
    "constraint": _set("constraint", None), "exclusive": _exclusive, "chdir": _chdir,
    "export": _export, "cpus-per-task": _cpus, "mem": _mem, "mem-per-cpu": _mem_per("cpu"),
    "mem-per-gpu": _mem_per("gpu"),
}


def finish(reading: Reading) -> None:
    """The GPU count from all the ways a script may ask (one node: they must agree), the
    --gpus-per-task count times the tasks (one)."""
    asks = dict(reading.gpu_asks)
    if reading.gpus_per_task is not None:
        asks["--gpus-per-task"] = reading.gpus_per_task
    counts = {count for count, _ in asks.values()}
    if len(counts) > 1:
        said = "; ".join(f"{count} at {where}" for count, where in asks.values())
        reading.problems.append(f"the GPU counts disagree: {said} (one node: give one count)")
    elif counts:
        reading.values["gpus"] = counts.pop()
    gpus = reading.values.get("gpus", 1)
    if reading.tasks_per_gpu is not None and gpus != 1:
        reading.problems.append(f"{reading.tasks_per_gpu}: one task per GPU with {gpus} GPUs "
                                f"is {gpus} tasks; iadeep runs the script once (start one "
                                "process per GPU from it, e.g. torchrun --nproc-per-node)")
    if reading.mem_per is not None:   # per CPU or GPU, times how many: the job's limit
        kind, each = reading.mem_per
        count = reading.values.get("cpus_per_task" if kind == "cpu" else "gpus", 1)
        reading.values["host_mem_mib"] = each * int(count)  # type: ignore[call-overload]
    if reading.values.pop("hold", False):
        reading.hold = True


# --------------------------------------------------------------------- values sbatch takes

def expand_hostlist(text: str, option: str) -> list[str]:
    """Slurm's host list ``node[01-03,7],gpu5`` as names (``node01 node02 node03 node7
    gpu5``); at most 1000."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[\]]*)(?:\[([^\]]*)\])?([^,\[\]]*)(?:,|$)", text.strip()):
        head, ranges, tail = m.group(1), m.group(2), m.group(3)
        if not head and ranges is None and not tail:
            continue
        if ranges is None:
            out.append(head + tail)
            continue
        for part in ranges.split(","):
            first, dash, last = part.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise InputError(f"{option} {text[:60]!r} is not a host list",
                                 hint="e.g. node01,node02 or node[01-02]")
            width = len(first)
            for n in range(int(first), int(last if dash else first) + 1):
                out.append(f"{head}{n:0{width}d}{tail}")
                if len(out) > 1000:
                    raise InputError(f"{option} {text[:60]!r} names more than 1000 nodes")
    return out


_BEGIN_NAMED = {"midnight": (0, 0), "noon": (12, 0), "teatime": (16, 0), "elevenses": (11, 0),
                "fika": (15, 0)}
_BEGIN_UNITS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400, "weeks": 604800}


def parse_begin(text: str, now: float) -> float:
    """``--begin`` as sbatch takes it, in epoch seconds: ``now[+N[seconds|minutes|hours|days|
    weeks]]`` (a bare N: seconds), ``HH:MM[:SS]`` (today, or tomorrow once past),
    ``YYYY-MM-DD[THH:MM[:SS]]``, ``MM/DD[/YY]``, ``midnight``, ``noon``, ``teatime``,
    ``today``, ``tomorrow``."""
    value = text.strip().lower()
    hint = "e.g. --begin=now+1hour, --begin=16:00 or --begin=2026-12-24T09:00"
    local = datetime.datetime.fromtimestamp(now)
    m = re.fullmatch(r"now(?:\+(\d+)([a-z]*))?", value)
    if m:
        unit = m[2] or "seconds"
        scale = next((s for u, s in _BEGIN_UNITS.items() if u.startswith(unit) or
                      u.rstrip("s") == unit), None)
        if scale is None:
            raise InputError(f"--begin {text[:40]!r}: unknown unit {m[2]!r}", hint=hint)
        return now + int(m[1] or 0) * scale
    if value in ("today", "tomorrow"):
        day = local.replace(hour=0, minute=0, second=0, microsecond=0)
        return (day + datetime.timedelta(days=value == "tomorrow")).timestamp()
    m = re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?(am|pm)?", value)
    if m or value in _BEGIN_NAMED:
        h, mi, s = (int(m[1]), int(m[2]), int(m[3] or 0)) if m else (*_BEGIN_NAMED[value], 0)
        if m and m[4] == "pm" and h < 12:
            h += 12
        at = local.replace(hour=h % 24, minute=mi, second=s, microsecond=0)
        if at.timestamp() <= now:
            at += datetime.timedelta(days=1)
        return at.timestamp()
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:t(\d{2}):(\d{2})(?::(\d{2}))?)?", value)
    if m:
        y, mo, d, h, mi, sec = (int(x) if x else 0 for x in m.groups())
        try:
            return datetime.datetime(y, mo, d, h, mi, sec).timestamp()
        except ValueError:
            raise InputError(f"--begin {text[:40]!r} is not a date", hint=hint) from None
    m = re.fullmatch(r"(\d{1,2})/(\d{1,2})(?:/(\d{2}))?", value)
    if m:
        year = 2000 + int(m[3]) if m[3] else local.year
        try:
            at = datetime.datetime(year, int(m[1]), int(m[2]))
        except ValueError:
            raise InputError(f"--begin {text[:40]!r} is not a date", hint=hint) from None
        if not m[3] and at.timestamp() + 86400 <= now:
            at = at.replace(year=year + 1)
        return at.timestamp()
    raise InputError(f"--begin {text[:40]!r} is not a time sbatch takes", hint=hint)
