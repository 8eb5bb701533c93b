"""The noise monitor inside the frameworks' trainers: :mod:`theory.callbacks.lightning`
(a Lightning ``Callback``) and :mod:`theory.callbacks.huggingface` (a Hugging Face
``TrainerCallback``), both named ``NoiseScaleCallback``, on what they share
(:mod:`theory.callbacks.common`). Each needs its framework (``pip install
'sparsescale[lightning]'``, ``'sparsescale[huggingface]'``) and is imported by its own module
name, so that the package imports without them."""
