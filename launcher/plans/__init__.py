"""Pure plans: what to run where, decided from a Cluster and a spec, with nothing touched.

Each module is a set of functions from typed values to typed values or text (a hostfile, an mpirun argv, an
environment, a BeeGFS set-up script, the shards a node converts, a verdict on a hung job), golden-tested under
tests/golden/. None imports anything that reaches a network, a process or the clock; tests/test_rooms.py holds
them to it. launcher.execute carries the plans out.
"""
