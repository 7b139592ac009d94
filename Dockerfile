# calico-gc: a slim runtime image; build tools live only in the builder stage.
FROM python:3.11-slim AS build
WORKDIR /build
COPY requirements.txt .
RUN python -m venv /venv \
 && /venv/bin/pip install --no-cache-dir --disable-pip-version-check -r requirements.txt

FROM python:3.11-slim
ENV PATH=/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /venv /venv
WORKDIR /app
COPY job/ job/
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin calico-gc
USER 10001:10001
ENTRYPOINT ["python", "-m", "job"]
