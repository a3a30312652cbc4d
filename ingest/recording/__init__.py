"""The recording worker: camera -> fixed-length MP4 segments (remuxed, not re-encoded),
each with a PTS-aligned JSON Lines sidecar of the stream's durable results, an index,
retention, and clips rendered with the boxes drawn."""
