#!/usr/bin/env bash
# Rehearsal nodes only (launcher/plans/rehearsal.py runs this first, before the recipe's base.sh): what the Ubuntu
# AMI the recipe starts from is and debootstrap's minbase is not, so that a rehearsal node boots as an instance of
# the image boots. systemd as PID 1, cloud-init running the instance's user data once, D-Bus (Slurm's cgroup/v2
# plugin and systemd-logind talk to it), the en_US.UTF-8 locale cloud-init's locale module sets (Ubuntu's
# locale-gen takes the locale as an argument at first boot; Debian's reads /etc/locale.gen, so it is made here), and
# sshfs: this kernel has no NFS or Lustre client, and the node's own boot mounts shared storage with FUSE instead
# (launcher/plans/storage.py writes both mount lines).
# What differs from an EC2 instance is the cloud-init configuration written below, each line with why.
set -euo pipefail
[ "${SCALETRAIN_REHEARSAL:-0}" = 1 ] || { echo "error: $0 builds rehearsal nodes only" >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
CFG=/etc/cloud/cloud.cfg.d/90-scaletrain-rehearsal.cfg

verify() {
    test -x /lib/systemd/systemd || { echo "error: no systemd" >&2; return 1; }
    test "$(readlink -f /sbin/init)" = /usr/lib/systemd/systemd || { echo "error: /sbin/init is not systemd" >&2; return 1; }
    command -v cloud-init >/dev/null || { echo "error: no cloud-init" >&2; return 1; }
    command -v sshfs >/dev/null || { echo "error: no sshfs" >&2; return 1; }
    test -f "$CFG" || { echo "error: no $CFG" >&2; return 1; }
    locale -a | grep -qi '^en_US.utf8$' || { echo "error: en_US.UTF-8 not generated" >&2; return 1; }
    grep -qx 'LANG=en_US.UTF-8' /etc/default/locale || { echo "error: no default locale in /etc/default/locale" >&2; return 1; }
}

install_() {
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends systemd systemd-sysv dbus cloud-init \
        sshfs fuse3 locales >/dev/null
    sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
    locale-gen >/dev/null
    # The system's default locale, set as an Ubuntu AMI ships it (/etc/default/locale names one): with none set,
    # cloud-init's locale module runs locale-gen again at every first boot (cloudinit/distros/debian.py,
    # apply_locale), two seconds of a core per node that no EC2 instance of the image spends.
    update-locale LANG=en_US.UTF-8
    install -d -m 0755 /etc/cloud/cloud.cfg.d
    cat > "$CFG" <<'EOF'
# Rehearsal nodes only (ami/rehearsal/instance.sh). On EC2 cloud-init reads the instance's metadata and user data
# from IMDS (the Ec2 datasource); a rehearsal node is handed the same user data in NoCloud's seed directory
# (/var/lib/cloud/seed/nocloud), written by the local backend before the node's first boot.
datasource_list: [ NoCloud, None ]
# EC2 gives eth0 its address by DHCP; a rehearsal node's address is set on its veth by the local backend before
# it boots, and no DHCP server answers on the cluster's bridge.
network: {config: disabled}
# The local cluster logs in as root (the user running `launch local up`); EC2 instances of the image as ubuntu.
disable_root: false
EOF
    # The node's console is a file (its console log), not a terminal: no getty on it.
    systemctl mask console-getty.service >/dev/null 2>&1 || true
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
