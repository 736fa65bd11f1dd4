#!/bin/bash
# From the project's Slurm notes (tests/helpers/slurm.py starts it for the Slurm backend tests).
# Bring up a single-machine Slurm 22.05 "cluster" (munged + slurmctld + slurmd) without systemd.
# Fake GPUs: character device nodes (major 195 like /dev/nvidiaN) under $T/dev, typed per GPU (g0, g1, ...)
# so a job can be pinned to one GPU with --gres=gpu:gN:1 or --gres=shard:gN:K.
# Usage (as root): T=$(mktemp -d) NGPU=2 SHARDS=4 [NNODES=2] [ACCT=dbd] bash up.sh
# NNODES=1 (default): one node named $(hostname -s). NNODES>1: nodes n1..nN, one slurmd -N nK each (ports 17001..).
#   apt: slurmctld slurmd slurm-client munge   (+ slurmdbd mariadb-server for ACCT=dbd)
# ACCT=dbd additionally starts a private MariaDB (127.0.0.1:3307) + slurmdbd (127.0.0.1:6819) so sacct works.
set -euo pipefail
T=${T:?set T to a new directory}; NGPU=${NGPU:-2}; SHARDS=${SHARDS:-4}; ACCT=${ACCT:-none}; NNODES=${NNODES:-1}; HOST=$(hostname -s)
ms() { echo $(( ($2-$1)/1000000 )); }
t0=$(date +%s%N)
mkdir -p $T/munge/etc $T/munge/run $T/munge/lib $T/etc $T/spool/ctld $T/spool/d $T/log $T/run $T/dev $T/jobs
chmod 755 $T $T/munge $T/munge/run; chmod 700 $T/munge/etc; chmod 1777 $T/jobs   # munged: socket dir must be a+x

# --- munge (own key + own socket, nothing in /etc touched)
dd if=/dev/urandom of=$T/munge/etc/munge.key bs=1024 count=1 status=none; chmod 600 $T/munge/etc/munge.key
munged -F --key-file=$T/munge/etc/munge.key --socket=$T/munge/run/munge.sock \
  --pid-file=$T/munge/run/munged.pid --seed-file=$T/munge/lib/seed --log-file=$T/log/munged.log \
  >$T/log/munged.fg 2>&1 </dev/null & echo $! >$T/run/munged.bgpid
for i in $(seq 50); do [ -S $T/munge/run/munge.sock ] && break; sleep 0.1; done
munge -S $T/munge/run/munge.sock -n | unmunge -S $T/munge/run/munge.sock >/dev/null

