#!/usr/bin/env python3
"""A stand-in training job whose speed really drops while another one shares its "GPU".

No GPU here, so contention is emulated: every running copy touches its own heartbeat file in a
directory the copies sharing one GPU are given (``DIR``) before each iteration, and counts the
other copies whose heartbeat is fresh (under ``FRESH_S`` old).  Alone an iteration takes
``SOLO_S``; with company ``SHARED_S``, so two together reach 0.25 + 0.25 = 0.5 of their solo
speeds: worse than running one after the other.  A copy that is stopped (SIGSTOP) stops
touching its heartbeat, so its partner soon runs alone again at full speed: the behaviour of
time-sliced GPU sharing that run-time adaptation must detect and undo.

It reports ``<time> <iterations>`` to $IADEEP_PROGRESS_FILE (``iadeep_cli.progress``'s format,
written here without importing iadeep: the node need not have it) and exits 0 after ``ITERS``
iterations, printing ``done``.  Usage: contention.py DIR ITERS [CHECKPOINT]

With CHECKPOINT (a file name, relative to the working directory) it also behaves as a job
submitted with ``--checkpoint-signal USR1``: on SIGUSR1 (or SIGTERM) it writes its iteration
count there (``CHECKPOINT.saving`` exists while it saves, ``SAVE_S``, and for as long after as
a test keeps a ``CHECKPOINT.hold`` file, at most ``HOLD_S``) and exits 0 (``checkpointed at N``);
started again, it resumes from that count (``resumed from N``).

With ``CONTENTION_PHASE=N:SECONDS`` in its environment it changes phase: from iteration N on,
an iteration alone takes SECONDS instead of ``SOLO_S`` (a job whose rate alone really moves, for
the phase-change detection).
"""
import os
import signal
import sys
import time

asked = False


def _ask(signum, frame):
    global asked
    asked = True

SOLO_S = 0.01        # seconds per iteration alone: 100 it/s
SHARED_S = 0.04      # with a partner: 25 it/s, speed 0.25
FRESH_S = 0.5        # a heartbeat older than this is a stopped or finished partner
REPORT_EVERY = 5     # iterations between progress lines
SAVE_S = 1.5         # writing a checkpoint takes this long (as saving a model does)
HOLD_S = 300.0       # the longest a CHECKPOINT.hold file keeps a save going


def main() -> int:
    where, total = sys.argv[1], int(sys.argv[2])
    os.makedirs(where, exist_ok=True)
    me = os.environ.get("IADEEP_JOB_ID", str(os.getpid()))
    beat = os.path.join(where, me)
    progress = os.environ.get("IADEEP_PROGRESS_FILE")
    done = 0
    checkpoint = sys.argv[3] if len(sys.argv) > 3 else None
    phase_at, phase_s = (os.environ.get("CONTENTION_PHASE") or f"{total + 1}:{SOLO_S}").split(":")
    if checkpoint:
        signal.signal(signal.SIGUSR1, _ask)
        signal.signal(signal.SIGTERM, _ask)   # as preemptible trainers do: TERM saves too
        if os.path.exists(checkpoint):
            with open(checkpoint) as f:
                done = int(f.read())
            print(f"resumed from {done}", flush=True)
    while done < total:
        if asked:
            os.unlink(beat)
            with open(checkpoint + ".saving", "w"):   # tests watch for this
                pass
            time.sleep(SAVE_S)
            held = time.time() + HOLD_S   # a test acting mid-save holds it there
            while os.path.exists(checkpoint + ".hold") and time.time() < held:
                time.sleep(0.05)
            with open(checkpoint + ".tmp", "w") as f:
                f.write(str(done))
            os.replace(checkpoint + ".tmp", checkpoint)
            print(f"checkpointed at {done}", flush=True)
            return 0
        now = time.time()
        with open(beat, "w"):
            pass
        others = 0
        for name in os.listdir(where):
            if name == me:
                continue
            try:
                others += now - os.path.getmtime(os.path.join(where, name)) < FRESH_S
            except FileNotFoundError:   # a partner just finished
                pass
        alone_s = float(phase_s) if done >= int(phase_at) else SOLO_S
        time.sleep(SHARED_S if others else alone_s)
        done += 1
        if progress and done % REPORT_EVERY == 0:
            with open(progress, "a") as f:
                f.write(f"{time.time():.3f} {done}\n")
    os.unlink(beat)
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
