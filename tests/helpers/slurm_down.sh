#!/bin/bash
# From the project's Slurm notes (tests/helpers/slurm.py starts it for the Slurm backend tests).
# Stop what up.sh started, by pid only, then remove $T.
T=${T:?set T to a new directory}
alive() { [ -d /proc/$1 ] && ! grep -q '^[0-9]* ([^)]*) Z' /proc/$1/stat 2>/dev/null; }   # zombie = gone
t0=$(date +%s%N)
# 1) cancel every job and wait until none is left running/completing: slurmstepd and the job's
#    processes survive a slurmd shutdown, so they must be ended through Slurm first
if [ -f $T/env.sh ]; then . $T/env.sh
  jobs=$(timeout 5 squeue -h -o %i 2>/dev/null || true)
  [ -n "$jobs" ] && timeout 5 scancel $jobs
  for i in $(seq 100); do [ -z "$(timeout 5 squeue -h -t R,CG,S -o %i 2>/dev/null)" ] && break; sleep 0.1; done
fi
for f in $T/run/slurmd.bgpid $T/run/slurmd-*.bgpid $T/run/slurmctld.bgpid $T/run/slurmdbd.bgpid $T/run/mariadbd.bgpid $T/run/munged.bgpid; do
  [ -f $f ] || continue; p=$(cat $f); d=$(basename $f .bgpid)
  alive $p && kill -TERM $p
  for i in $(seq 150); do alive $p || break; sleep 0.1; done
  if alive $p; then echo "$d ($p) ignored SIGTERM for 15s, SIGKILL"; kill -KILL $p; else echo "$d ($p) stopped"; fi
  wait $p 2>/dev/null || true
done
# job processes left behind? (all jobs run under slurmstepd, which slurmd's shutdown does not kill)
left=$(ps -eo pid=,stat=,comm= | awk '$3=="slurmstepd" && $2 !~ /Z/ {print $1}')
[ -n "$left" ] && echo "WARNING: slurmstepd still running: $left"
rm -rf $T
echo "down: $(( ($(date +%s%N)-t0)/1000000 )) ms"
