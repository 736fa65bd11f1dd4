"""Node control: SSH connections (ssh.py), GPU polling (gpu.py, nvml.py, poller.py) and jobs on
nodes (launcher.py).  Import the submodules directly; this package imports nothing heavy."""
