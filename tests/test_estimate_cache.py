"""tests/_helpers/estimate_memory.py: a stored estimate is used only while the code that ran for it, its config
and the packages are unchanged, and a stale one past the session's budget names `make test-estimates`."""

from __future__ import annotations

import textwrap

import pytest

from tests._helpers import estimate_memory as em

SOURCE = '''
"""A module."""
LIMIT = 3


def f(x):
    """Doubles."""
    def inner(y):
        return y + 1
    return 2 * x  # a comment


class C:
    def g(self):
        return LIMIT
'''


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository of one module, ``torchtune/m.py``, as the helper sees it."""
    (tmp_path / "torchtune").mkdir()
    monkeypatch.setattr(em, "REPO", tmp_path)

    def write(text: str) -> None:
        (tmp_path / "torchtune" / "m.py").write_text(textwrap.dedent(text))
        em._scopes.cache_clear()
        em._scope_digest.cache_clear()

    write(SOURCE)
    yield write
    em._scopes.cache_clear()
    em._scope_digest.cache_clear()


def _digests():
    scopes = ["f", "f.inner", "C", "C.g", "<module>"]
    return {q: em._scope_digest("torchtune/m.py", q) for q in scopes}


def test_only_a_change_to_code_that_ran_changes_its_digest(repo):
    before = _digests()
    repo(SOURCE.replace("# a comment", "# another").replace('"""Doubles."""', '"""Twice x."""'))
    assert _digests() == before  # comments and docstrings
    repo("\n\n" + SOURCE)
    assert _digests() == before  # lines moved
    repo(SOURCE.replace("y + 1", "y + 2"))
    changed = _digests()
    assert changed["f.inner"] != before["f.inner"] and changed["f"] == before["f"]  # a nested body: its own
    repo(SOURCE.replace("return 2 * x", "return 3 * x"))
    assert _digests()["f"] != before["f"] and _digests()["C.g"] == before["C.g"]
    repo(SOURCE.replace("LIMIT = 3", "LIMIT = 4"))
    assert _digests()["<module>"] != before["<module>"] and _digests()["f"] == before["f"]
    repo(SOURCE.replace("def f(x):", "def f(x, z=1):"))
    assert _digests()["f"] != before["f"] and _digests()["<module>"] == before["<module>"]  # f's own
    repo(SOURCE.replace("def f(x):", "@cache\ndef f(x):"))
    assert _digests()["<module>"] != before["<module>"]  # a decorator runs where the function is defined
    repo(SOURCE + "\n\ndef helper():\n    return 1\n\n\nclass D:\n    pass\n")
    assert _digests() == before  # a new helper or class changes no scope that ran
    repo(SOURCE.replace("class C:", "class C:\n    def h(self):\n        return 0\n"))
    assert _digests()["C"] != before["C"] and _digests()["<module>"] == before["<module>"]  # a method can override


def test_a_code_object_maps_to_its_scope():
    scopes = em._Scopes(em.ast.parse(textwrap.dedent(SOURCE)))
    assert scopes.qualname(6, "f") == "f" and scopes.qualname(8, "inner") == "f.inner"
    assert scopes.qualname(9, "<lambda>") == "f.inner"  # a lambda or comprehension runs in its scope
    assert scopes.qualname(1, "<module>") == "<module>" and scopes.qualname(14, "g") == "C.g"


def test_the_key_follows_the_dependencies_and_a_missing_one_makes_it_stale(repo, monkeypatch):
    monkeypatch.setattr(em, "_config_text", lambda command: "model: x")
    deps = [["torchtune/m.py", "f"], ["torchtune/m.py", "<module>"]]
    key = em.key("tune estimate-memory --config x", deps)
    repo(SOURCE.replace("return LIMIT", "return LIMIT + 1"))  # C.g did not run
    assert em.key("tune estimate-memory --config x", deps) == key
    repo(SOURCE.replace("return 2 * x", "return 3 * x"))
    assert em.key("tune estimate-memory --config x", deps) != key
    repo(SOURCE.replace("def f(x):", "def h(x):").replace("return 2 * x", "return 2 * x"))
    assert em.key("tune estimate-memory --config x", deps) is None
    monkeypatch.setattr(em, "_config_text", lambda command: "model: y")
    repo(SOURCE)
    assert em.key("tune estimate-memory --config x", deps) != key  # the config


def test_a_stale_output_past_the_budget_names_make_test_estimates(monkeypatch):
    command = "tune estimate-memory --config llama2/7B_full_low_memory --seq-len 512"
    stored = {command: {"key": "not today's", "cpu_s": 12.0, "output": "total 1.00 GB", "dependencies": []}}
    monkeypatch.setattr(em, "_stored", lambda: stored)
    monkeypatch.setattr(em, "REFRESH", False)
    monkeypatch.setattr(em, "BUDGET_S", 0.0)
    with pytest.raises(em.StaleEstimate, match="is stale.*Run `make test-estimates`"):
        em.printed.__wrapped__(command)
    stored[command]["key"] = em.key(command, [])
    assert em.printed.__wrapped__(command) == "total 1.00 GB"  # fresh: used, nothing run


def test_the_key_holds_for_another_build_of_the_same_torch_release(repo, monkeypatch):
    monkeypatch.setattr(em, "_config_text", lambda command: "model: x")
    deps = [["torchtune/m.py", "f"]]

    def key_with(torch_version: str):
        monkeypatch.setattr(em, "_versions", lambda: {"torch": torch_version})
        return em.key("tune estimate-memory --config x", deps)

    assert key_with("2.13.0+cpu") == key_with("2.13.0+cu130") == key_with("2.13.0")
    assert key_with("2.14.0+cpu") != key_with("2.13.0+cpu")
