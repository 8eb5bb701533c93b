"""The processes that train: the settings a training process makes once for itself
(:mod:`training.processes.setup`), and how the processes a driver starts end with it
(:mod:`training.processes.lifetime`: ``PR_SET_PDEATHSIG`` from a spawned child's first statement,
the parent poll as the portable fallback).
"""
