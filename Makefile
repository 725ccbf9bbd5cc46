# Set-up and everyday commands. `make demo` and `make test` are the README's two commands:
# each builds a virtual environment (.venv) from pyproject.toml on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS ?= ci/constraints.txt
# With no GPU, JAX gets 8 CPU devices so that sharding is real.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
export PYTHONUNBUFFERED := 1

.PHONY: install demo test bench gpu-test clean

$(VENV)/.deps: pyproject.toml $(CONSTRAINTS) scripts/deps.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) scripts/deps.py build runtime test > $(VENV)/requirements.txt
	$(PY) -m pip install -q -c $(CONSTRAINTS) -r $(VENV)/requirements.txt
	touch $@

# Builds against the venv's jax (no build isolation: one jax, one set of FFI headers).
install: $(VENV)/.deps
	$(PY) -m pip install -q --no-build-isolation --no-deps .

# -P keeps the source tree off sys.path so the installed, compiled package is tested.
demo: install
	$(PY) -P -m jax_amem demo

test: install
	$(PY) -P -m pytest -q tests

bench: install
	$(PY) -P -m jax_amem bench

# On the GPU machine: no network, the image's python3 and packages.
gpu-test:  # STEPS="build nccl nccl_new" (default: every step; see scripts/gpu_test.sh)
	bash scripts/gpu_test.sh $(STEPS)

clean:
	rm -rf build $(VENV)
