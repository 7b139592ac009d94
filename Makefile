# calico-gc: `make demo` and `make test` work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)
ARGS   ?=
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' job/__init__.py)
IMAGE  ?= calico-gc

.PHONY: help install test test-fast test-pythons test-interpreter lint demo run bench bench-gateway bench-scale bench-churn bench-kdd bench-stop bench-ranges bench-crash-loop bench-plan image lock clean prometheus-tools rules

help:
	@echo "make demo   run the real job end to end on a throwaway etcd + Kubernetes API test server"
	@echo "make test   install what the tests need, start it, run every test"
	@echo "make test-fast  every test but the slow suites (marker: slow), while you iterate"
	@echo "make test-pythons  the fast suite but tests/deploy on the README's other Pythons (3.12, 3.13), side by side"
	@echo "make lint   ruff, mypy, import-linter, and checkov on the manifests, the chart and the Dockerfile"
	@echo "make run    the job against your own cluster, dry run (ARGS='--kubeconfig ...')"
	@echo "make bench  the 5,000-host benchmark, on three layouts of the fleet, 1,000 namespaces, hashed container ids, GKE host names, dual stack, IPv6 alone, /28 blocks, no namespace profiles, nothing naming the namespaces, no handle keys, half the hosts gone, 40 namespaces and 8 pods a host (prints its figures)"
	@echo "make bench-scale  the same at 15,000 hosts"
	@echo "make bench-gateway  the 5,000-host dry run beside the last commit that spoke etcd's JSON gateway"
	@echo "make bench-churn  deleting 500 orphans under live CNI traffic, against the same without it"
	@echo "make bench-kdd  the Kubernetes datastore: 5,000 nodes, 100,000 pods, dry run and apply, in v1 and v3"
	@echo "                (.venv/bin/python -m bench.kdd --kubeconfig PATH: a real API server's own CPU and allocations)"
	@echo "make bench-stop  how long a run takes to end after SIGTERM while a read hangs"
	@echo "make bench-ranges  what a paged read costs etcd: per range, per key counted, per key returned"
	@echo "make bench-crash-loop  the 5,000-host dry run where every calico-node crash-loops (each previous log read)"
	@echo "make bench-plan  planning each of 500 gone hosts' removal, in-process (ARGS='--job-tree DIR' beside another checkout)"
	@echo "make lock   requirements.lock (the image's whole dependency set, with hashes)"

$(STAMP): requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "calico-gc needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

# checkov has its own venv: its ~70 dependencies must not move the job's pins.
CHECKOV_VERSION := 3.3.30
CHECKOV := $(VENV)/checkov/bin/checkov
$(VENV)/checkov/.installed-$(CHECKOV_VERSION): $(STAMP)
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install --quiet --disable-pip-version-check checkov==$(CHECKOV_VERSION)
	@touch $@

# Helm's own engine (helm-python-sdk: Helm v4's Go SDK, 85 MB native) in its own venv, as checkov:
# the chart tests and `make lint` render and lint charts/calico-gc with it (tools/helm.py).
HELM_SDK_VERSION := 0.2.2
HELM_STAMP := $(VENV)/helm/.installed-$(HELM_SDK_VERSION)
$(HELM_STAMP): $(STAMP)
	$(PYTHON) -m venv $(VENV)/helm
	$(VENV)/helm/bin/pip install --quiet --disable-pip-version-check helm-python-sdk==$(HELM_SDK_VERSION)
	@touch $@

# Two workers (pytest-xdist), each test file whole on one, so that a file's fixtures are made once
# (the image's build, a module's etcd). The suite mostly waits on its servers and the job's
# processes: on 2 cores it took 4.7 minutes where one worker took 7.2 (docs/development.md).
# test-pythons runs two interpreters' suites side by side instead, one worker each.
TEST_WORKERS := -n 2 --dist loadfile
test: $(STAMP) $(HELM_STAMP) prometheus-tools
	$(BIN)/python -m pytest $(TEST_WORKERS)

