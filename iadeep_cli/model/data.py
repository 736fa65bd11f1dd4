"""Measurement files: CSV loaders for profiles, pairs, triples and predict queries, and the
H200 data shipped inside the package (the default with no lab data).

Errors name the file, the line (header = line 1) and the column, because these files are
hand-edited or exported by other tools and a bare ValueError helps nobody.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, overload

from ..errors import InputError, NotFoundError
from ..paths import file_problem
from ..profiles import OPTIONAL_FEATURES, REQUIRED_FEATURES, CoLocation, Profile

_DATA_PACKAGE = "iadeep_cli"
_DATA_DIR = ("data", "h200")


def _read_rows(path, required: tuple[str, ...], text: str | None = None
               ) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) from a CSV after checking the header has ``required``."""
    name = str(path)
    if text is None:
        p = Path(path)
        problem = file_problem(p)
        if problem:
            raise NotFoundError(f"{name}: {problem}", hint="check the path")
        try:
            text = p.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{name}: cannot read ({exc})", hint="give a UTF-8 CSV file") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header or not any(h.strip() for h in header):
        raise InputError(f"{name}: empty file (no CSV header)",
                         hint=f"the first line must be a header with columns {', '.join(required)}")
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(f"{name}: line 1: missing column(s) {', '.join(missing)}",
                         hint=f"the header must contain {', '.join(required)}")
    for lineno, values in enumerate(reader, start=2):
        if not values or all(not v.strip() for v in values):
            continue  # blank lines are harmless
        if len(values) > len(header):
            raise InputError(f"{name}: line {lineno}: {len(values)} fields but the header has "
                             f"{len(header)}", hint="remove the extra commas")
        row = {h: (values[i].strip() if i < len(values) else "") for i, h in enumerate(header)}
        yield lineno, row


@overload
def _number(name, lineno: int, row: dict[str, str], col: str,
            required: Literal[True] = ...) -> float: ...
@overload
def _number(name, lineno: int, row: dict[str, str], col: str, required: bool) -> float | None: ...
def _number(name, lineno: int, row: dict[str, str], col: str, required: bool = True
            ) -> float | None:
    raw = row.get(col, "")
    if raw == "":
        if required:
            raise InputError(f"{name}: line {lineno}, column {col}: value is empty",
                             hint=f"fill in {col} (a number)")
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name}: line {lineno}, column {col}: {raw!r} is not a number",
                         hint=f"{col} must be a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError(f"{name}: line {lineno}, column {col}: {raw!r} is not a finite number",
                         hint=f"{col} must be a finite number")
    if value < 0:
        raise InputError(f"{name}: line {lineno}, column {col}: {raw!r} is negative",
                         hint=f"{col} must be >= 0")
    return value


def _text(name, lineno: int, row: dict[str, str], col: str) -> str:
    value = row.get(col, "")
    if not value:
        raise InputError(f"{name}: line {lineno}, column {col}: value is empty",
                         hint=f"fill in {col}")
    return value


def load_profiles_csv(path, *, _text_content: str | None = None) -> dict[str, Profile]:
    """profiles.csv -> {workload: Profile}. Unknown extra columns are ignored."""
    out: dict[str, Profile] = {}
    for lineno, row in _read_rows(path, ("workload", *REQUIRED_FEATURES), _text_content):
        workload = _text(path, lineno, row, "workload")
        if workload in out:
            raise InputError(f"{path}: line {lineno}: workload {workload!r} appears twice",
                             hint="keep one row per workload")
        values: dict[str, Any] = {c: _number(path, lineno, row, c) for c in REQUIRED_FEATURES}
        values.update({c: _number(path, lineno, row, c, required=False)
                       for c in OPTIONAL_FEATURES})
        for col in ("gpu_util", "mem_util", "sm_util", "sm_occupancy", "tensor_util",
                    "fp32_util", "fp16_util"):
            v = values.get(col)
            if v is not None and v > 100.0:
                raise InputError(f"{path}: line {lineno}, column {col}: {v} is above 100",
                                 hint=f"{col} is a percentage (0-100)")
        out[workload] = Profile(workload=workload, gpu_model=row.get("gpu_model", ""), **values)
    if not out:
        raise InputError(f"{path}: no profile rows", hint="add one row per workload")
    return out


