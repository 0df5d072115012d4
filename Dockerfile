# syntax=docker/dockerfile:1
# One image for all five deployables (four services and the admission webhook); each Deployment picks its entry point
# (`python -m services.<name>`). Build: docker build -t respawn:0.1.0 .
#
# The base is an argument so the image can also be built without Docker and without a registry, on
# Python bases made from Debian's packages (tools/images/build.sh, `make images`). Both stages
# must come from the same distribution of Python: the virtualenv's interpreter is a symlink to the
# build stage's python3, which the runtime stage must have at the same path. A distribution that
# ships venv and pip apart from Python (Debian's python3-venv) passes a build base that adds them.
ARG PYTHON_IMAGE=python:3.11-slim
ARG BUILD_IMAGE=${PYTHON_IMAGE}

FROM ${BUILD_IMAGE} AS build
# Given (tools/images/build.sh gives it), pip writes .pyc files by hash instead of by the time
# they were installed, so that the same packages give the same layer.
ARG SOURCE_DATE_EPOCH
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/respawn
WORKDIR /src
# The exact versions of requirements.lock (`make lock`), each checked against its hash, so that
# two builds install the same files whatever PyPI has published since. Only the services'
# dependencies (the CLI and testbed ones are in the `tools` extra), and the build backend.
COPY requirements.lock ./
RUN /opt/respawn/bin/pip install --require-hashes --no-deps -r requirements.lock
# Only what the package is built from (see .dockerignore): a change to tests or docs does not
# invalidate the install layer. Respawn's own package resolves nothing more (--no-deps: the lock
# holds it all) and is built with the locked setuptools, not one fetched for an isolated build.
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN /opt/respawn/bin/pip install --no-deps --no-build-isolation --no-index .

FROM ${PYTHON_IMAGE}
# A fixed numeric id, so Kubernetes can verify runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 10001 respawn \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin respawn
COPY --from=build /opt/respawn /opt/respawn
# The virtualenv's python must resolve here (see above): fail the build, not the pod's start.
RUN ["/opt/respawn/bin/python", "-B", "-c", "import services.watcher, shared"]
# No .pyc writes (the root filesystem is read-only in the cluster), unbuffered logs.
ENV PATH=/opt/respawn/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8081
CMD ["python", "-m", "services.watcher"]