# --- accounting
if [ "$ACCT" = dbd ]; then
  mkdir -p $T/db
  mariadb-install-db --datadir=$T/db --user=root --auth-root-authentication-method=socket --skip-test-db >$T/log/mariadb-install.log 2>&1
  mariadbd --user=root --datadir=$T/db --socket=$T/run/mysql.sock --port=3307 --bind-address=127.0.0.1 \
    --pid-file=$T/run/mariadb.pid --log-error=$T/log/mariadb.err --skip-name-resolve --innodb-buffer-pool-size=64M \
    </dev/null >/dev/null 2>&1 & echo $! >$T/run/mariadbd.bgpid
  for i in $(seq 100); do mariadb-admin --socket=$T/run/mysql.sock ping >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb --socket=$T/run/mysql.sock -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmci'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  printf '%s\n' AuthType=auth/munge "AuthInfo=socket=$T/munge/run/munge.sock" DbdHost=localhost DbdAddr=127.0.0.1 \
    DbdPort=6819 SlurmUser=root "PidFile=$T/run/slurmdbd.pid" "LogFile=$T/log/slurmdbd.log" DebugLevel=info \
    StorageType=accounting_storage/mysql StorageHost=127.0.0.1 StoragePort=3307 StorageUser=slurm \
    StoragePass=slurmci StorageLoc=slurm_acct_db >$T/etc/slurmdbd.conf
  chmod 600 $T/etc/slurmdbd.conf   # slurmdbd refuses a world-readable file; it has no -f: found next to $SLURM_CONF
  SLURM_CONF=$T/etc/slurm.conf slurmdbd -D >$T/log/slurmdbd.fg 2>&1 </dev/null & echo $! >$T/run/slurmdbd.bgpid
  for i in $(seq 300); do
    kill -0 $(cat $T/run/slurmdbd.bgpid) 2>/dev/null || { echo "slurmdbd died:"; tail -n 5 $T/log/slurmdbd.fg; exit 1; }
    (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.1; done
  ACCT_CONF="JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu,gres/shard
AccountingStoragePass=$T/munge/run/munge.sock"   # = munge socket for the dbd connection (AuthInfo is not used for it)
else
  ACCT_CONF="JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none"
fi
ta=$(date +%s%N)

# --- fake GPUs + config
if [ "$NNODES" = 1 ]; then NODES="$HOST"; else NODES=$(seq -f 'n%g' 1 $NNODES | tr '\n' ' '); fi
echo "AutoDetect=off" >$T/etc/gres.conf; NODE_LINES=""; k=0; dev=0
for n in $NODES; do
  k=$((k+1)); GRES_NODE=""
  for i in $(seq 0 $((NGPU-1))); do      # per node: GPU types g0..g(NGPU-1), each its own fake device node
    [ -e $T/dev/nvidia$dev ] || mknod $T/dev/nvidia$dev c 195 $dev
    echo "NodeName=$n Name=gpu Type=g$i File=$T/dev/nvidia$dev" >>$T/etc/gres.conf
    echo "NodeName=$n Name=shard Type=g$i Count=$SHARDS File=$T/dev/nvidia$dev" >>$T/etc/gres.conf
    GRES_NODE="$GRES_NODE,gpu:g$i:1,shard:g$i:$SHARDS"; dev=$((dev+1))
  done
  if [ "$NNODES" = 1 ]; then PORT=""; else PORT="NodeHostname=$HOST Port=$((17000+k)) "; mkdir -p $T/spool/d-$n; fi
  NODE_LINES="$NODE_LINES
NodeName=$n NodeAddr=127.0.0.1 ${PORT}CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=4000 Gres=${GRES_NODE#,} State=UNKNOWN"
done
if [ "$NNODES" = 1 ]; then SFX=""; else SFX="-%n"; fi
cat >$T/etc/slurm.conf <<EOF
ClusterName=iadeepci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/run/munge.sock
StateSaveLocation=$T/spool/ctld
SlurmdSpoolDir=$T/spool/d$SFX
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd$SFX.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd$SFX.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
$ACCT_CONF
JobCompType=jobcomp/filetxt
JobCompLoc=$T/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SlurmdParameters=config_overrides
GresTypes=gpu,shard
$NODE_LINES
PartitionName=debug Nodes=$(echo $NODES | tr ' ' ',') Default=YES MaxTime=INFINITE State=UP
EOF
echo "export SLURM_CONF=$T/etc/slurm.conf" >$T/env.sh
export SLURM_CONF=$T/etc/slurm.conf
t1=$(date +%s%N)

# --- daemons (-D: stay in foreground; we background them and keep the pids)
slurmctld -D -f $SLURM_CONF >$T/log/slurmctld.fg 2>&1 </dev/null & echo $! >$T/run/slurmctld.bgpid
for i in $(seq 100); do
  kill -0 $(cat $T/run/slurmctld.bgpid) 2>/dev/null || { echo "slurmctld died:"; tail -n 5 $T/log/slurmctld.fg; exit 1; }
  timeout 2 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
t2=$(date +%s%N)
for n in $NODES; do
  if [ "$NNODES" = 1 ]; then b=slurmd; a=""; else b=slurmd-$n; a="-N $n"; fi
  slurmd -D $a -f $SLURM_CONF >$T/log/$b.fg 2>&1 </dev/null & echo $! >$T/run/$b.bgpid
done
s=""
for i in $(seq 150); do
  for f in $T/run/slurmd.bgpid $T/run/slurmd-*.bgpid; do [ -f $f ] || continue; kill -0 $(cat $f) 2>/dev/null || { echo "$f died:"; tail -n 5 $T/log/$(basename $f .bgpid).fg; exit 1; }; done
  s=$(timeout 2 sinfo -h -o %t 2>/dev/null | sort -u | tr '\n' ' ' || true); [ "$s" = "idle " ] && break; sleep 0.1; done
t3=$(date +%s%N)
[ "$s" = "idle " ] || { echo "nodes not idle: $s"; exit 1; }
echo "up: munge+acct($ACCT) $(ms $t0 $ta) ms, config $(ms $ta $t1) ms, slurmctld $(ms $t1 $t2) ms, slurmd->idle $(ms $t2 $t3) ms, total $(ms $t0 $t3) ms"