test-fast: $(STAMP) $(HELM_STAMP) prometheus-tools
	$(BIN)/python -m pytest $(TEST_WORKERS) -m "not slow"

# Prometheus's own tools for the alert tests: promtool, a real Pushgateway and a real Prometheus,
# Debian's packages (no PyPI package carries them). Installed here when missing and this is root
# (as on these machines and in CI); elsewhere those tests skip, naming the packages.
PROMETHEUS_PACKAGES := prometheus prometheus-pushgateway
prometheus-tools:
	@if ! command -v promtool >/dev/null || ! command -v prometheus-pushgateway >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(PROMETHEUS_PACKAGES) (Debian)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PROMETHEUS_PACKAGES) >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PROMETHEUS_PACKAGES) >/dev/null; }; \
	  else echo "promtool and prometheus-pushgateway are missing: apt-get install $(PROMETHEUS_PACKAGES)"; fi; \
	fi

# The kustomize component's copy of the alerts, from the chart's rules file (the one source).
rules: $(STAMP)
	$(BIN)/python tools/rules.py

# The README names Python 3.11, 3.12 and 3.13: the fast suite runs on the two besides this one, each
# in a venv of its own, side by side (the suite mostly waits on etcd and subprocesses). The
# interpreters are pyenv's, as these machines carry them, else python3.X on PATH. tests/deploy is
# left to `make test`: the image, the chart and the manifests are built by podman, Helm and
# kubectl, whichever Python runs pytest (and Helm's engine is no download for each venv).
OTHER_PYTHONS := 3.12 3.13
test-pythons:
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(addprefix test-python-,$(OTHER_PYTHONS))

test-interpreter: $(STAMP) prometheus-tools
	$(BIN)/python -m pytest -m "not slow" --ignore=tests/deploy

test-python-%:
	@interp=$$(ls -d $(HOME)/.pyenv/versions/$*.*/bin/python$* 2>/dev/null | tail -n 1); \
	[ -n "$$interp" ] || interp=$$(command -v python$* || true); \
	[ -n "$$interp" ] || { echo "no Python $* here (pyenv's, or python$* on PATH)"; exit 1; }; \
	echo "fast suite on $$($$interp --version)"; \
	$(MAKE) --no-print-directory test-interpreter PYTHON=$$interp VENV=.venv-$*

OVERLAYS := cronjob job kdd calico-2.x no-host-network examples/apply examples/alerts examples/etcd-user

lint: $(STAMP) $(VENV)/checkov/.installed-$(CHECKOV_VERSION) $(HELM_STAMP) prometheus-tools
	$(BIN)/ruff check job tests bench demo tools
	promtool check rules charts/calico-gc/files/calico-gc.rules.yaml
	$(BIN)/python tools/rules.py --check  # the kustomize component's copy of the rules
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layers and the pure core (pyproject.toml, [tool.importlinter])
	@rm -rf $(VENV)/rendered && mkdir -p $(VENV)/rendered
	@for overlay in $(OVERLAYS); do \
	  $(BIN)/kubectl kustomize manifests/$$overlay > $(VENV)/rendered/$$(echo $$overlay | tr / -).yaml || exit 1; \
	done
	@for values in '{}' '{"datastore":"etcdv2"}' '{"datastore":"kubernetes"}' '{"hostNetwork":false}'; do \
	  $(VENV)/helm/bin/python tools/helm.py manifests charts/calico-gc "$$values" calico-gc kube-system \
	    > $(VENV)/rendered/chart-$$(echo "$$values" | tr -cd 'a-zA-Z0-9').yaml || exit 1; \
	done
	$(CHECKOV) --config-file .checkov.yaml -d $(VENV)/rendered --framework kubernetes
	$(CHECKOV) --config-file .checkov.yaml -f Dockerfile --framework dockerfile

demo: $(STAMP)
	$(BIN)/python -m demo

run: $(STAMP)
	$(BIN)/python -m job $(ARGS)

