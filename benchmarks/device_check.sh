#!/usr/bin/env bash
# Device check: the controller's own-machine path (`local: true` node, real NVML) on a real GPU.
#
# NOT YET RUN ON A GPU. It was written in a session without one (there the NVML path is tested
# with the replaying fake in tests/fakes/pynvml, and this script was rehearsed with
# DEVICE_CHECK_DRY=1, see below; rehearsed again 2026-12-02, when it failed at step 2: its
# inventory asked for share_threshold 0.5, which the inventory rules no longer accept).  Run it
# on a machine with an NVIDIA driver and GPU, e.g. the H200 device machine, with one command
# from anywhere (about 2-4 minutes, killed at 7m50s):
#
#     bash benchmarks/device_check.sh
#
# Steps (each prints a "== step" header; the last line says PASS or FAIL with the reasons):
#   1. a venv that also sees the machine's Python packages (the device image's torch, typer,
#      nvidia-ml-py, pyyaml, numpy, scipy: nothing can be fetched there), the project installed
#      into it (offline: --no-deps --no-build-isolation); torch installed only if missing.
#   2. `iadeep nodes check --json` on an inventory with one `local: true` node (real pynvml),
#      next to nvidia-smi's own numbers for the same fields (memory.used must agree: NVML v2).
#   3. a real controller (poll_interval 1 s) on that inventory; two jobs/train_pytorch.py jobs
#      labelled `train_pytorch`: A runs alone and is profiled, then B is placed next to it on the
#      same GPU.  Prints `iadeep status --json` while both run (their processes on the GPU with
#      their job ids, read through NVML + /proc) and both jobs' observed speeds
#      (speed next to the other / speed alone), then cancels both. While they share it also
#      prints each one's SM share (NVML's per-process figure, through the poll) over its speed,
#      the estimate of its utilisation alone that sharing jobs' phase changes are judged by
#      (scheduler/detectors.solo_util; A's utilisation alone is its profile's), and runs the
#      command a remote poll runs for them, `nvidia-smi pmon -c 1 -s um -i GPU`, timed (the
#      poll waits for it), saved byte for byte as pmon.txt (pmon.cmd: the command, its exit
#      code and seconds; both belong in tests/fixtures/nvidia-smi as the real capture the
#      stand-in's derived pmon fixture stands in for) and read by the poll's parser
#      (nodes/gpu.parse_pmon), its figures for both jobs printed next to NVML's.
#
# Environment: DEVICE_CHECK_DIR (work dir, default a new /tmp/iadeep-device.*),
# DEVICE_CHECK_PYTHON (the interpreter to build the venv from; default python3), OUT (if set,
# summary.json, status.json, nodes-check.json, pmon.txt, pmon.cmd and controller.log are copied
# there),
# DEVICE_CHECK_DRY=1 (rehearsal without a GPU: the fake pynvml and jobs/steps_progress.sh
# instead of NVML and PyTorch; proves the script's plumbing only, not the GPU path).
set -uo pipefail

if [ -z "${_DEVICE_CHECK_INNER:-}" ]; then   # one hard limit for everything, cleanup included
    _DEVICE_CHECK_INNER=1 exec timeout -k 10 470 bash "$0" "$@"
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${DEVICE_CHECK_DIR:-$(mktemp -d /tmp/iadeep-device.XXXXXX)}
mkdir -p "$WORK"
rm -rf "$WORK/state" "$WORK/wd"      # a reused work dir keeps only its venv
DRY=${DEVICE_CHECK_DRY:-}
VENV=$WORK/venv
PY=$VENV/bin/python
FAILS=()
fail() { FAILS+=("$1"); echo "!! $1"; }
step() { echo; echo "== $* ($(date +%T), ${SECONDS}s)"; }

# ---------------------------------------------------------------------------------- 1. venv
step "1. venv in $VENV"
BASE_PY=${DEVICE_CHECK_PYTHON:-$(command -v python3)}
if [ ! -x "$PY" ]; then
    "$BASE_PY" -m venv --system-site-packages "$VENV" || { echo "cannot create a venv"; exit 1; }
    # python3 may itself be a venv (the device image's /opt/torch/.venv): --system-site-packages
    # would then skip its packages (torch), so point the new venv at them explicitly.
    parent=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mine=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    [ "$parent" != "$mine" ] && echo "$parent" > "$mine/_device_check_parent.pth"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=10
