"""Providers that start, list and stop GPU workers: local processes, RunPod, Kubernetes."""
