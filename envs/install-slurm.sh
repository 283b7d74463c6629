#!/usr/bin/env bash
# Install a single-node Slurm (Debian packages) plus munge, for the llmbench
# end-to-end tests (tests/e2e/slurm_cluster.py starts and stops the daemons
# itself; this script only installs software and makes sure a munge key exists).
#
# Idempotent: safe to run again; it skips apt when the binaries are present and
# keeps an existing munge key. Needs root (apt, /etc/munge). Works without
# systemd: nothing here starts or enables a service.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "install-slurm.sh: must run as root (apt-get, /etc/munge)" >&2
    exit 1
fi

have_all() {
    local b
    for b in slurmctld slurmd sbatch munged; do
        # munged lives in /usr/sbin, which a non-login root shell may lack on PATH.
        command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || return 1
    done
}

if have_all; then
    echo "install-slurm.sh: slurmctld, slurmd, sbatch, munged already present; skipping apt"
else
    export DEBIAN_FRONTEND=noninteractive
    # The packages' postinst scripts start munge/slurmctld/slurmd via
    # invoke-rc.d. The tests start their own daemons with their own slurm.conf,
    # so forbid that: a policy-rc.d that exits 101 ("action forbidden") is
    # Debian's switch for it. Container images often ship one already (keep
    # it); otherwise install a temporary one and remove it on exit.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\n# temporary, from llmbench envs/install-slurm.sh\nexit 101\n' \
            > /usr/sbin/policy-rc.d
        chmod 0755 /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get update
    # slurm-client gives sbatch/srun/squeue/sinfo/scancel; slurmctld and slurmd
    # are the two daemons; munge authenticates between them.
    # --no-install-recommends keeps out slurm-wlm-doc, mailutils etc.
    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
fi

# munged refuses to start without a key readable only by its owner. Debian's
# postinst normally creates /etc/munge/munge.key; create it if that did not
# happen (e.g. postinst skipped in a container, or the key was deleted).
key=/etc/munge/munge.key
if [[ ! -s $key ]]; then
    install -d -m 0700 -o munge -g munge /etc/munge 2>/dev/null || install -d -m 0700 /etc/munge
    if command -v mungekey >/dev/null 2>&1 || [[ -x /usr/sbin/mungekey ]]; then
        # mungekey (munge >= 0.5.14) writes a random key with mode 0600.
        PATH=$PATH:/usr/sbin mungekey --create --keyfile="$key" --force
    else
        # Older munge: 1 KiB of random bytes is what create-munge-key did.
        dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
    fi
    echo "install-slurm.sh: created $key"
fi
# munged checks ownership and permissions of the key and its directories: the
# key must be owned by the uid munged runs as ("should be owned by UID 0
# instead of UID 102" otherwise), mode 0400/0600, /etc/munge not writable by
# others. Keep Debian's layout (owner munge); tests/e2e/slurm_cluster.py starts
# munged as the key's owner, like the packaged service does.
if id munge >/dev/null 2>&1; then
    chown munge:munge /etc/munge "$key"
fi
chmod 0700 /etc/munge
chmod 0600 "$key"

# Runtime/log directories munged expects (tmpfs /run is empty after a reboot).
for d in /run/munge /var/log/munge /var/lib/munge; do
    install -d -m 0755 "$d"
    if id munge >/dev/null 2>&1; then chown munge:munge "$d"; fi
done

echo "install-slurm.sh: done ($(PATH=$PATH:/usr/sbin slurmctld -V 2>/dev/null || echo 'slurm version unknown'))"
