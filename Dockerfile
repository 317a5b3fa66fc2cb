# claw-stream services (gateway, workers, trainer, init jobs). GPU images override TORCH_SPEC.
FROM python:3.11-slim
ARG TORCH_SPEC="torch==2.13.0"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CLAW_DATA_DIR=/data
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /app
RUN pip install --no-cache-dir "${TORCH_SPEC}"
COPY pyproject.toml README.md alembic.ini ./
COPY claw_stream ./claw_stream
COPY topics ./topics
COPY migrations ./migrations
RUN pip install --no-cache-dir .
VOLUME /data
ENTRYPOINT []
CMD ["claw-stream", "--help"]
