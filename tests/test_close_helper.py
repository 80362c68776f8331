"""tests/_helpers/close.py: a tolerance scaled by the tensor's largest magnitude, and a failure that names the
worst element."""

import pytest
import torch

from tests._helpers.close import assert_all_close, assert_close, tolerance


def test_the_tolerance_is_ulps_of_the_dtype_at_the_largest_magnitude():
    expected = torch.tensor([0.5, -4.0, 1e-6])
    assert tolerance(expected, 8) == 8 * torch.finfo(torch.float32).eps * 4.0
    assert tolerance(expected, 8, dtype=torch.bfloat16) == 8 * 2**-7 * 4.0


def test_a_small_element_may_be_off_by_more_than_its_own_size_when_the_tensor_is_large():
    # a near-cancelling sum: an element-wise rtol would call this a failure, the reduction's scale does not
    expected = torch.tensor([3.0, 2e-7])
    assert_close(expected + torch.tensor([0.0, 3e-7]), expected, ulps=2)


def test_a_failure_names_the_worst_element_its_index_both_values_and_the_tolerance():
    expected = torch.zeros(3, 4)
    expected[0, 0] = 1.0
    actual = expected.clone()
    actual[2, 1] = 1e-3
    actual[1, 3] = 1e-5
    with pytest.raises(AssertionError) as error:
        assert_close(actual, expected, ulps=16, name="layers.0.w")
    message = str(error.value)
    assert "layers.0.w: 2 of 12 elements" in message and "index (2, 1)" in message
    assert "actual 0.001, expected 0" in message and "tolerance 1.91e-06" in message


def test_names_on_both_sides_must_match_and_each_is_named_when_it_fails():
    a = {"w": torch.ones(2), "b": torch.ones(2)}
    with pytest.raises(AssertionError, match="names differ"):
        assert_all_close(a, {"w": torch.ones(2)}, ulps=1)
    with pytest.raises(AssertionError, match="^b: "):
        assert_all_close({"w": torch.ones(2), "b": torch.full((2,), 2.0)}, a, ulps=1)
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(torch.tensor([float("nan")]), torch.tensor([1.0]), ulps=1)
