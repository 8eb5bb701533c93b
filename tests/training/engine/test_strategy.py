"""The per-strategy: which program runs a (model, batch size) cell and how it is chunked."""

import pytest
import torch
from torch import nn

import training
from training.engine import strategy
from training.engine import compiled_kernel as kernels
from training.engine.strategy import even_chunks, ruled_strategy
from training.engine.programs.fused import encode, working_set
from training.engine.strategy import trials_per_stack
from training.models import count_parameters
from training.models.features import activation_floats

# skipped without the kernel; failed instead under SPARSESCALE_REQUIRE_KERNEL=1 (tests/conftest.py)
needs_kernel = pytest.mark.usefixtures("compiled_kernel")


@pytest.fixture(scope="module")
def images():
    x = torch.zeros(80, 3, 32, 32)
    y = torch.zeros(80, dtype=torch.long)
    return training.Dataset("blank", "classification", x[:64], y[:64], x[64:], y[64:], 10,
                            (3, 32, 32))


@pytest.mark.parametrize("batch_size, limit, chunk", [
    (64, 56, 32), (64, 64, 64), (64, 1000, 64), (10, 3, 3), (9, 3, 3), (7, 1, 1), (5, 0, 1)])
def test_even_chunks(batch_size, limit, chunk):
    assert even_chunks(batch_size, limit) == chunk


@needs_kernel
@pytest.mark.parametrize("name", ["mlp", "cnn1d", "linear"])
def test_sequential_models_take_the_fused_kernel(mnist1d_small, name):
    net = training.models.build(name, mnist1d_small)
    plan = ruled_strategy(net, mnist1d_small.task, (40,), 64, 300)
    assert plan.name == "fused" and plan.trials_per_stack == strategy.MAX_STACK
    assert ruled_strategy(net, mnist1d_small.task, (40,), 64, 5).trials_per_stack == 5


