# Every target installs what it needs through scripts/deps.sh (Go modules;
# Debian's python3-torch and python3-pytest when `import torch` fails).
PYTHON  ?= /usr/bin/python3
# The release is the Python package's; the commit says which build of it.
RELEASE := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' python/ddp_agent/__init__.py)
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(RELEASE) -X main.commit=$(VERSION)
# The demos' checkpoints and logs: in the checkout, not a path shared with other users.
DEMO_DIR ?= $(CURDIR)/.cache/demo
TORCHRUN_COMPAT ?= $(CURDIR)/scripts/torchrun_compat.py
# PyTorch 2.x for `make test`'s second pass: empty means the venv that
# `scripts/deps.sh torch2` makes (once) and reuses. TORCH2_E2E picks the
# end-to-end tests run on it: the workers' environment against torch 2.x's
# torchrun, the hook under ddp-agent and under torch 2.x's
# own torchrun, its NCCL bootstrap (fake NCCL), a worker dying with the hook
# registered (restart and resume), a hang (stacks, restart), and PyTorch
# Lightning and Hugging Face Accelerate (from PyPI, in that venv) under
# ddp-agent run and under their own launchers beside a sidecar.
TORCH2_PYTHON ?=
TORCH2_E2E ?= ^(TestEnvMatchesTorchrun|TestHookTrainUnderAgent|TestHookTrainUnderTorchrun|TestHookNCCLUniqueIDThroughAgent|TestHookWorkerDiesAgentRestarts|TestHangReportedWithStackAndRestarted|TestSidecarNamesStragglerUnderTorchrun|TestLightningUnderAgent|TestLightningUnderTorchrunWithSidecar|TestAccelerateUnderAgent|TestAccelerateLaunchWithSidecar|TestWarmSpare|TestLostNodeShrinksInProcess|TestLostStoreNodeShrinksInProcess|TestLateNodeJoinsInProcess|TestNodeJoinsWhileWorkersStart|TestNodeJoinsAsJobEnds)$$/^raise$$

.PHONY: build wheel test test-quick test-deploy demo demo-fault bench bench-links lint fuzz clean

# bin/ddp-agent, bin/ddp-agent-plugins, and bin/libddpshim.so with its
# header; the three are also copied into python/ddp_agent/ so `pip install
# ./python` and `make wheel` ship them. Each
# lands under a temporary name and is renamed into place: overwriting a
# library that running workers have mapped crashes them (SIGSEGV or SIGBUS),
# and a new inode leaves them theirs.
build:
	@go=$$(scripts/deps.sh go) && \
	  $$go build -ldflags "$(LDFLAGS)" -o bin/.ddp-agent.tmp ./agent/cmd/ddp-agent && mv -f bin/.ddp-agent.tmp bin/ddp-agent && \
	  $$go build -ldflags "$(LDFLAGS)" -o bin/.ddp-agent-plugins.tmp ./plugins/cmd/ddp-agent-plugins && mv -f bin/.ddp-agent-plugins.tmp bin/ddp-agent-plugins && \
	  CGO_ENABLED=1 $$go build -buildmode=c-shared -o bin/.libddpshim.so.tmp ./shim && mv -f bin/.libddpshim.so.tmp bin/libddpshim.so && \
	  rm -f bin/.libddpshim.so.h && cp shim/ddpshim.h bin/ && \
	  for f in libddpshim.so ddp-agent ddp-agent-plugins; do \
	    cp bin/$$f python/ddp_agent/.$$f.tmp && mv -f python/ddp_agent/.$$f.tmp python/ddp_agent/$$f || exit 1; done
	@echo "built bin/ddp-agent bin/ddp-agent-plugins bin/libddpshim.so"