if ! timeout 150 "$PY" -m pip install -q --retries 0 -e "$ROOT" 2>"$WORK/pip.err"; then
    echo "pip install with dependencies failed (offline?); installing the project alone"
    timeout 120 "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" \
        2>>"$WORK/pip.err" || echo "editable install failed too: using PYTHONPATH=$ROOT"
fi
"$PY" -c 'import iadeep_cli' 2>/dev/null || export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -n "$DRY" ]; then
    export PYTHONPATH=$ROOT/tests/fakes/pynvml${PYTHONPATH:+:$PYTHONPATH}
    export FAKE_NVML_MODE=idle FAKE_NVML_GPUS=1 FAKE_NVML_JOBS_UNDER=$WORK
    JOB=("$ROOT/jobs/steps_progress.sh" -- 100000 0.02)
else
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        echo "torch missing: pip install torch"
        timeout 240 "$PY" -m pip install -q torch || fail "torch is not installed and cannot be"
    fi
    JOB=("$ROOT/jobs/train_pytorch.py" -- --steps 100000000 --batch-size 128 --report-every 50)
fi
"$PY" - <<'EOF' || fail "imports"
import importlib
for m in ("iadeep_cli", "pynvml", "typer", "yaml", "numpy", "scipy", "torch"):
    try:
        mod = importlib.import_module(m)
        print(f"{m:10} {getattr(mod, '__version__', '')} {getattr(mod, '__file__', '')}")
    except Exception as exc:  # torch is not needed by the dry run
        print(f"{m:10} MISSING ({exc})")
EOF
IADEEP=("$PY" -m iadeep_cli)
export PATH=$VENV/bin:$PATH          # jobs' `#!/usr/bin/env python3` -> this venv (torch, iadeep)
export IADEEP_HOME=$WORK/state
mkdir -p "$IADEEP_HOME"
unset IADEEP_INVENTORY IADEEP_JOB_ID

# ---------------------------------------------------------------------------------- 2. check
step "2. iadeep nodes check --json (one local node, NVML)"
INV=$WORK/nodes.yaml
cat > "$INV" <<EOF
lab:
  poll_interval: 1
  node_grace: 30
  # this checks NVML and speeds, not the policy: the loosest sharing the inventory accepts
  # (a small MLP is launch-bound, so two are predicted to share well above it anyway)
  policy: {share_threshold: 1.0, min_speed: 0.1}
nodes:
  - name: here
    local: true
    workdir: $WORK/wd
EOF
timeout 60 "${IADEEP[@]}" nodes check --json --inventory "$INV" > "$WORK/nodes-check.json"
rc=$?
cat "$WORK/nodes-check.json"
[ $rc -eq 0 ] || fail "nodes check exited $rc"
if command -v nvidia-smi >/dev/null && [ -z "$DRY" ]; then
    echo "-- nvidia-smi, same fields (MiB, %, C, W):"
    q=index,uuid,name,driver_version,memory.total,memory.used,memory.free,utilization.gpu
    q=$q,utilization.memory,temperature.gpu,power.draw,power.limit
    nvidia-smi --query-gpu=$q --format=csv,noheader,nounits | tee "$WORK/smi.txt"
