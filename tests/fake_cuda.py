"""--fake-cuda's fake (tests/cuda_checks.py): torch.cuda answering as one H100 would to the
questions asked before the device is used (is_available, device_count, the name, the
compute capability, the properties: memory, multiprocessors), in the test run's own
processes and in every process they start. Whatever uses the device (a tensor on it,
set_device, a CUDA generator, NCCL) is left to torch, which has no CUDA here and raises:
that is where a test stops, at its first real CUDA call.

Imported by path, not by name, and with nothing but the standard library, so that any
Python process can load it at its start: the tests' sitecustomize.py (tests/conftest.py's,
on the PYTHONPATH every process of the run inherits) loads it where FAKE_CUDA names this
file, and install() patches torch as soon as it is imported there (the trainer a test
starts, torchrun's launcher and its ranks), without importing torch itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import SimpleNamespace
from typing import Any

FAKE_CUDA = "GPT2_TRAINER_FAKE_CUDA"  # the variable naming this file, for every process


# One H100 SXM as torch describes it (torch.cuda.get_device_properties' fields the package reads)
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=85_017_624_576,
                       multi_processor_count=132)


def patch(torch: Any) -> None:
    cuda = torch.cuda
    if not hasattr(cuda, "real_is_available"):  # the machine's own answer, kept
        cuda.real_is_available = cuda.is_available
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.get_device_name = lambda device=None: H100.name
    cuda.get_device_capability = lambda device=None: (H100.major, H100.minor)
    cuda.get_device_properties = lambda device=None: H100
    cuda.is_bf16_supported = lambda including_emulation=True: True


def real_is_available(torch: Any) -> bool:
    """Whether this machine has a GPU, the fake or not."""
    return getattr(torch.cuda, "real_is_available", torch.cuda.is_available)()


class _PatchTorchOnImport(importlib.abc.MetaPathFinder):
    """Finds torch as the other finders do, then patches it once its import has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once: the lookup below, and every later one, as usual
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """The fake in this process: at once where torch is imported, else when it is."""
    if "torch" in sys.modules:
        patch(sys.modules["torch"])
    elif not any(isinstance(f, _PatchTorchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchTorchOnImport())
