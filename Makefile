# Two entry points that do all setup on a fresh machine:
#   make study   - create .venv, install, run the quickstart study, write its report
#   make test    - create .venv, install, run the default test suite
# and: make docs (the documentation site, warnings as errors), make bench (the trainer benchmark)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On machines without an NVIDIA GPU the CPU build of torch is installed first, so that the
# package's open `torch>=2.3` requirement is already met and no multi-GB CUDA build is pulled.
# Override TORCH_SPEC / TORCH_INDEX_URL for other machines (e.g. PyTorch's CPU wheel index).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
CONFIG ?= experiments/configs/quickstart.toml
OUT ?= runs/quickstart

.PHONY: study test bench docs clean setup

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "no GPU found: installing the CPU build of torch ($(TORCH_SPEC))"; \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)); \
	fi
	$(BIN)/python -m pip install -q -e ".[test,dask,docs,lightning,huggingface]"
	@# the compiled training kernel (about 30 s, once per machine and source version; a machine
	@# without a compiler gets a warning and the eager program, never a failed setup, unless
	@# SPARSESCALE_REQUIRE_KERNEL=1, as in CI: then a kernel that cannot be built fails it)
	$(BIN)/python -c "import training.engine.compiled_kernel as k; k.fused_sequential()"
	touch $@

study: setup
	$(BIN)/sparsescale study $(CONFIG) --out $(OUT)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/sparsescale bench

# The documentation site into site/: a broken link or anchor, a page missing from the nav, a nav
# entry without a page or a docstring that does not render fails the build (mkdocs.yml).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks site
