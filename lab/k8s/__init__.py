"""A Kubernetes API server emulator for tests and the local lab.

Run it with ``python -m lab.k8s --port 0``; drive it from tests with
:class:`lab.k8s.process.EmulatorProcess` and :class:`lab.k8s.admin.EmulatorAdmin`.
"""
