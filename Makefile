# The two set-up commands: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: demo test lint venv clean bench-peers

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/tunaflow demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

# The peers (TVM MetaSchedule, onnxruntime) live in their own venv (~1.3 GB) so .venv stays lean.
# A slice: make bench-peers PEERS_ARGS="--workloads matmul_512 --budgets 64 --no-e2e"
PEERS := .venv-peers
PEERS_STAMP := $(PEERS)/.installed
PEERS_PKGS := apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 xgboost psutil cloudpickle onnxruntime numpy \
	onnx threadpoolctl

$(PEERS_STAMP):
	test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet $(PEERS_PKGS)
	touch $(PEERS_STAMP)

bench-peers: $(STAMP) $(PEERS_STAMP)
	flock /tmp/bench.lock $(BIN)/python benchmarks/peers.py --peers-python $(PEERS)/bin/python $(PEERS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# An arm64 device under qemu user-mode emulation (root; see device/arm64/). Built once under ARM64_ROOT;
# every command runs this checkout's code (bind-mounted) and leaves nothing mounted when it exits.
ARM64_ROOT ?= $(HOME)/.cache/tunaflow/arm64
# The board the device stands for (a Raspberry Pi 5's Cortex-A76: 64 KiB L1d, 512 KiB L2, 2 MiB L3).
ARM64_CPU ?= cortex-a76
ARM64_CACHES ?= 64K,512K,2M
# The CPU qemu emulates (`qemu-aarch64-static -cpu help`): the board's, so what it lacks traps as there.
ARM64_QEMU_CPU ?= $(ARM64_CPU)
export ARM64_ROOT ARM64_CPU ARM64_QEMU_CPU

.PHONY: arm64-device arm64-agent arm64-run arm64-test

arm64-device:
	device/arm64/build.sh

arm64-agent:
	@test -n "$(TRACKER)" -a -n "$(KEY)" -a -n "$(TOKEN_FILE)" || \
		{ echo "usage: make arm64-agent TRACKER=HOST:PORT KEY=KEY TOKEN_FILE=F [ARM64_CPU=..] [ARM64_CACHES=..]"; exit 2; }
	device/arm64/agent.sh '$(TRACKER)' '$(KEY)' '$(TOKEN_FILE)' '$(ARM64_CPU)' '$(ARM64_CACHES)'

arm64-run:
	@test -n "$(LIB)" || { echo "usage: make arm64-run LIB=DIR [INPUTS=in.npz] [OUTPUT=out.npz] [RUN_ARGS=...]"; exit 2; }
	device/arm64/run.sh '$(LIB)' '$(INPUTS)' '$(OUTPUT)' $(RUN_ARGS)

# The opt-in device suite (tests/test_arm64_device.py; skipped elsewhere, so never part of `make test`);
# ARM64_TEST_ARGS picks tests, e.g. ARM64_TEST_ARGS='-k deployment'.
arm64-test: $(STAMP) arm64-device
	TUNAFLOW_ARM64=1 $(BIN)/python -m pytest -m arm64 -s -p no:cacheprovider tests/test_arm64_device.py $(ARM64_TEST_ARGS)
