"""The tensor-parallel plan torchtune's Llama 3.x configs name (``tensor_parallel_plan``).

This library shards with FSDP2 only: the recipes accept the key and say that tensor parallelism is not applied.
The plan exists so those configs resolve, and so code that builds its own device mesh can use it on our models:
its keys are our module paths (checked by a test against a built model).
"""

from __future__ import annotations

from typing import Any, Dict


def base_llama_tp_plan() -> Dict[str, Any]:
    """``{module path pattern: ParallelStyle}`` for a Llama 3.x decoder (shared by 3.1, 3.2 and 3.3): the
    embedding row-wise and the output projection column-wise with replicated activations; in each layer q/k/v
    and the MLP's w1/w3 column-wise, the attention output and w2 row-wise."""
    # imported here: DTensor's parallel styles pull in torch.distributed's tensor machinery (about a second)
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
        "layers.*.attn.q_proj": ColwiseParallel(),
        "layers.*.attn.k_proj": ColwiseParallel(),
        "layers.*.attn.v_proj": ColwiseParallel(),
        "layers.*.attn.output_proj": RowwiseParallel(),
        "layers.*.mlp.w1": ColwiseParallel(),
        "layers.*.mlp.w2": RowwiseParallel(),
        "layers.*.mlp.w3": ColwiseParallel(),
    }
