#!/bin/sh
# System packages the test suite needs beyond the Python environment: the Prometheus server and
# promtool (Debian package `prometheus`), used by tests/topologies/test_prometheus.py.
# Idempotent and quiet; never fails the build. If it cannot install (no root, no network), the
# Prometheus test skips locally and fails under CI=true, where the dependency is required.
set -u

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install-test-deps: prometheus missing and not root; skipping install" >&2
        exit 0
    fi
fi

if command -v apt-get >/dev/null 2>&1; then
    # The package's post-install starts a service where an init system runs; harmless here.
    export DEBIAN_FRONTEND=noninteractive
    if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq prometheus; } >/dev/null 2>&1
    then
        echo "install-test-deps: could not install the prometheus package" >&2
    fi
else
    echo "install-test-deps: no apt-get; install Prometheus and promtool by hand" >&2
fi
exit 0
