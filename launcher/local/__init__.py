"""The local backend, one room: clusters on this machine, reached over SSH as EC2 instances are.

- backend.py: `launch local up/down/kill/replace`, and the loopback nodes (sshd processes on 127.0.0.1 that share
  this machine's files, for tests of the launcher's own logic);
- rehearsal_cluster.py, rehearsal_nodes.py, rehearsal_root.py: the rehearsal nodes (network namespaces booted from
  the root the image recipe's own scripts build), and the head node running Slurm's controller;
- keeper.py: the host-side process that replaces a lost node by itself, as an Auto Scaling group does.

It builds on launcher/cluster (the Cluster model and its saved state) and launcher/execute (commands on nodes);
neither imports it.
"""
