"""``[pruning] criterion``, and ``method``, its name before 2026-12: read with a
DeprecationWarning naming the new key, to the same spec and hash; both at once are refused."""

import warnings

import pytest

from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY


def with_pruning(lines: str) -> str:
    return TINY.replace("[goal]", f"[pruning]\n{lines}\n\n[goal]")


def test_the_old_key_is_read_with_a_warning_to_the_same_hash():
    new = loads(with_pruning('criterion = ["snip", "magnitude"]'))
    with pytest.warns(DeprecationWarning, match="'pruning.method' is deprecated, use "
                                                "'pruning.criterion'"):
        old = loads(with_pruning('method = ["snip", "magnitude"]'))
    assert (old.hash, old.pruning_criteria) == (new.hash, ("snip", "magnitude"))
    assert [v.hash for v in old.variants()] == [v.hash for v in new.variants()]
    # the canonical JSON keeps the old name: every stored spec and hash stays as it was
    assert new.canonical()["pruning"] == {"method": "snip"}


def test_a_stored_spec_comes_back_without_a_warning():
    spec = loads(with_pruning('criterion = "magnitude"'))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = from_canonical(spec.canonical())
    assert (back.hash, back.pruning_criterion) == (spec.hash, "magnitude")


def test_both_keys_are_refused_in_one_line():
    with pytest.raises(SpecError) as err:
        loads(with_pruning('criterion = "snip"\nmethod = "snip"'))
    assert err.value.problems == ["pruning: found both criterion and its deprecated name method; "
                                  "allowed: criterion only"]
