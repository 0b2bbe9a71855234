# The subagent image: `python -m container` (standard library only) run as uid 1000 on a read-only root.
# Build it with `python -m runner.runtimes.image` (it picks the base and labels the image with its content hash).
# The build needs no network and no Python packages: the model's requests are made by the host.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    HOME=/tmp
# An empty venv: the agent sees no packages of the base's own Python. Its .pth file puts /opt/crewbot
# (the agent's code) on sys.path.
RUN set -eu; \
    python3 -m venv --without-pip /opt/venv; \
    site_packages=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
    echo /opt/crewbot > "$site_packages/crewbot.pth"; \
    useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /bin/bash agent; \
    mkdir -p /workspace /crewbot/channel; \
    chown agent:agent /workspace
# The agent's code comes last: changing it rebuilds only these two layers. Bytecode is compiled now:
# the root filesystem is read-only at run time.
COPY container/ /opt/crewbot/container/
RUN /opt/venv/bin/python -m compileall -q /opt/crewbot
USER agent
WORKDIR /workspace
# -P: never put the working directory (the chat's workspace, which the agent writes) on sys.path.
ENTRYPOINT ["/opt/venv/bin/python", "-P", "-m", "container"]