def _load_colocations(path, n: int, text: str | None = None) -> list[CoLocation]:
    letters = "abcdefgh"[:n]
    jobs_cols = tuple(f"job_{x}" for x in letters)
    speed_cols = tuple(f"speed_{x}" for x in letters)
    out: list[CoLocation] = []
    for lineno, row in _read_rows(path, jobs_cols + speed_cols, text):
        jobs = tuple(_text(path, lineno, row, c) for c in jobs_cols)
        speeds = tuple(float(_number(path, lineno, row, c)) for c in speed_cols)
        samples = (_number(path, lineno, row, "samples", required=False) if "samples" in row
                   else None)
        out.append(CoLocation(gpu_model=row.get("gpu_model", ""), jobs=jobs, speeds=speeds,
                              samples=max(1, int(samples)) if samples is not None else 1))
    if not out:
        raise InputError(f"{path}: no measurement rows", hint="add at least one row")
    return out


def load_pairs_csv(path) -> list[CoLocation]:
    """pairs.csv rows (gpu_model, job_a, job_b, speed_a, speed_b, samples) -> CoLocations."""
    return _load_colocations(path, 2)


def load_triples_csv(path) -> list[CoLocation]:
    """triples.csv rows (job_a..c, speed_a..c) -> CoLocations of three jobs."""
    return _load_colocations(path, 3)


def _shipped_text(filename: str) -> tuple[str, str]:
    from importlib import resources

    res = resources.files(_DATA_PACKAGE)
    for part in (*_DATA_DIR, filename):   # one name per joinpath: all Python 3.10 promises
        res = res.joinpath(part)
    return f"<shipped {'/'.join(_DATA_DIR)}/{filename}>", res.read_text(encoding="utf-8")


def shipped_profiles() -> dict[str, Profile]:
    """The H200 profiles that ship inside the package (the default with no lab data)."""
    name, text = _shipped_text("profiles.csv")
    return load_profiles_csv(name, _text_content=text)


def shipped_pairs() -> list[CoLocation]:
    name, text = _shipped_text("pairs.csv")
    return _load_colocations(name, 2, text)


def shipped_triples() -> list[CoLocation]:
    name, text = _shipped_text("triples.csv")
    return _load_colocations(name, 3, text)


def load_query_csv(path, profiles: Mapping[str, Profile]) -> list[tuple[str, str]]:
    """A predict query: rows with job_a, job_b naming workloads of ``profiles`` (order kept)."""
    out: list[tuple[str, str]] = []
    for lineno, row in _read_rows(path, ("job_a", "job_b")):
        pair = (_text(path, lineno, row, "job_a"), _text(path, lineno, row, "job_b"))
        for col, name in zip(("job_a", "job_b"), pair):
            if name not in profiles:
                raise InputError(f"{path}: line {lineno}, column {col}: unknown workload "
                                 f"{name!r}", hint="add its profile to the profiles CSV; known: "
                                 + ", ".join(sorted(profiles)))
        out.append(pair)
    if not out:
        raise InputError(f"{path}: no query rows", hint="add rows with job_a,job_b")
    return out


def family_of(workload: str) -> str:
    """A workload's family from its name: ``ResNet18-CIFAR-10-bs32-amp0`` -> ``ResNet18``
    (the part before the first '-'); a name without '-' is its own family."""
    return workload.split("-", 1)[0] or workload


def load_families_csv(path) -> dict[str, str]:
    """{workload: family} from a profiles CSV: its ``family`` column where filled in, else
    the name's prefix (``family_of``)."""
    out: dict[str, str] = {}
    for _lineno, row in _read_rows(path, ("workload",)):
        w = row.get("workload", "")
        if w:
            out[w] = row.get("family", "") or family_of(w)
    return out