# The job under benchmark runs with the image's dependency set (requirements.lock), in a venv of
# its own: the dev venv's extras change what it imports (structlog imports rich, import-linter's,
# when it is there: 30 ms a run).
JOB_VENV := $(VENV)/job
JOB_STAMP := $(JOB_VENV)/.installed-$(shell cksum < requirements.lock | cut -d' ' -f1)
$(JOB_STAMP): requirements.lock
	$(PYTHON) -m venv $(JOB_VENV)
	$(JOB_VENV)/bin/pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements.lock
	@rm -f $(JOB_VENV)/.installed-*
	@touch $@
BENCH_ENV := BENCH_JOB_PYTHON=$(JOB_VENV)/bin/python

# Three layouts, the last also with 1,000 namespaces and with container ids as a runtime makes
# them (handles' keys in no order of hosts), then with GKE names, dual stack and /28 blocks, so that a change cannot tune to one
# (bench/generate.py, SHAPES); and a sparse fleet (8 pods a host), where what a run costs
# whatever the keys (Python's start, the imports, the hosts' keys) weighs most. The GKE names'
# run has the cluster's pods in the API test server (--pods): what the leak check reads of them.
bench: $(STAMP) $(JOB_STAMP)
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape spread --repeat 3
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --repeat 3
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --namespaces 1000 --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --host-names gke --pods --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --host-names gke --ip-families dual --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --host-names gke --ip-families ipv6 --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --host-names gke --block-size 28 --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --host-names gke --no-profiles --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --namespaces 10 --container-ids hashed --no-profiles --no-pod-attributes --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --namespaces 10 --container-ids hashed --no-handles --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --container-ids hashed --orphans 2500 --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape namespaces --namespaces 40 --container-ids hashed --host-names gke --repeat 3 --extra-endpoints 0
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --shape spread --pods-per-host 8 --repeat 3 --extra-endpoints 0

# The same dry runs beside those of the last commit that spoke etcd's JSON gateway (a worktree of it).
GATEWAY_COMMIT := 6d65f33
bench-gateway: $(STAMP) $(JOB_STAMP)
	@[ -d $(VENV)/gateway-tree ] || git worktree add --detach $(VENV)/gateway-tree $(GATEWAY_COMMIT)
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --repeat 3 --job-tree $(VENV)/gateway-tree

bench-scale: $(STAMP) $(JOB_STAMP)
	$(BENCH_ENV) $(BIN)/python -m bench.dry_run --hosts 15000 --orphans 1500 --repeat 3

bench-churn: $(STAMP)
	$(BIN)/python -m bench.churn

# Both of Calico's API groups: crd.projectcalico.org/v1, and the native projectcalico.org/v3 CRDs.
bench-kdd: $(STAMP)
	$(BIN)/python -m bench.kdd --group v1
	$(BIN)/python -m bench.kdd --group v3

bench-stop: $(STAMP)
	$(BIN)/python -m bench.stop

bench-ranges: $(STAMP)
	$(BIN)/python -m bench.range_cost

bench-crash-loop: $(STAMP) $(JOB_STAMP)
	$(BENCH_ENV) $(BIN)/python -m bench.crash_loop

# The plan alone, in the job's venv (the image's dependency set), where a whole run's noise hides it.
bench-plan: $(STAMP) $(JOB_STAMP)
	$(JOB_VENV)/bin/python -m bench.plan $(ARGS)

# requirements.lock (the image's pins, with hashes) from requirements.txt; run after changing it.
lock: $(STAMP)
	$(BIN)/python tools/lock.py

# With a Docker daemon, docker; without one (as here and in CI), buildah, as tests/test_image.py builds it.
image:
	if docker info >/dev/null 2>&1; then docker build -t $(IMAGE):$(VERSION) . ; \
	else buildah bud --isolation chroot --runtime runc --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro -t $(IMAGE):$(VERSION) . ; fi

clean:
	rm -rf $(VENV) .venv-3.* .pytest_cache .mypy_cache .ruff_cache .hypothesis
