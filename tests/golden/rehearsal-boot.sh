#!/bin/bash
set -euo pipefail
mount --make-rprivate /
mount -t overlay overlay -o lowerdir=/c/project/upper:/c/system/root,upperdir=/s/n/upper,workdir=/s/n/work /s/n/merged
install -d /s/n/merged/fsx
mount --bind /s/shared /s/n/merged/fsx
mount -t proc proc /s/n/merged/proc
mount -t sysfs sysfs /s/n/merged/sys
mount -t tmpfs -o mode=0755,size=64k tmpfs /s/n/merged/dev
touch /s/n/merged/dev/null && mount --bind /dev/null /s/n/merged/dev/null
touch /s/n/merged/dev/zero && mount --bind /dev/zero /s/n/merged/dev/zero
touch /s/n/merged/dev/full && mount --bind /dev/full /s/n/merged/dev/full
touch /s/n/merged/dev/random && mount --bind /dev/random /s/n/merged/dev/random
touch /s/n/merged/dev/urandom && mount --bind /dev/urandom /s/n/merged/dev/urandom
touch /s/n/merged/dev/tty && mount --bind /dev/tty /s/n/merged/dev/tty
install -d /s/n/merged/dev/pts /s/n/merged/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /s/n/merged/dev/pts
ln -s pts/ptmx /s/n/merged/dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /s/n/merged/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /s/n/merged/run
mount -t tmpfs -o mode=1777 tmpfs /s/n/merged/tmp
hostname node1
cd /s/n/merged
install -d .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
echo node1 > /etc/hostname
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
test -e /etc/ssh/.scaletrain-node-keys || rm -f /etc/ssh/ssh_host_*
ssh-keygen -A >/dev/null
touch /etc/ssh/.scaletrain-node-keys
echo '-----BEGIN SSH HOST KEY KEYS-----'
cat /etc/ssh/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ecdsa_key.pub
echo '-----END SSH HOST KEY KEYS-----'
install -d -m 0755 /run/sshd
exec /usr/sbin/sshd -D -e
