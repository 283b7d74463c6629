#!/usr/bin/env bash
# Install Debian's chromium for the end-to-end browser test (tests/e2e/test_workflow.py renders
# the offline report headless and checks its landing page). Idempotent: skips apt when chromium
# is there. Needs root; without it, or where apt cannot reach its index, it says so and the
# browser test is skipped (it names why), never failed.
set -uo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "install-chromium.sh: chromium already present; skipping apt"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "install-chromium.sh: not root, chromium not installed: the browser test will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    echo "install-chromium.sh: $(chromium --version 2>/dev/null)"
else
    echo "install-chromium.sh: apt-get could not install chromium: the browser test will be skipped" >&2
fi
exit 0
