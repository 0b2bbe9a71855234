# The subagent image: `python -m container` in a venv, run as uid 1000 on a read-only root.
# Build it with `python -m runner.image` (it makes the wheelhouse and picks the base); the build
# needs no network: Python packages come from build/image/wheels in the context.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS venv
COPY build/image/wheels/ /wheels/
# pip runs from its wheel, so the runtime venv carries no pip. Bytecode is compiled now: the root
# filesystem is read-only at run time. The .pth file puts /opt/crewbot (the agent's code) on sys.path.
RUN set -eu; \
    python3 -m venv --without-pip /opt/venv; \
    set -- /wheels/pip-*.whl; \
    /opt/venv/bin/python "$1/pip" install --no-index --find-links /wheels --no-compile \
        --disable-pip-version-check --no-cache-dir --root-user-action=ignore -r /wheels/requirements.txt; \
    /opt/venv/bin/python -m compileall -q -j 0 /opt/venv; \
    site_packages=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
    echo /opt/crewbot > "$site_packages/crewbot.pth"

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    HOME=/tmp
RUN set -eu; \
    useradd --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /bin/bash agent; \
    mkdir -p /workspace /crewbot/channel; \
    chown agent:agent /workspace
COPY --from=venv /opt/venv/ /opt/venv/
# The agent's code comes last: changing it rebuilds only these two layers.
COPY container/ /opt/crewbot/container/
RUN /opt/venv/bin/python -m compileall -q /opt/crewbot
USER agent
WORKDIR /workspace
# -P: never put the working directory (the chat's workspace, which the agent writes) on sys.path.
ENTRYPOINT ["/opt/venv/bin/python", "-P", "-m", "container"]
