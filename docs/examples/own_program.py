"""A training program of your own: the plain loop's way of computing a step, with each
mini-batch taken in chunks (the gradients summed over them), registered under a name of its own
and run by ``train_trials(program=...)``. In float64 it takes the same steps as ``plain``.

A program is the engine's (``training.engine.programs``, private to the trainers): this file
reaches into it, as a program added to the library would. To make the strategy pick it, a
program added to the library also needs a rule in ``training/engine/strategy.py`` (or a
candidacy of the measured choice); named, as here, it needs none, and runs one trial a stack
(``training.engine.strategy.named``).
"""
import torch

import training
from training.engine.programs import PROGRAMS
from training.engine.programs.per_trial import PerTrialProgram


def build_chunked(cell, examples_per_chunk, eval_chunk):
    """The registry's builder: trial after trial, NCHW, ``examples_per_chunk`` examples a chunk."""
    return PerTrialProgram(cell.model, cell.task, examples_per_chunk, eval_chunk, cell.loss,
                           cell.random, cell.precision, layout="nchw", spread=False,
                           device=cell.device)


PROGRAMS.add("chunked_plain", build_chunked)

if __name__ == "__main__":
    ds = training.data.load("teacher", n=600, dim=8, num_classes=3, hidden=16, seed=0)
    net = training.models.build("mlp", ds, seed=0, hidden=[64])
    run = training.RunConfig(batch_size=32, optimizer="momentum", max_steps=300, goal=0.15,
                             eval_schedule=training.EvalSchedule(every=10), dtype=torch.float64,
                             stop="all")
    trials = [training.Trial(lr=lr, momentum=0.9) for lr in (0.05, 0.2)]
    mine = training.train_trials(net, ds, trials, run, program="chunked_plain")
    plain = training.train_trials(net, ds, trials, run, program="plain")
    print("programs:", " ".join(PROGRAMS.names()))
    print("ran:", mine.program, mine.program_choice)
    print("hit steps:", " ".join(str(h) for h in mine.hit_step))
    print("plain hit steps:", " ".join(str(h) for h in plain.hit_step))