@needs_kernel
def test_fused_chunk_fills_half_the_l2_cache(mnist1d_small, monkeypatch):
    net = training.models.build("cnn1d", mnist1d_small)
    per_example = working_set(encode(net, (40,)), 40) * 4
    for l2 in (1 << 20, 4 << 20):
        monkeypatch.setattr(strategy, "l2_bytes", lambda l2=l2: l2)
        plans = [ruled_strategy(net, "classification", (40,), b, 32) for b in (8, 4096)]
        chunks = [p.examples_per_chunk for p in plans]
        assert chunks == [8, even_chunks(4096, (l2 // 2) // per_example)]
        assert chunks[1] * per_example <= l2 // 2
        # evaluations are not bound by the batch size
        limit = (l2 // 2) // per_example
        assert plans[0].program.eval_chunk == plans[1].program.eval_chunk == limit
    # float64 holds half as many examples
    assert ruled_strategy(net, "classification", (40,), 4096, 32, torch.float64
                     ).examples_per_chunk < chunks[1]


def test_disabled_kernel_falls_back_to_the_eager_program(mnist1d_small, monkeypatch):
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    net = training.models.build("cnn1d", mnist1d_small)
    plan = ruled_strategy(net, mnist1d_small.task, (40,), 512, 32)
    assert plan.name == "batched" and plan.examples_per_chunk == 512
    assert plan.trials_per_stack == trials_per_stack(512, activation_floats(net, (40,)))


@pytest.mark.parametrize("name", ["simple_cnn", "resnet8"])
def test_image_models_run_per_trial_in_chunks_within_the_budget(images, name):
    net = training.models.build(name, images)
    per_example = activation_floats(net, (3, 32, 32)) * 4
    plan = ruled_strategy(net, "classification", (3, 32, 32), 4096, 32)
    assert plan.name == "per_trial"
    assert plan.trials_per_stack == min(strategy.snapshot_limit(count_parameters(net), "momentum", 4, 32),
                                        strategy.resident_limit(count_parameters(net), "momentum", 4, 32))
    assert plan.examples_per_chunk * per_example <= strategy.CHUNK_BUDGET
    assert 4096 % plan.examples_per_chunk == 0 or plan.examples_per_chunk > 1
    assert plan.program.examples_per_chunk == plan.examples_per_chunk
    small = ruled_strategy(net, "classification", (3, 32, 32), 8, 32)
    assert small.examples_per_chunk == 8
    assert small.program.eval_chunk == strategy.CHUNK_BUDGET // per_example


@pytest.mark.parametrize("optimizer, copies", [("sgd", 1), ("momentum", 2), ("adamw", 3)])
def test_a_stacks_state_fits_the_snapshot_budget(images, optimizer, copies):
    """simple_cnn on 3 x 32 x 32 images: 4.3 M weights, 17 MB a trial; a stack's weights and
    optimizer state stay within SNAPSHOT_BUDGET, in stacks of equal size."""
    net = training.models.build("simple_cnn", images)
    weights = sum(p.numel() for p in net.parameters())
    assert strategy.state_bytes(count_parameters(net), optimizer, 4) == copies * 4 * weights
    stack = strategy.snapshot_limit(count_parameters(net), optimizer, 4, 32)
    assert ruled_strategy(net, "classification", (3, 32, 32), 64, 32, optimizer=optimizer
                     ).trials_per_stack <= stack
    fits = strategy.SNAPSHOT_BUDGET // (copies * 4 * weights)
    assert 1 <= stack <= fits < 32
    assert -(-32 // stack) == -(-32 // fits)  # as few stacks as the budget allows, of equal size
    tiny = nn.Sequential(nn.Linear(40, 8), nn.Tanh(), nn.Linear(8, 10))
    assert strategy.snapshot_limit(count_parameters(tiny), optimizer, 4, 300) == strategy.MAX_STACK


@pytest.mark.parametrize("optimizer, copies", [("sgd", 1), ("momentum", 2), ("adamw", 3)])
def test_per_trial_stacks_stay_in_the_last_level_cache(images, optimizer, copies):
    """A per_trial stack's state and one trial's gradients fit in RESIDENT_BUDGET: simple_cnn
    (17 MB of weights a trial on 3 x 32 x 32) runs in stacks of 1 or 2, resnet8 (0.3 MB) in
    one stack."""
    big = training.models.build("simple_cnn", images)
    weights = 4 * sum(p.numel() for p in big.parameters())
    stack = ruled_strategy(big, "classification", (3, 32, 32), 8, 32, optimizer=optimizer
                      ).trials_per_stack
    fits = (strategy.RESIDENT_BUDGET - weights) // (copies * weights)
    assert stack == max(1, fits) and stack in (1, 2)
    assert 32 % stack == 0
    if stack > 1:
        assert stack * copies * weights + weights <= strategy.RESIDENT_BUDGET
    small = training.models.build("resnet8", images)
    assert ruled_strategy(small, "classification", (3, 32, 32), 8, 32, optimizer=optimizer
                     ).trials_per_stack == 32
    assert strategy.resident_limit(count_parameters(small), optimizer, 4, 30) == 30
    assert strategy.resident_limit(count_parameters(big), optimizer, 4, 3) == (1 if fits <= 1 else 2)


def test_other_modules_take_torch_func():
    tanh = nn.Sequential(nn.Linear(40, 8), nn.Tanh(), nn.Linear(8, 10))
    dilated = nn.Sequential(nn.Unflatten(1, (1, 40)), nn.Conv1d(1, 2, 3, dilation=2),
                            nn.Flatten(), nn.Linear(72, 10))
    for net in (tanh, dilated):
        plan = ruled_strategy(net, "classification", (40,), 512, 64)
        assert plan.name == "func" and plan.examples_per_chunk == 512
        assert plan.trials_per_stack == min(64, trials_per_stack(512, activation_floats(net, (40,))))


def test_a_vectorized_stack_fits_the_memory_budget_down_to_one_trial():
    """At a large batch the speed rule's 8 trials a stack would not fit in memory: the stack
    holds what STACK_MEMORY allows (activations x STACK_SAVED), down to one trial, in the rules'
    plan and in the measured choice's func candidate alike."""
    from training.engine.strategy import candidate_strategies, memory_limit

    # big activations, small weights: a dilated convolution (not the compiled kernel's)
    wide = nn.Sequential(nn.Unflatten(1, (1, 4000)), nn.Conv1d(1, 16, 3, dilation=2), nn.Tanh(),
                         nn.Flatten(), nn.Linear(16 * 3996, 10))
    floats = activation_floats(wide, (4000,))
    stacks = {}
    for batch_size in (64, 256, 16384):
        fits = max(1, strategy.STACK_MEMORY // (batch_size * floats * 4 * strategy.STACK_SAVED))
        assert memory_limit(batch_size, floats, 4) == fits
        plan = ruled_strategy(wide, "classification", (4000,), batch_size, 32)
        assert plan.name == "func"
        stacks[batch_size] = plan.trials_per_stack
        assert stacks[batch_size] == min(trials_per_stack(batch_size, floats), fits)
    assert stacks == {64: 8, 256: 2, 16384: 1}   # the speed rule alone gives 8 at each
    tanh = nn.Sequential(nn.Unflatten(1, (1, 40)), nn.Conv1d(1, 2, 3, dilation=2),
                         nn.Flatten(), nn.Linear(72, 10), nn.Tanh())
    func = [p for p in candidate_strategies(tanh, "classification", (40,), 1 << 22, 32)
            if p.name == "func"]
    assert func and func[0].trials_per_stack == memory_limit(1 << 22, activation_floats(tanh, (40,)), 4)


def test_l2_size_is_read_or_defaulted():
    assert strategy.l2_bytes() >= 64 << 10


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "nesterov", "adam", "adamw"])
def test_where_the_update_runs(mnist1d_small, images, monkeypatch, optimizer):
    """The kernel and the per-trial program update in place for every optimizer; the eager
    programs never (the trainer updates the stack)."""
    cnn = training.models.build("cnn1d", mnist1d_small)
    if kernels.fused_sequential() is not None:
        plan = ruled_strategy(cnn, "classification", (40,), 64, 8, optimizer=optimizer)
        assert plan.name == "fused"
        assert plan.update_in_step
    image = ruled_strategy(training.models.build("simple_cnn", images), "classification",
                      (3, 32, 32), 64, 8, optimizer=optimizer)
    assert image.name == "per_trial" and image.update_in_step
    monkeypatch.setenv(kernels.DISABLE_ENV, "0")
    eager = ruled_strategy(cnn, "classification", (40,), 64, 8, optimizer=optimizer)
    assert eager.name == "batched" and not eager.update_in_step


def test_a_gpu_cell_never_builds_the_cpu_kernel(images, monkeypatch):
    """Planning a cell for CUDA builds none of the compiled CPU kernel (20-60 s on a fresh
    machine): the GPU check's profile phase once spent its whole 35 s compiling it. On the CPU
    the same candidates ask for it."""
    asked = []
    monkeypatch.setattr(kernels, "fused_sequential", lambda: asked.append(1))
    net = training.models.build("simple_cnn", images)
    plans = strategy.candidate_strategies(net, "classification", (3, 32, 32), 8, 4, device="cuda")
    assert {p.name for p in plans} >= {"per_trial", "plain"} and not asked
    assert all(getattr(p.program, "kernel", None) is None for p in plans)
    strategy.candidate_strategies(net, "classification", (3, 32, 32), 8, 4, device="cpu")
    assert len(asked) == 2   # per_trial's and plain's


def test_a_program_of_ones_own_runs_where_it_is_named():
    """A program registered after the library's runs when ``train_trials`` names it (one trial
    a stack): here the plain program's builder under another name, so float64 gives the plain
    program's steps; an unknown name is answered with the closest one."""
    from training.engine.programs import PROGRAMS, plain

    ds = training.data.load("teacher", n=300, dim=6, num_classes=3, hidden=8, seed=0)
    net = training.models.build("mlp", ds, seed=0, hidden=[16])
    run = training.RunConfig(batch_size=16, optimizer="momentum", max_steps=60, goal=0.2,
                             eval_schedule=training.EvalSchedule(every=5), dtype=torch.float64,
                             stop="all")
    trials = [training.Trial(lr=lr, momentum=0.9) for lr in (0.05, 0.2)]
    with PROGRAMS.preserved():
        PROGRAMS.add("mine", lambda cell, chunk, eval_chunk: plain.build(cell, chunk, eval_chunk))
        mine = training.train_trials(net, ds, trials, run, program="mine")
        with pytest.raises(training.ConfigError, match="did you mean 'mine'"):
            training.train_trials(net, ds, trials, run, program="mien")
    reference = training.train_trials(net, ds, trials, run, program="plain")
    assert (mine.program, mine.program_choice) == ("mine", "given")
    assert mine.hit_step == reference.hit_step
