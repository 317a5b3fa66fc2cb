# claw-stream images, one Dockerfile, two targets:
#   slim  the gateway, the stream workers and the init jobs (topics, migrations): no torch
#   gpu   the trainer (and the built-in engine) with CUDA torch and DeepSpeed
# docker-compose.yml builds both; `docker build --target slim .` builds one.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CLAW_DATA_DIR=/data
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY claw_stream ./claw_stream
COPY topics ./topics
COPY migrations ./migrations
VOLUME /data
ENTRYPOINT []
CMD ["claw-stream", "--help"]

FROM base AS slim
RUN pip install --no-cache-dir ".[gateway,worker]"

FROM base AS gpu
# the PyPI wheel of torch for Linux is the CUDA build; DeepSpeed compiles ops with gcc
ARG TORCH_SPEC="torch==2.13.0"
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "${TORCH_SPEC}" && pip install --no-cache-dir ".[trainer,engine]"
