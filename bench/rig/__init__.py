"""Rigs the benchmarks share with the tests: real services as processes on 127.0.0.1.

The fault matrix's rig and faults (``matrix_*``), the overload measurement,
the RunPod contract server and sample result records. Benches import these
and never ``tests`` or ``pytest``; the tests import them from here.
"""