# dist/ddp_agent-<version>-py3-none-<platform>.whl: the hook, libddpshim.so,
# ddp-agent (a console command whose --python defaults to the interpreter it
# was installed with) and ddp-agent-plugins; `pip install dist/ddp_agent-*.whl`
# on a node with no Go. Built offline with the system's setuptools and wheel.
wheel: build
	@scripts/deps.sh wheel >/dev/null
	@rm -f dist/ddp_agent-*.whl
	$(PYTHON) -m pip wheel -q --no-deps --no-build-isolation --no-index -w dist ./python
	@ls dist/ddp_agent-*.whl

# The README's test command: vet, then every Go test (unit and end-to-end,
# with real Python workers under ddp-agent and torchrun) under the race
# detector, through scripts/testtime, which ends with the slowest tests and
# packages (every time in .cache/test-times.json), then, at the same time
# (scripts/together.sh: their tests mostly wait), the Python suite (real DDP
# with gloo against the shim) on $(PYTHON) (Debian's PyTorch 1.13), and on
# PyTorch 2.x ($(TORCH2_PYTHON)) the TORCH2_E2E end-to-end tests and the
# Python suite again.
test: build
	@go=$$(scripts/deps.sh all) && py2="$(TORCH2_PYTHON)" && { [ -n "$$py2" ] || py2=$$(scripts/deps.sh torch2); } && \
	  nccl=$$($$py2 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))') && \
	  test -z "$$($$(dirname $$go)/gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; $$(dirname $$go)/gofmt -l $$(git ls-files '*.go'); exit 1; } && \
	  $$go vet ./... && \
	  $$go run ./scripts/sizes -top 0 && scripts/no-binaries.sh && \
	  DDP_AGENT_REQUIRE_TORCH=1 DDP_AGENT_PYTHON=$(PYTHON) DDP_AGENT_TORCHRUN_COMPAT=$(TORCHRUN_COMPAT) \
	  DDP_AGENT_REQUIRE_NCCL=1 DDP_AGENT_TEST_NCCL_LIB=$$nccl \
	    $$go run ./scripts/testtime -o .cache/test-times.json -- $$go test -json -race -count=1 -parallel 3 -timeout 50m ./... && \
	  echo "== PyTorch $$($$py2 -c 'import torch; print(torch.__version__)') ($$py2)" && \
	  pytest="DDP_AGENT_REQUIRE_TORCH=1 DDP_AGENT_REQUIRE_NCCL=1 DDP_AGENT_SHIM=$(CURDIR)/bin/libddpshim.so DDP_AGENT_TORCH2_PYTHON=$$py2" && \
	  scripts/together.sh .cache/test-logs \
	    pytest "$$pytest $(PYTHON) -m pytest -q -p no:cacheprovider python/tests" \
	    e2e-torch2 "DDP_AGENT_REQUIRE_TORCH=1 DDP_AGENT_REQUIRE_FRAMEWORKS=1 DDP_AGENT_PYTHON=$$py2 DDP_AGENT_TORCHRUN_COMPAT=$(TORCHRUN_COMPAT) \
	      $$go test -race -count=1 -parallel 3 -timeout 30m -run '$(TORCH2_E2E)' ./agent/e2e" \
	    pytest-torch2 "$$pytest $$py2 -m pytest -q -p no:cacheprovider python/tests"

