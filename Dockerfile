# syntax=docker/dockerfile:1
# One image for all five deployables (four services and the admission webhook); each Deployment picks its entry point
# (`python -m services.<name>`). Build: docker build -t respawn:0.1.0 .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/respawn
WORKDIR /src
# Only what the package is built from (see .dockerignore): a change to tests or docs does not
# invalidate the install layer.
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
# No extras: the image gets the services' dependencies only (the CLI and testbed ones are in `tools`).
RUN /opt/respawn/bin/pip install .

FROM python:3.11-slim
# A fixed numeric id, so Kubernetes can verify runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 10001 respawn \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin respawn
COPY --from=build /opt/respawn /opt/respawn
# No .pyc writes (the root filesystem is read-only in the cluster), unbuffered logs.
ENV PATH=/opt/respawn/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8081
CMD ["python", "-m", "services.watcher"]
