"""torchtune 0.6.1's 38 full-finetune configs of the families this library ships, as torchtune publishes them
(read from its wheel: tests/_helpers/torchtune_wheel.py), accepted by `tune validate` and run by `tune run`.

`tune validate --config-only` checks each one, all in this process: the generic checks (every component,
its arguments), then the checks of the recipe its launch line names. The runs are in
test_torchtune_config_runs.py.
"""

from __future__ import annotations

import pytest

from tests._helpers.torchtune_wheel import CONFIGS, extract_configs
from torchtune import _recipe_registry as registry
from torchtune._cli.tune import main


@pytest.fixture(scope="module")
def torchtune_configs(tmp_path_factory):
    return extract_configs(tmp_path_factory.mktemp("torchtune_configs"))


def test_the_38_configs_and_the_recipe_each_launch_line_names(torchtune_configs):
    assert len(torchtune_configs) == 38
    named = {name: registry.launch_line_recipe(path) for name, path in torchtune_configs.items()}
    assert named == CONFIGS


def test_validate_accepts_every_config_as_torchtune_ships_it(torchtune_configs, capsys):
    refused = {}
    for name, path in torchtune_configs.items():
        try:
            code = main(["validate", str(path), "--config-only"])
        except SystemExit as exc:  # an argparse error
            code = exc.code
        out, err = capsys.readouterr()
        if code != 0 or f"passes the checks of the {CONFIGS[name]} recipe" not in out:
            refused[name] = " ".join(err.split())[:600]
    assert not refused, f"{len(refused)} of 38 refused:\n" + "\n".join(f"{n}: {e}" for n, e in refused.items())
