"""Fuzzing the spec parser: whatever the input, it returns a Spec (whose hash and canonical JSON
exist) or raises SpecError with one line per problem, never another exception."""

import datetime as dt
import json
import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.spec.errors import SpecError
from experiments.spec.search import SEARCH_KEYS
from experiments.spec.study import TOP_KEYS, Spec, loads, validate

from .conftest import SPEC

# every value TOML can produce (tomllib has no null)
scalars = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(max_size=8),
    st.dates(), st.times(), st.datetimes(timezones=st.one_of(st.none(), st.just(dt.timezone.utc))))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)


def check(outcome) -> None:
    """The documented outcomes: a Spec usable downstream, or a SpecError of one-line problems."""
    if isinstance(outcome, SpecError):
        assert outcome.problems and all(isinstance(p, str) and p and "\n" not in p
                                        for p in outcome.problems), outcome.problems
        return
    assert isinstance(outcome, Spec)
    assert len(outcome.hash) == 64
    assert json.loads(outcome.to_json())["name"] == outcome.name


def outcome_of(fn, *args):
    try:
        return fn(*args)
    except SpecError as exc:
        return exc


def paths(table: dict, prefix=()):
    """Every key path of a nested dict."""
    for key, value in table.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from paths(value, prefix + (key,))


BASE = tomllib.loads(SPEC)
PATHS = sorted(paths(BASE))


@st.composite
def mutated(draw):
    """The valid tiny spec with a few keys set to arbitrary values, deleted or added."""
    raw = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(PATHS))
        parent = raw
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_specs_give_a_spec_or_spec_error(raw):
    check(outcome_of(validate, raw))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_gives_spec_error(text):
    check(outcome_of(loads, text))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(PATHS), values)
def test_any_value_anywhere_in_toml_text(path, value):
    # the same through the TOML text a user writes (values TOML cannot spell are skipped)
    raw = json.loads(json.dumps(BASE))
    parent = raw
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    try:
        text = _dumps(raw)
    except TypeError:
        return
    check(outcome_of(loads, text))


def _dumps(table: dict) -> str:
    """Minimal TOML writer: everything as inline values on top-level keys."""
    return "\n".join(f"{json.dumps(k)} = {_value(v)}" for k, v in table.items()) + "\n"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        return ("inf" if v > 0 else "-inf") if abs(v) == float("inf") else repr(v)
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


# allowed keys of every table of the format: a one-letter slip must name the intended key
TABLES = {
    (): TOP_KEYS,
    ("workload",): ("dataset", "dataset_options", "model", "model_options"),
    ("goal",): ("metric", "target", "comparison"),
    ("search",): ("seed",) + SEARCH_KEYS + ("optimizers",),
    ("eval",): ("kind", "every", "first", "ratio", "max_gap"),
    ("probes",): ("enabled", "batch_sizes", "points", "average", "examples", "curvature_examples",
                  "hessian_examples", "lanczos"),
    ("executor",): ("workers",),
}


@pytest.mark.parametrize("table", list(TABLES), ids=lambda t: ".".join(t) or "top")
def test_every_one_letter_slip_suggests_the_intended_key(table):
    for key in TABLES[table]:
        for i in range(len(key)):
            typo = key[:i] + key[i + 1:]
            if typo in TABLES[table]:
                continue
            raw = json.loads(json.dumps(BASE))
            parent = raw
            for name in table:
                parent = parent.setdefault(name, {})
            parent[typo] = parent.pop(key, 1)
            with pytest.raises(SpecError) as info:
                validate(raw)
            where = ".".join(table + (typo,))
            line = [p for p in info.value.problems if p.startswith(f"{where}: unknown key")]
            # "beta" is a slip of beta1 and of beta2 alike: either suggestion is right
            meant = [k for k in TABLES[table] if len(k) == len(typo) + 1
                     and any(k[:j] + k[j + 1:] == typo for j in range(len(k)))]
            assert line and any(f"did you mean {k!r}" in line[0] for k in meant), (
                typo, info.value.problems)
