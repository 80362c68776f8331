"""torchtune's tensor-parallel plan for Llama 3.x names modules our decoder has."""

import fnmatch

from torchtune.models.llama3 import base_llama_tp_plan, llama3


def test_every_plan_entry_names_modules_of_our_llama3():
    model = llama3(vocab_size=64, num_layers=2, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=32)
    names = [n for n, _ in model.named_modules()]
    plan = base_llama_tp_plan()
    assert len(plan) == 9
    for pattern in plan:
        assert fnmatch.filter(names, pattern), f"{pattern} matches no module of the model"
