# calico-gc: a slim runtime image; build tools live only in the builder stage.
FROM python:3.11-slim AS build
WORKDIR /build
COPY requirements.lock .
# The system CA bundle, not pip's own: a build host that reaches PyPI through its own CA mounts
# that bundle over this file for the build only (make image does); the final image never has it.
RUN python -m venv /venv \
 && PIP_CERT=/etc/ssl/certs/ca-certificates.crt /venv/bin/pip install --no-cache-dir --disable-pip-version-check \
      --no-compile --require-hashes --no-deps -r requirements.lock \
 && /venv/bin/pip uninstall --yes --quiet pip setuptools \
 # The client's asyncio half (42 MB) is never imported: calico-gc uses kubernetes.client and
 # kubernetes.config only (tests/test_image.py checks the job still imports everything it uses).
 && rm -rf /venv/lib/python3.11/site-packages/kubernetes/aio \
 && find /venv -name __pycache__ -prune -exec rm -rf {} +

FROM python:3.11-slim
ENV PATH=/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /venv /venv
WORKDIR /app
COPY job/ job/
# Bytecode for the standard library, the dependencies and the job, made once here: the CronJob's
# root filesystem is read-only and PYTHONDONTWRITEBYTECODE is set, so without it every run
# compiled each module it imports from source, ~0.7 s of CPU before its first request.
# unchecked-hash: the image never changes under it, so no run stats or hashes the sources.
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
      -x '/(test|tests|idlelib|tkinter|turtledemo|lib2to3|ensurepip)/' \
      "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" /venv /app/job
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin calico-gc
USER 10001:10001
ENTRYPOINT ["python", "-m", "job"]
