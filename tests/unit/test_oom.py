"""Which log tails are a CUDA out-of-memory error (steps/oom.py), and the reason's words."""
import pytest

from iadeep_cli.controller.round.steps import oom
from iadeep_cli.jobs import Job, JobSpec, JobState


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total)",
    "torch.cuda.OutOfMemoryError: CUDA out of memory.",
    "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
    "allocate 17179869184 bytes.",
    "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,024 bytes",
    "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
])
def test_out_of_memory_is_recognised_in_the_last_lines(line):
    assert oom.is_oom("step 1\nstep 2\n" + line + "\n")


def test_other_failures_and_old_lines_are_not():
    assert not oom.is_oom("Traceback...\nValueError: loss is nan\n")
    assert not oom.is_oom("host out of memory: Killed\n")      # the host's RAM, not the GPU's
    early = "CUDA out of memory. Tried to allocate 1 GiB\n" + "ok, retried smaller\n" * 60
    assert not oom.is_oom(early)      # it recovered: the error is no longer among the last lines


def test_the_reason_names_the_partners():
    def job(i, workload):
        return Job(i, "ann", JobSpec("/s.sh", workload=workload, name=f"j{i}"),
                   JobState.RUNNING, 0.0, node="n1", gpu_indices=(0,))
    assert oom.reason(job(3, "bert"), 1, []) == "out of GPU memory (exit code 1)"
    assert oom.reason(job(3, "bert"), 1, [job(7, "resnet50"), job(8, None)]) == (
        "out of GPU memory (exit code 1) while sharing GPU n1:0 with job 7 (resnet50), "
        "job 8 (j8)")