fi
"$PY" - "$WORK" <<'EOF' || fail "nodes check content"
import json, sys, pathlib
work = pathlib.Path(sys.argv[1])
(node,) = json.loads((work / "nodes-check.json").read_text())
assert node["ok"] and node["gpus"], f"local node not ok: {node['error']}"
smi = work / "smi.txt"
for line in (smi.read_text().splitlines() if smi.exists() else []):
    f = [v.strip() for v in line.split(",")]
    g = next(g for g in node["gpus"] if g["index"] == int(f[0]))
    print(f"GPU {f[0]}: NVML vs nvidia-smi: name {g['name']!r}/{f[2]!r} uuid ok "
          f"{g['uuid'] == f[1]} mem total {g['memory_total_mib']:.0f}/{f[4]} used "
          f"{g['memory_used_mib']:.0f}/{f[5]} free {g['memory_free_mib']:.0f}/{f[6]}")
    assert g["name"] == f[2] and g["uuid"] == f[1], "name/uuid differ from nvidia-smi"
    assert abs(g["memory_total_mib"] - float(f[4])) <= 1, "memory.total differs"
    # used moves with other processes; a gap of the driver's reserve (~600 MiB) means NVML v1
    assert abs(g["memory_used_mib"] - float(f[5])) < 256, "memory.used differs from nvidia-smi"
print("nodes check: ok")
EOF

# ---------------------------------------------------------------------------------- 3. jobs
step "3. controller + two co-located jobs"
CTL_PID=
cleanup() {
    for pidfile in "$WORK"/wd/*/jobs/*/pid; do
        [ -f "$pidfile" ] && [ ! -f "${pidfile%/pid}/exit" ] &&
            kill -TERM -- "-$(cat "$pidfile")" 2>/dev/null
    done
    [ -n "$CTL_PID" ] && kill -TERM "$CTL_PID" 2>/dev/null && wait "$CTL_PID" 2>/dev/null
    [ -n "${OUT:-}" ] && cp "$WORK"/{summary.json,status.json,nodes-check.json,pmon.txt,pmon.cmd} \
        "$WORK/state/controller.log" "$OUT"/ 2>/dev/null
    true
}
trap cleanup EXIT
"${IADEEP[@]}" controller run --inventory "$INV" > "$WORK/state/controller.log" 2>&1 &
CTL_PID=$!
live() {   # not grep -q: an early exit would SIGPIPE status and, with pipefail, read as "no"
    "${IADEEP[@]}" status --json 2>/dev/null | grep '"live": true' >/dev/null
}
for _ in $(seq 100); do
    live && break
    kill -0 "$CTL_PID" 2>/dev/null || break
    sleep 0.3
done
live || {
    fail "controller did not start"; cat "$WORK/state/controller.log"; }
A=$("${IADEEP[@]}" queue add --name solo-first --workload train_pytorch "${JOB[@]}")
B=$("${IADEEP[@]}" queue add --name joins-later --workload train_pytorch "${JOB[@]}")
echo "submitted A=$A B=$B: ${JOB[*]}"
timeout 240 "$PY" - "$WORK" "$A" "$B" <<'EOF' || fail "co-location"
import json, shutil, subprocess, sys, time, pathlib
work, a, b = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
iadeep = [sys.executable, "-m", "iadeep_cli"]
def q(*args):
    return json.loads(subprocess.run([*iadeep, *args], capture_output=True, text=True,
                                     check=True).stdout)
start, seen, last = time.time(), {}, ""
while time.time() - start < 200:
    jobs = {j["id"]: j for j in q("queue", "list", "--all", "--json")}
    status = q("status", "--json")
    for n in status["nodes"]:
        for g in n["gpus"]:
            for p in g["processes"]:
                if p["job_id"] in (a, b):
                    seen[p["job_id"]] = g["index"]
    line = " | ".join(f"{i}: {jobs[i]['state']} gpu {jobs[i]['gpu_indices']} speed "
                      f"{jobs[i]['observed_speed']} ({jobs[i]['reason'][:60]})" for i in (a, b))
    if line != last:
        print(f"{time.time() - start:6.1f}s {line}", flush=True)
        last = line
    both = [jobs[i] for i in (a, b)]
    if (all(j["state"] == "running" for j in both) and both[0]["gpu_indices"] ==
            both[1]["gpu_indices"] and all(j["observed_speed"] is not None for j in both)
            and len(seen) == 2):
        time.sleep(10)           # let both speeds settle over a few windows
        break
    if any(j["state"] in ("succeeded", "failed", "cancelled", "lost") for j in both):
        break
    time.sleep(1)