# The inner loop while working (docs/testing.md): every Go unit test without
# the race detector, a smoke subset of the end-to-end tests (QUICK_E2E: a job
# to completion, the hook under the agent, a multi-node job, a crash and its
# root cause across nodes, the control socket), and the Python suite's
# binding and DDP parity files, on $(PYTHON). A few minutes here; CI runs
# make test, which runs everything.
QUICK_E2E ?= ^(TestTrainToCompletion|TestHookTrainUnderAgent|TestMultiNodeTrain|TestRootCauseAcrossNodes|TestControlSocketKV|TestEnvMatchesTorchrun)$$
test-quick: build
	@go=$$(scripts/deps.sh) && \
	  $$go vet ./... && \
	  DDP_AGENT_PYTHON=$(PYTHON) DDP_AGENT_TORCHRUN_COMPAT=$(TORCHRUN_COMPAT) \
	    $$go run ./scripts/testtime -top 8 -- $$go test -json -count=1 $$($$go list ./... | grep -v /agent/e2e$$) && \
	  DDP_AGENT_REQUIRE_TORCH=1 DDP_AGENT_PYTHON=$(PYTHON) DDP_AGENT_TORCHRUN_COMPAT=$(TORCHRUN_COMPAT) \
	    $$go run ./scripts/testtime -top 8 -- $$go test -json -count=1 -run '$(QUICK_E2E)' -skip 'TestMultiNodeTrain/3_nodes' ./agent/e2e && \
	  DDP_AGENT_SHIM=$(CURDIR)/bin/libddpshim.so $(PYTHON) -m pytest -q -p no:cacheprovider \
	    python/tests/test_shim.py python/tests/test_env_names.py python/tests/test_ddp.py

# The deploy paths on the real tools (deploy/README.md): a real Slurm
# (slurm-wlm and munge from apt: slurmctld and two slurmd on this host)
# running deploy/slurm's sbatch scripts; Jaeger v1.76.0 (built once from
# the Go module proxy into .cache/deploy, minutes the first time) and
# Debian's Prometheus receiving a real job's traces and metrics through
# deploy/observability's configs; and deploy/k8s's manifests decoded
# strictly. Installs what is missing (as root); `.ci/run` runs it after
# `make test`.
test-deploy: build
	@go=$$(scripts/deps.sh) && deploy/slurm/testdeps.sh && deploy/observability/testdeps.sh >/dev/null && \
	  DDP_AGENT_DEPLOY_TESTS=1 DDP_AGENT_PYTHON=$(PYTHON) DDP_AGENT_TORCHRUN_COMPAT=$(TORCHRUN_COMPAT) \
	    $$go test -count=1 -timeout 15m ./deploy/...

