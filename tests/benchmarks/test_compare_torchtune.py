"""benchmarks/compare_torchtune.py's extra variants: how ``--extra NAME:SPEC`` becomes config
overrides (applied as ``tune run`` applies them) and environment settings."""

import pytest

from benchmarks.compare_torchtune import our_config, parse_extra


def test_extra_splits_config_overrides_from_environment_settings():
    extra = parse_extra("no logging: log_every_n_steps=1000; loss.num_output_chunks=1 ;env:MALLOC_MMAP_MAX_=65536")
    assert extra == {
        "name": "no logging",
        "overrides": ["log_every_n_steps=1000", "loss.num_output_chunks=1"],
        "env": {"MALLOC_MMAP_MAX_": "65536"},  # environment values stay strings
    }


@pytest.mark.parametrize("text", ["log_every_n_steps=1000", ":a=1", "name:a", "name:env:VAR", "name:=1"])
def test_extra_without_a_name_or_with_an_item_not_key_value_is_refused(text):
    with pytest.raises(SystemExit, match="--extra"):
        parse_extra(text)


def test_overrides_are_the_recipes_own_grammar():
    cfg = {"loss": {"_component_": "L", "num_output_chunks": 8}, "seed": 1}
    out = our_config(cfg, ["loss.num_output_chunks=1", "+optimizer={fused: false}", "seed=2"])
    assert out == {"loss": {"_component_": "L", "num_output_chunks": 1}, "optimizer": {"fused": False}, "seed": 2}
    # a key the config lacks is added without a +, as torchtune's command line adds it (the recipe's checks
    # then name a misspelled one)
    assert our_config(cfg, ["loss.num_output_chunk=1"])["loss"] == {
        "_component_": "L",
        "num_output_chunks": 8,
        "num_output_chunk": 1,
    }
