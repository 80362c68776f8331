"""torchtune's ``set_seed`` (implemented in ``torchtune.utils._seed``, beside the RNG state a resume restores)."""

from torchtune.utils._seed import set_seed

__all__ = ["set_seed"]
