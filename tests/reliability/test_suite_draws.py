"""The suite's random draws are the same on every machine and in every selection of tests: the
global generators are seeded before each test module is imported and before each test
(tests/conftest.py), so a draw never depends on what was collected or ran before it."""

import random

import numpy as np
import torch

from ..conftest import SUITE_SEED

AT_IMPORT = torch.rand(4), np.random.rand(4), random.random()


def first_draws():
    """The draws the seeded global generators give first."""
    torch_draw = torch.rand(4, generator=torch.Generator().manual_seed(SUITE_SEED))
    return torch_draw, np.random.RandomState(SUITE_SEED).rand(4), random.Random(SUITE_SEED).random()


def test_a_module_draws_at_import_from_the_seeded_generators():
    torch_draw, numpy_draw, python_draw = first_draws()
    assert torch.equal(AT_IMPORT[0], torch_draw)
    np.testing.assert_array_equal(AT_IMPORT[1], numpy_draw)
    assert AT_IMPORT[2] == python_draw


def test_a_test_draws_from_the_seeded_generators():
    torch_draw, numpy_draw, python_draw = first_draws()
    assert torch.equal(torch.rand(4), torch_draw)
    np.testing.assert_array_equal(np.random.rand(4), numpy_draw)
    assert random.random() == python_draw


def test_a_test_after_one_that_drew_starts_from_the_seed_again():
    # the test above drew from all three; this one still sees the first draws
    torch_draw, numpy_draw, python_draw = first_draws()
    assert torch.equal(torch.rand(4), torch_draw)
    np.testing.assert_array_equal(np.random.rand(4), numpy_draw)
    assert random.random() == python_draw
