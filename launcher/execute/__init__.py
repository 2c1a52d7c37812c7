"""The thin shell: carrying plans out on the nodes (fabric over SSH, mpirun on the first node) and on AWS.

Sequencing, waiting and relaying output live here; every decision comes from launcher.plans or launcher.cluster.
"""
