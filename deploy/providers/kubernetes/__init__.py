"""Kubernetes GPU pods: rendering (``render``) and the provider (``provider``)."""
