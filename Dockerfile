# syntax=docker/dockerfile:1
# Ballast CSI driver image: one image for the controller Deployment, the node DaemonSet and the
# migration controller (`ballast-migrate controller`, which needs the `kube` extra).
# Stage 1 builds wheels (the driver and its dependencies); stage 2 installs them into a slim runtime
# with only the OS tools the node plugin runs. The default user is unprivileged (controller); the
# chart's node DaemonSet runs the same image as root.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README* ./
COPY csi ./csi
COPY shim ./shim
RUN pip wheel --wheel-dir /wheels ".[aws,kube]"

FROM ${PYTHON_IMAGE} AS runtime
# Programs csi/mount.py runs (see REQUIRED_TOOLS there) plus libudev1, which pyudev loads.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        e2fsprogs \
        libudev1 \
        mount \
        udev \
        util-linux \
        xfsprogs \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-index --find-links=/tmp/wheels "ballast-csi[aws,kube]" \
    && rm -rf /tmp/wheels \
    && groupadd --system --gid 1000 ballast \
    && useradd --system --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ballast
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 1000:1000
ENTRYPOINT ["ballast-csi"]
CMD ["--help"]
