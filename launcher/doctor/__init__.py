"""`launch doctor`: checks (pure verdicts over what real tools printed on a node) and runner (gathers the probes
over SSH and runs the test across nodes).
"""
