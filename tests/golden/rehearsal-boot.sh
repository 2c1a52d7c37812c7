#!/bin/bash
set -euo pipefail
mount --make-rprivate /
mount -t overlay overlay -o lowerdir=/c/project/upper:/c/system/root,upperdir=/s/n/upper,workdir=/s/n/work /s/n/merged
mount -t proc proc /s/n/merged/proc
mount -t sysfs -o ro sysfs /s/n/merged/sys
mount -t cgroup2 cgroup2 /s/n/merged/sys/fs/cgroup
mount -t tmpfs -o mode=0755,size=64k tmpfs /s/n/merged/dev
touch /s/n/merged/dev/null && mount --bind /dev/null /s/n/merged/dev/null
touch /s/n/merged/dev/zero && mount --bind /dev/zero /s/n/merged/dev/zero
touch /s/n/merged/dev/full && mount --bind /dev/full /s/n/merged/dev/full
touch /s/n/merged/dev/random && mount --bind /dev/random /s/n/merged/dev/random
touch /s/n/merged/dev/urandom && mount --bind /dev/urandom /s/n/merged/dev/urandom
touch /s/n/merged/dev/tty && mount --bind /dev/tty /s/n/merged/dev/tty
touch /s/n/merged/dev/fuse && mount --bind /dev/fuse /s/n/merged/dev/fuse
touch /s/n/merged/dev/console && mount --bind /proc/self/fd/1 /s/n/merged/dev/console
install -d /s/n/merged/dev/pts /s/n/merged/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /s/n/merged/dev/pts
ln -s pts/ptmx /s/n/merged/dev/ptmx
mount -t tmpfs -o mode=1777 tmpfs /s/n/merged/dev/shm
hostname node1
cd /s/n/merged
install -d .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
exec setpriv --bounding-set=-sys_time,-sys_module env -i container=scaletrain-rehearsal /sbin/init
