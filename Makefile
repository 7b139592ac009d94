# calico-gc: `make demo` and `make test` work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | cksum | cut -d' ' -f1)
ARGS   ?=
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' job/__init__.py)
IMAGE  ?= calico-gc

.PHONY: help install test test-fast lint demo run bench bench-scale bench-churn bench-kdd image lock clean

help:
	@echo "make demo   run the real job end to end on a throwaway etcd + Kubernetes API test server"
	@echo "make test   install what the tests need, start it, run every test"
	@echo "make test-fast  every test but the slow suites (marker: slow), while you iterate"
	@echo "make lint   ruff, mypy, and checkov on the manifests and the Dockerfile"
	@echo "make run    the job against your own cluster, dry run (ARGS='--kubeconfig ...')"
	@echo "make bench  the 5,000-host benchmark (prints its figures)"
	@echo "make bench-scale  the same at 15,000 hosts"
	@echo "make bench-churn  deleting 500 orphans under live CNI traffic, against the same without it"
	@echo "make bench-kdd  the Kubernetes datastore: 5,000 nodes, 100,000 pods, dry run and apply"
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

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

OVERLAYS := cronjob job kdd calico-2.x no-host-network examples/apply

lint: $(STAMP) $(VENV)/checkov/.installed-$(CHECKOV_VERSION)
	$(BIN)/ruff check job tests bench demo tools
	$(BIN)/mypy
	@rm -rf $(VENV)/rendered && mkdir -p $(VENV)/rendered
	@for overlay in $(OVERLAYS); do \
	  $(BIN)/kubectl kustomize manifests/$$overlay > $(VENV)/rendered/$$(echo $$overlay | tr / -).yaml || exit 1; \
	done
	$(CHECKOV) --config-file .checkov.yaml -d $(VENV)/rendered --framework kubernetes
	$(CHECKOV) --config-file .checkov.yaml -f Dockerfile --framework dockerfile

demo: $(STAMP)
	$(BIN)/python -m demo

run: $(STAMP)
	$(BIN)/python -m job $(ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.dry_run

bench-scale: $(STAMP)
	$(BIN)/python -m bench.dry_run --hosts 15000 --orphans 1500 --repeat 3

bench-churn: $(STAMP)
	$(BIN)/python -m bench.churn

bench-kdd: $(STAMP)
	$(BIN)/python -m bench.kdd

# requirements.lock (the image's pins, with hashes) from requirements.txt; run after changing it.
lock: $(STAMP)
	$(BIN)/python tools/lock.py

# With a Docker daemon, docker; without one (as here and in CI), buildah, as tests/test_image.py builds it.
image:
	if docker info >/dev/null 2>&1; then docker build -t $(IMAGE):$(VERSION) . ; \
	else buildah bud --isolation chroot --runtime runc --volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro -t $(IMAGE):$(VERSION) . ; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
