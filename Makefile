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
