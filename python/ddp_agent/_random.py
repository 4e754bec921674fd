"""The random state a step started with, so that its retry in process draws what its failed attempt drew.

A retried step that drew other numbers than its failed attempt (dropout,
random augmentation on the GPU or the CPU) ended with other parameters than
the uninterrupted run's (a review's dropout run). torch's generators are
kept, as ``torch.utils.checkpoint`` keeps them for its recomputed forward:
the CPU's and, for a model on a GPU, that device's. Python's ``random`` and
NumPy's belong to the script (docs/in-process.md, Limits).
"""

from typing import Optional, Tuple

import torch


class StepRandom:
    """torch's random state at the start of the last step this rank entered."""

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self._cpu: Optional[torch.Tensor] = None
        self._cuda: Optional[Tuple[torch.device, torch.Tensor]] = None

    def save(self, step: int, device: Optional[torch.device]) -> None:
        """Keeps the state as step starts; device is the model's (its generator too, on a GPU)."""
        self.step = step
        self._cpu = torch.get_rng_state()  # a copy of 5 KB: a few µs a step
        # A GPU's is its seed and offset, read without a sync.
        self._cuda = (device, torch.cuda.get_rng_state(device)) if device is not None and device.type == "cuda" else None

    def restore(self, step: int) -> bool:
        """Puts back the state that step started with, if step is the one saved, and says whether it did.

        A retry of another step (the one after a step that some rank
        completed) starts where this rank's generators are.
        """
        if self.step != step or self._cpu is None:
            return False
        torch.set_rng_state(self._cpu)
        if self._cuda is not None:
            device, state = self._cuda
            torch.cuda.set_rng_state(state, device)
        return True
