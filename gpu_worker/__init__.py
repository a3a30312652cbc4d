"""GPU worker: tunnel server, batcher, detector backends, per-stream sessions."""
