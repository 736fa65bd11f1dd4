"""Interference data measured in this lab: workload profiles and co-location speeds.

These take precedence over the shipped H200 data for their GPU model when the model is fitted.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict

from ..model.profiles import CoLocation, Profile


def upsert_profile(conn: sqlite3.Connection, profile: Profile, now: float,
                   source: str = "measured") -> None:
    conn.execute(
        "INSERT INTO profiles (gpu_model, workload, data, source, updated_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(gpu_model, workload) DO UPDATE SET "
        "data=excluded.data, source=excluded.source, updated_at=excluded.updated_at",
        (profile.gpu_model, profile.workload, json.dumps(asdict(profile)), source, now))


def load_profiles(conn: sqlite3.Connection) -> list[tuple[Profile, str, float]]:
    """(profile, source, updated_at) for every stored profile."""
    rows = conn.execute("SELECT data, source, updated_at FROM profiles ORDER BY workload")
    return [(Profile(**json.loads(r["data"])), r["source"], r["updated_at"]) for r in rows]


def add_colocation(conn: sqlite3.Connection, obs: CoLocation, now: float) -> None:
    conn.execute("INSERT INTO colocations (gpu_model, jobs, speeds, samples, observed_at) "
                 "VALUES (?, ?, ?, ?, ?)",
                 (obs.gpu_model, json.dumps(list(obs.jobs)), json.dumps(list(obs.speeds)),
                  obs.samples, now))


def load_colocations(conn: sqlite3.Connection) -> list[CoLocation]:
    rows = conn.execute("SELECT gpu_model, jobs, speeds, samples FROM colocations ORDER BY id")
    return [CoLocation(r["gpu_model"], tuple(json.loads(r["jobs"])),
                       tuple(json.loads(r["speeds"])), r["samples"]) for r in rows]
