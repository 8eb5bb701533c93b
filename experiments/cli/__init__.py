"""The ``sparsescale`` command line, the one home of all command-line code:
:mod:`experiments.cli.main` (the parser and ``study``, ``report``, ``probe``, ``branch``,
``list``), :mod:`~experiments.cli.bench` (``bench``, ``bench ddp``), :mod:`~experiments.cli.ddp`
(``ddp`` under torchrun) and :mod:`~experiments.cli.exchange` (``import``, ``export``)."""
