"""Node control: SSH connections (ssh.py), GPU polling (gpu.py, nvml.py, poller.py), and jobs on
nodes through one ``Backend`` per node (backend.py; the shell's in shell/, Slurm's in slurm/,
chosen by pools.py).  Import the submodules directly; this package imports nothing heavy."""
