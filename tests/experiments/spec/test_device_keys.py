"""``[workload] device`` and ``precision``: checked in one line each; the device stays out of the
spec hash and the group keys (where a study trains does not change what it measures), a
precision other than fp32 enters both (it changes the results); both round-trip."""

import json

import pytest

from experiments.spec.plan import plan
from experiments.spec.study import SpecError, from_canonical, loads

from ..conftest import TINY


def with_workload(*lines: str) -> str:
    return TINY.replace('model = "mlp"\n', 'model = "mlp"\n' + "".join(f"{x}\n" for x in lines))


def test_defaults_are_cpu_and_fp32_and_leave_the_hash_alone():
    spec = loads(TINY)
    assert (spec.device, spec.precision) == ("cpu", "fp32")
    explicit = loads(with_workload('device = "cpu"', 'precision = "fp32"'))
    assert explicit.hash == spec.hash
    assert [g.key for g in plan(explicit)] == [g.key for g in plan(spec)]
    assert "precision" not in spec.to_json() and "device" not in spec.to_json()


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_the_device_is_not_in_the_hash_nor_the_group_keys(device):
    """The spec is valid on a machine without the GPU (it is read there for its report)."""
    spec, gpu = loads(TINY), loads(with_workload(f'device = "{device}"'))
    assert gpu.device == device and gpu.hash == spec.hash
    assert [g.key for g in plan(gpu)] == [g.key for g in plan(spec)]


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_a_precision_other_than_fp32_enters_the_hash_and_every_group_key(precision):
    spec, other = loads(TINY), loads(with_workload(f'precision = "{precision}"'))
    assert other.hash != spec.hash
    assert not set(g.key for g in plan(other)) & set(g.key for g in plan(spec))
    assert json.loads(plan(other)[0].config_json)["workload"]["precision"] == precision
    back = from_canonical(json.loads(other.to_json()), other.toml)
    assert back.precision == precision and back.hash == other.hash


def test_variants_keep_device_and_precision():
    spec = loads(with_workload('device = "cuda"', 'precision = "bf16"').replace(
        'optimizer = "momentum"', 'optimizer = ["sgd", "momentum"]'))
    assert {(v.device, v.precision) for v in spec.variants()} == {("cuda", "bf16")}


@pytest.mark.parametrize("lines, message", [
    (['device = "gpu"'], "workload.device: found 'gpu'; allowed: cpu, cuda, cuda:N"),
    (['precision = "fp16"'], "workload.precision: found 'fp16' (did you mean 'bf16'?); "
                             "allowed: fp32, tf32, bf16"),
    (['device = "tpu"', 'precision = 16'], "workload.device: found 'tpu'"),
])
def test_bad_values_are_one_line_each(lines, message):
    with pytest.raises(SpecError) as info:
        loads(with_workload(*lines))
    assert message in info.value.problems[0]
    assert len(info.value.problems) == len(lines)