jobs = {j["id"]: j for j in q("queue", "list", "--all", "--json")}
status = q("status", "--json")
(work / "status.json").write_text(json.dumps(status, indent=1))
print(json.dumps(status, indent=1))
# while they share: NVML's per-process SM share over each job's speed (the sharing phase
# estimate), and nvidia-smi's own per-process figures
estimates = {}
for n in status["nodes"]:
    for g in n["gpus"]:
        for p in g["processes"]:
            i, sm = p["job_id"], p.get("sm_util")
            if i in (a, b):
                speed = jobs[i]["observed_speed"]
                estimates[i] = {"sm_util": sm, "speed": speed,
                                "util_alone_estimate": round(sm / speed, 1)
                                if sm is not None and speed else None}
print("SM share / speed while sharing:", estimates)
pmon_check = None
if shutil.which("nvidia-smi"):
    # the command a remote poll runs (nodes/gpu.PMON_QUERY, -i its GPUs), timed: the poll
    # waits for it; saved byte for byte (pmon.txt, stdout only, as the fixtures are) with its
    # command and exit code beside it, and read by the poll's own parser
    from iadeep_cli.nodes.gpu import PMON_QUERY, parse_pmon
    gpu = jobs[a]["gpu_indices"][0] if jobs[a]["gpu_indices"] else 0
    cmd = [*PMON_QUERY.split(), "-i", str(gpu)]
    t0 = time.monotonic()
    pmon = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    (work / "pmon.txt").write_text(pmon.stdout)
    (work / "pmon.cmd").write_text(f"{' '.join(cmd)}\t{pmon.returncode}\t{took:.2f}s\n"
                                   + pmon.stderr)
    print(f"$ {' '.join(cmd)}  (exit {pmon.returncode}, {took:.2f} s)")
    print(pmon.stdout + pmon.stderr)
    figures = parse_pmon(pmon.stdout)
    pids = {p["pid"]: p["job_id"] for n in status["nodes"] for g in n["gpus"]
            for p in g["processes"] if p["job_id"] in (a, b)}
    pmon_check = {"seconds": round(took, 2), "exit": pmon.returncode,
                  "jobs": {pids[pid]: {"pmon_sm": u.sm, "pmon_mem": u.mem}
                           for (i, pid), u in figures.items() if pid in pids}}
    print("pmon's figures for the jobs, as the remote poll reads them:", pmon_check)
    if not pmon_check["jobs"]:
        print("WARNING: pmon gave no figure for either job's process")
summary = {"elapsed_s": round(time.time() - start, 1), "seen_on_gpu": seen,
           "sharing_estimates": estimates, "pmon": pmon_check,
           "jobs": {i: {k: jobs[i][k] for k in ("state", "node", "gpu_indices",
                                                 "observed_speed", "predicted_speed", "reason")}
                    for i in (a, b)},
           "profile": None}
try:
    summary["profile"] = q("profile", "show", "train_pytorch", "--json")
except subprocess.CalledProcessError as exc:
    print("no profile train_pytorch:", exc.stderr.strip())
(work / "summary.json").write_text(json.dumps(summary, indent=1))
print("observed speeds:", {i: jobs[i]["observed_speed"] for i in (a, b)},
      "predicted:", {i: jobs[i]["predicted_speed"] for i in (a, b)})
print("profile train_pytorch:", summary["profile"])
assert set(seen) == {a, b}, f"job processes seen on the GPU through NVML: {seen}"
assert jobs[a]["gpu_indices"] == jobs[b]["gpu_indices"], "A and B were not co-located"
assert all(jobs[i]["observed_speed"] is not None for i in (a, b)), "no observed speed"
EOF
"${IADEEP[@]}" queue cancel "$A" >/dev/null 2>&1
"${IADEEP[@]}" queue cancel "$B" >/dev/null 2>&1
sleep 3
echo "-- controller log (tail):"
tail -n 15 "$WORK/state/controller.log"

echo
if [ ${#FAILS[@]} -eq 0 ]; then
    echo "PASS (${SECONDS}s; work dir $WORK)"
else
    echo "FAIL: ${FAILS[*]} (${SECONDS}s; work dir $WORK)"
    exit 1
fi
