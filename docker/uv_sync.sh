#!/bin/sh
# `uv sync --locked` with the dependency groups of the image's TARGET, plus the arguments given. Used by RUN steps
# of docker/Dockerfile (bind-mounted from the build context, never copied into a layer).
#   uv_sync.sh [--skip "PKG PKG ..."] [uv sync options]    --skip: --no-install-package each (unknown names are fine)
#   TARGET=cpu: the default groups (dev, cpu). The CPU torch wheel is locked from the flat folder /opt/wheels: it
#               is either mounted there (podman --volume) or comes as the `torch-wheels` build context, mounted at
#               /mnt/torch-wheels and linked to /opt/wheels for this step only.
#   TARGET=gpu: dev + gpu (+ GPU_GROUPS, e.g. "--group mcore"), never the CPU default group.
set -eu

skip=""
if [ "${1:-}" = --skip ]; then
    for pkg in $2; do skip="$skip --no-install-package $pkg"; done
    shift 2
fi

linked=""
case "${TARGET:-}" in
cpu)
    groups=""
    if [ ! -e /opt/wheels ]; then
        mkdir -p /opt
        ln -s /mnt/torch-wheels /opt/wheels
        linked=1
    fi
    if ! ls /opt/wheels/torch-*.whl >/dev/null 2>&1; then
        echo "TARGET=cpu needs the CPU torch wheel in /opt/wheels: podman build --volume /opt/wheels:/opt/wheels:ro" >&2
        echo "  or docker build --build-context torch-wheels=/opt/wheels" >&2
        exit 1
    fi
    ;;
gpu)
    groups="--no-default-groups --group dev --group gpu ${GPU_GROUPS:-}"
    ;;
*)
    echo "TARGET must be cpu or gpu, not '${TARGET:-}'" >&2
    exit 1
    ;;
esac

status=0
# shellcheck disable=SC2086  # $groups and $skip are lists of options
uv sync --locked $groups $skip "$@" || status=$?
if [ -n "$linked" ]; then
    rm /opt/wheels
    rmdir /opt 2>/dev/null || true
fi
exit "$status"