# A real 2-worker DDP job (gloo on CPU) under ddp-agent. On PyTorch 2.x:
# make demo PYTHON=$(scripts/deps.sh torch2)
demo: build
	@case "$(PYTHON)" in /usr/bin/*) scripts/deps.sh >/dev/null;; *) scripts/deps.sh go >/dev/null;; esac
	@rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	bin/ddp-agent run --standalone --nproc-per-node 2 --python $(PYTHON) --log-dir $(DEMO_DIR)/logs \
	  examples/train.py --steps 60 --ckpt-dir $(DEMO_DIR)/ckpt --comm-hook ddp-agent

# The same job with rank 1 crashing at step 30 on the first attempt: the
# root-cause report, the group restart, and the resume from the checkpoint.
# Then the same fault under ddp_agent.InProcess (train.py --in-process):
# the ranks re-form in their processes, retry step 30, and the agent logs
# the re-formation with its phases; no restart.
demo-fault: build
	@scripts/deps.sh >/dev/null
	@rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)
	bin/ddp-agent run --standalone --nproc-per-node 2 --max-restarts 1 --python $(PYTHON) \
	  examples/train.py --steps 60 --ckpt-dir $(DEMO_DIR)/ckpt --fail-rank 1 --fail-at-step 30
	@echo "==== the same fault in process (train.py --in-process): the workers keep their processes"
	bin/ddp-agent run --standalone --nproc-per-node 2 --max-restarts 1 --python $(PYTHON) \
	  examples/train.py --steps 60 --ckpt-dir $(DEMO_DIR)/ckpt-in-process --fail-rank 1 --fail-at-step 30 --in-process
	@echo "==== rank 1 SIGKILLed instead, with a warm spare (--spares 1): it takes the rank, rank 0 keeps its process"
	bin/ddp-agent run --standalone --nproc-per-node 2 --max-restarts 1 --spares 1 --python $(PYTHON) \
	  examples/train.py --steps 60 --ckpt-dir $(DEMO_DIR)/ckpt-spare --fail-rank 1 --fail-at-step 30 --in-process \
	  --fail-signal KILL

# Side by side in one run (figures in the README): ddp-agent against
# torchrun (start-up, restart, and recovery after a lost node against
# torchrun's c10d rendezvous, a node that does not host the store and the
# one that does); rendezvous rounds of up to 1024 simulated agents against
# one store member and three; the shim's all-reduce against gloo's; a DDP step with the hook
# against DDP's built-in gloo all-reduce, and real architectures scaled down (ResNet-50, GPT-2
# small, a 1 B decoder) against DDP's default all-reduce on PyTorch 2.x (hook_models.py).
bench: build
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/launch -agent bin/ddp-agent -python $(PYTHON) -torchrun-compat $(TORCHRUN_COMPAT)
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/recovery -agent bin/ddp-agent -python $(PYTHON) -torchrun-compat $(TORCHRUN_COMPAT) -runs 3
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/recovery -agent bin/ddp-agent -python $(PYTHON) -torchrun-compat $(TORCHRUN_COMPAT) -runs 3 -kill host -timeout 60s
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/rdzvscale -members 1,3
	bin/ddp-agent run --standalone --nproc-per-node 2 --python $(PYTHON) examples/bench/allreduce.py
	$(PYTHON) examples/bench/ddp_step.py --agent bin/ddp-agent --python $(PYTHON) --reps 3 --steps 30 --warmup-steps 5
	$(PYTHON) examples/bench/hook_cost.py --steps 50 --warmup 5
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault kill
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault kill --fail-rank 0
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault hang
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault node
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault store-node
	$(PYTHON) examples/bench/inprocess_recovery.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --runs 5 --fault join
	$(PYTHON) examples/bench/buffers.py --rounds 5 --steps 40
	@py2="$(TORCH2_PYTHON)" && { [ -n "$$py2" ] || py2=$$(scripts/deps.sh torch2); } && \
	  $$py2 examples/bench/hook_models.py --rounds 20 --steps-per-round 4
	$(PYTHON) examples/bench/telemetry_overhead.py --agent bin/ddp-agent --python $(PYTHON) --reps 5 --steps 40 --warmup-steps 10 --batch-size 8
	$(PYTHON) examples/bench/sidecar_overhead.py --agent bin/ddp-agent --python $(PYTHON) --torchrun-compat $(TORCHRUN_COMPAT) --reps 6 --steps 40 --warmup-steps 10 --batch-size 8
	@go=$$(scripts/deps.sh) && $$go build -tags nvmlmock -o bin/ddp-agent-nvmlmock.tmp ./agent/cmd/ddp-agent && mv bin/ddp-agent-nvmlmock.tmp bin/ddp-agent-nvmlmock
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/stragglers -agent bin/ddp-agent -mock-agent bin/ddp-agent-nvmlmock -python $(PYTHON)
	@go=$$(scripts/deps.sh) && $$go run ./examples/bench/plugins -agent bin/ddp-agent -python $(PYTHON) -runs 10
	$(PYTHON) examples/bench/mpi/run.py --python $(PYTHON) --shim bin/libddpshim.so
	$(MAKE) --no-print-directory bench-links

# The shim's TCP ring and gloo between hosts simulated as network namespaces on
# rate-limited links (docs/links.md); as root, else it says it skipped.
bench-links: build
	$(PYTHON) examples/bench/links/run.py --python $(PYTHON) --shim bin/libddpshim.so

lint:
	@go=$$(scripts/deps.sh go) && test -z "$$($$(dirname $$go)/gofmt -l $$(git ls-files '*.go'))" && $$go vet ./... && \
	  $$go run ./scripts/sizes && scripts/no-binaries.sh && echo "lint: passed (gofmt, go vet, file and function sizes, no build outputs tracked)"

fuzz:
	@go=$$(scripts/deps.sh go) && $$go test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./wire

clean:
	rm -rf bin .cache
