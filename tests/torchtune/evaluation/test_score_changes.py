"""score_changes: make demo's before/after lines say whether a score moved beyond its standard error."""

from torchtune.evaluation import score_changes


def _results(acc, stderr, n=40):
    return {"results": {"demo_mc": {"sample_len": n, "acc,none": acc, "acc_stderr,none": stderr}}}


def test_a_change_within_two_standard_errors_is_no_clear_change():
    (line,) = score_changes(_results(0.300, 0.0734), _results(0.325, 0.0750))
    assert line.startswith("lm-eval demo_mc  acc         0.300 -> 0.325")
    assert "no clear change: within two standard errors (+-0.210) over 40 questions" in line


def test_a_change_beyond_two_standard_errors_is_up_or_down():
    (up,) = score_changes(_results(0.25, 0.01), _results(0.50, 0.01))
    (down,) = score_changes(_results(0.50, 0.01), _results(0.25, 0.01))
    assert up.endswith("up by more than two standard errors (+-0.028)")
    assert down.endswith("down by more than two standard errors (+-0.028)")


def test_a_score_without_a_standard_error_or_a_base_is_printed_alone():
    after = {"results": {"t": {"exact_match,none": 0.1}}}
    assert score_changes({"results": {"t": {"exact_match,none": 0.0}}}, after) == [
        "lm-eval t        exact_match 0.000 -> 0.100"
    ]
    assert score_changes({}, after) == ["lm-eval t        exact_match - -> 0.100"]
